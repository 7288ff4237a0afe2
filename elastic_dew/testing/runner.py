"""Running a chaos scenario: restart after every preemption, watch the committed checkpoints.

:func:`run` trains a :class:`~elastic_dew.testing.scenarios.Scenario` through the real
:class:`~elastic_dew.Trainer` in this process, restarting it after ``Preempted`` with the
same run directory and fault log (:func:`elastic_dew.supervisor.supervise_in_process`), as a
JobSet restarts the controller. Every committed checkpoint is hashed at every phase the
elastic layer announces, so one that changes or vanishes is caught while the run goes.
:func:`reference` is the failure-free run of a length, computed once; :func:`run_seed`
draws, runs and checks one seed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_dew import rundir
from elastic_dew.elastic import hooks
from elastic_dew.supervisor import supervise_in_process
from elastic_dew.testing.invariants import check
from elastic_dew.testing.outcome import ScenarioOutcome, committed_checkpoints
from elastic_dew.testing.scenarios import (
    DEVICES_PER_SLICE,
    MAX_PROCESSES,
    TOTAL_SLICES,
    Scenario,
    draw,
    model,
)

__all__ = ["run", "reference", "run_seed"]

logger = logging.getLogger(__name__)


class _CheckpointWatch:
    """Hash the committed checkpoints at every phase; a committed one must never change."""

    def __init__(self, outcome: ScenarioOutcome) -> None:
        self.outcome = outcome
        self._lock = threading.Lock()

    def look(self, *_: Any) -> None:
        now = committed_checkpoints(self.outcome.checkpoint_dir)
        with self._lock:
            for step, digest in now.items():
                first = self.outcome.checkpoints_seen.setdefault(step, digest)
                if first != digest:
                    self._problem(f"committed checkpoint {step} changed after it was committed")
            for step in self.outcome.checkpoints_seen:
                if step not in now:
                    self._problem(f"committed checkpoint {step} was deleted or damaged")

    def _problem(self, text: str) -> None:
        if text not in self.outcome.problems:
            self.outcome.problems.append(text)


def _hold_for_returned_slices(sim: Any, manager: Any, scenario: Scenario) -> Callable[[str, int], None]:
    """Hold each step until the manager's monitor has seen a returned slice
    (:meth:`SimulatedSlices.await_monitor`), so a scale-up happens at a step the schedule
    fixes. Only replica-resize runs monitor for returned slices."""

    def hold(phase: str, step: int) -> None:
        if phase == "step" and scenario.minimum_slice_count is not None:
            sim.await_monitor(manager)

    return hold


def run(
    scenario: Scenario,
    run_dir: str | os.PathLike[str],
    *,
    on_process: Callable[[Any, Any], None] | None = None,
) -> ScenarioOutcome:
    """Train ``scenario`` in ``run_dir``, restarting after every preemption.

    Each process is a fresh :class:`SimulatedSlices` over the same fault log, a fresh
    pathwaysutils ``Manager`` and a fresh :class:`Trainer` on the same run directory.
    ``on_process(sim, manager)`` is called as each process starts. An error of the training
    other than ``Preempted`` ends the run and is kept in ``ScenarioOutcome.error`` (setting a process
    up, e.g. a refused fault log, raises).

    Args:
        scenario: the scenario.
        run_dir: its run directory (created; a rerun resumes it).
        on_process: called as ``on_process(sim, manager)`` as each process starts.

    Returns:
        What the run left behind.

    Raises:
        Exception: what setting a process up raised (a refused fault log).
    """
    from elastic_dew.elastic.slices.retry import make_manager
    from elastic_dew.runtime import Preempted
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.trainer import Trainer, TrainConfig

    outcome = ScenarioOutcome(scenario, Path(run_dir))
    watch = _CheckpointWatch(outcome)

    def process(number: int) -> None:
        outcome.processes = number
        sim = SimulatedSlices(
            TOTAL_SLICES, DEVICES_PER_SLICE, schedule=scenario.schedule,
            fault_log=outcome.run_dir / rundir.FAULTS_FILE,
        )
        try:
            _train(number, sim)
        finally:
            # elastic_dew's own loop makes none of the mistakes the simulator names.
            outcome.problems.extend(f"the simulator named {p.kind} in process {number}: {p.detail}"
                                    for p in sim.diagnose().problems)

    def _train(number: int, sim: Any) -> None:
        with sim:
            manager = make_manager()
            if on_process is not None:
                on_process(sim, manager)
            trainer = Trainer(
                **model(), config=scenario.config(), run_dir=outcome.run_dir,
                manager=manager, train=TrainConfig(log_every=1000),
            )
            try:
                with hooks.listening(_hold_for_returned_slices(sim, manager, scenario)):
                    trainer.fit(scenario.steps)
            except Preempted as stop:
                outcome.preempted_at.append(stop.step)
                logger.info("preempted at step %d; restarting as a JobSet would", stop.step)
                raise
            except Exception as error:  # noqa: BLE001 - the outcome carries it to check()
                outcome.error = error

    with hooks.listening(watch.look):
        outcomes = supervise_in_process(process, max_processes=MAX_PROCESSES, restart_on=(Preempted,))
        if outcomes[-1] is not None:
            outcome.error = RuntimeError(f"still preempted after {MAX_PROCESSES} processes")
        watch.look()
    return outcome


_references: dict[tuple[int, Path], dict[str, Any]] = {}


def reference(steps: int, workdir: str | os.PathLike[str]) -> dict[str, Any]:
    """The failure-free run's final parameters (flat numpy), computed once per length and directory.

    Args:
        steps: the step to train to.
        workdir: where the reference run lives (``reference-STEPS`` inside it).

    Returns:
        The final parameters, by path.

    Raises:
        BaseException: the error the failure-free run ended with.
    """
    from elastic_dew import record

    key = (steps, Path(workdir))
    if key not in _references:
        outcome = run(Scenario(steps=steps), Path(workdir) / f"reference-{steps}")
        if outcome.error is not None:
            raise outcome.error
        _references[key] = record.load_params(outcome.run_dir)
    return _references[key]


def run_seed(seed: int, workdir: str | os.PathLike[str]) -> tuple[Scenario, list[str]]:
    """Draw, run and check one seed in ``workdir``; return the scenario and its problems."""
    scenario = draw(seed)
    logger.info("seed %d: %s", seed, scenario)
    expected = reference(scenario.steps, workdir)
    outcome = run(scenario, Path(workdir) / f"seed-{seed}")
    problems = check(outcome, expected)
    scheduled = len(scenario.schedule.split(","))
    logger.info("seed %d: %d of %d faults fired", seed, len(outcome.fault_log.entries()), scheduled)
    return scenario, problems
