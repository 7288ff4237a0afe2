"""The invariants every faulted run must keep, checked against the failure-free run.

:func:`check` reads what a scenario's run left behind (the run record through
:mod:`elastic_dew.record`, as typed events of :mod:`elastic_dew.elastic.events`; the
committed checkpoints through :mod:`elastic_dew.rundir`'s commit rule; the fault log) and
returns every broken invariant:

* exactly-once data: the committed step lines (the run record's commit rule) are steps
  ``1..N`` and their example ranges tile ``[0, N * batch)``;
* the final parameters equal the failure-free run's: bitwise when every committed step ran
  on every slice, ``allclose`` at :data:`~elastic_dew.testing.scenarios.TOLERANCE` where the
  mesh changed;
* no committed checkpoint deleted or damaged: each must keep the hash it had when first
  seen to the end;
* the run record consistent with what happened: one ``start`` per process, each restart
  resuming from the checkpoint of the step its preemption stopped at (fresh after a stop
  at step 0, which says nothing was persisted), the summary's final
  step, example count and digest matching the record and the saved parameters, and every
  fault in the simulator's log fired at most once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elastic_dew.elastic import events as ev
from elastic_dew.testing.outcome import ScenarioOutcome, committed_checkpoints
from elastic_dew.testing.scenarios import GLOBAL_BATCH, TOLERANCE, TOTAL_SLICES

__all__ = ["check"]


def _check_data(committed: list[ev.Step], steps: int) -> list[str]:
    problems = []
    numbers = sorted(e.step for e in committed)
    if numbers != list(range(1, steps + 1)):
        problems.append(f"committed steps are {numbers}, not 1..{steps}")
    position = 0
    for event in sorted(committed, key=lambda e: e.step):
        start, end = event.examples
        if start != position or end - start != GLOBAL_BATCH:
            problems.append(
                f"step {event.step} consumed examples [{start}, {end}); expected "
                f"[{position}, {position + GLOBAL_BATCH}) (exactly-once data)"
            )
        position = end
    return problems


def _check_params(run_dir: Path, expected: dict[str, Any], full_mesh: bool) -> list[str]:
    import numpy as np

    from elastic_dew import record

    try:
        params = record.load_params(run_dir)
    except OSError as error:
        return [f"no final parameters: {error}"]
    if sorted(params) != sorted(expected):
        return [f"final parameters {sorted(params)} differ in names from {sorted(expected)}"]
    problems = []
    for name, value in expected.items():
        if full_mesh and not np.array_equal(params[name], value):
            problems.append(f"parameter {name} differs from the failure-free run (bitwise; every step ran on every slice)")
        elif not np.allclose(params[name], value, rtol=TOLERANCE["rtol"], atol=TOLERANCE["atol"]):
            problems.append(f"parameter {name} differs from the failure-free run beyond {TOLERANCE}")
    return problems


def _check_resumes(outcome: ScenarioOutcome, events: list[ev.Event]) -> list[str]:
    """Each restart resumes from the checkpoint of the step its preemption stopped at."""
    problems = []
    # Each process's first resume, or None for a process preempted before it resumed (during
    # its first compile, say): the processes pair with the preemptions that ended the ones before.
    first_resumes: list[ev.Resume | None] = []
    for event in events:
        if isinstance(event, ev.Start):
            first_resumes.append(None)
        elif isinstance(event, ev.Resume) and first_resumes and first_resumes[-1] is None:
            first_resumes[-1] = event
    for stop, resume in zip(outcome.preempted_at, first_resumes[1:], strict=False):
        expected = ("checkpoint", stop + 1) if stop else ("fresh", 1)
        if resume is not None and (resume.source, resume.step) != expected:
            problems.append(
                f"the process after the preemption at step {stop} resumed from "
                f"{resume.source} at {resume.step}, not from {expected[0]} at {expected[1]}"
            )
    for stop in outcome.preempted_at:
        if stop and stop not in outcome.checkpoints_seen:
            problems.append(f"the preemption at step {stop} left no committed checkpoint of it")
    return problems


def _check_summary(outcome: ScenarioOutcome) -> list[str]:
    from elastic_dew import record

    try:
        summary = record.load_summary(outcome.run_dir)
        params = record.load_params(outcome.run_dir)
    except (OSError, ValueError) as error:
        return [f"no summary or final parameters: {error}"]
    problems = []
    steps = outcome.scenario.steps
    if summary["final_step"] != steps:
        problems.append(f"summary final_step {summary['final_step']} != {steps}")
    if summary["examples_consumed"] != steps * GLOBAL_BATCH:
        problems.append(f"summary examples_consumed {summary['examples_consumed']} != {steps * GLOBAL_BATCH}")
    if summary["state_digest"] != record.state_digest(params):
        problems.append("summary state_digest does not match final_params.npz")
    if sorted(summary["badput"]) != sorted(record.BADPUT_CATEGORIES):
        problems.append(f"summary badput categories {sorted(summary['badput'])}")
    return problems


def _check_record(outcome: ScenarioOutcome, events: list[ev.Event]) -> list[str]:
    problems = []
    starts = sum(1 for e in events if isinstance(e, ev.Start))
    if starts != outcome.processes:
        problems.append(f"the record has {starts} start lines for {outcome.processes} processes")
    problems += _check_resumes(outcome, events)
    stops = [e for e in events if isinstance(e, ev.Stop)]
    preempted = [e.step for e in stops if e.reason == "preempted"]
    if preempted != outcome.preempted_at:
        problems.append(f"the record's preempted stops {preempted} are not the preemptions {outcome.preempted_at}")
    if outcome.error is None:
        if not stops or stops[-1].reason != "done":
            problems.append("the record does not end with a done stop")
        summary_problems = _check_summary(outcome)
        if summary_problems and summary_problems[0].startswith("no summary"):
            return [*problems, *summary_problems]
        problems += summary_problems
    fired = [entry.index for entry in outcome.fault_log.entries()]
    if len(fired) != len(set(fired)):
        problems.append(f"a fault fired more than once: fault log indices {fired}")
    return problems


def check(outcome: ScenarioOutcome, expected_params: dict[str, Any], *, expect_error: type | None = None) -> list[str]:
    """Every broken invariant of ``outcome`` (empty when the run kept them all).

    ``expected_params`` are the failure-free run's final parameters. ``expect_error`` is
    the exception type the scenario must end with (``None``: it must finish).

    Args:
        outcome: what the scenario's run left behind.
        expected_params: the failure-free run's final parameters (:func:`reference`).
        expect_error: the exception type the run must end with, ``None`` to finish.

    Returns:
        Each broken invariant, in words; empty when every one held.
    """
    from elastic_dew import record

    problems = list(outcome.problems)
    if expect_error is None and outcome.error is not None:
        problems.append(f"the run failed: {type(outcome.error).__name__}: {outcome.error}")
    if expect_error is not None and not isinstance(outcome.error, expect_error):
        problems.append(f"expected {expect_error.__name__}, got {outcome.error!r}")
    final = committed_checkpoints(outcome.checkpoint_dir)
    for step, digest in outcome.checkpoints_seen.items():
        if final.get(step) != digest:
            problems.append(f"committed checkpoint {step} was deleted or damaged by the end")
    lines = record.read_events(outcome.run_dir)
    events = [ev.from_json(line) for line in lines]
    committed = [e for e in map(ev.from_json, record.committed_step_lines(lines)) if isinstance(e, ev.Step)]
    if outcome.error is None:
        problems += _check_data(committed, outcome.scenario.steps)
        full_mesh = all(e.slices == TOTAL_SLICES for e in committed)
        problems += _check_params(outcome.run_dir, expected_params, full_mesh)
    else:
        # A run that stopped with an error still has exactly-once data up to where it got.
        problems += _check_data(committed, max((e.step for e in committed), default=0))
    problems += _check_record(outcome, events)
    return problems
