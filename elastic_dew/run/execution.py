"""A planned run executed: the simulator wired, the trainer built from the recipe, the
observability sinks, and how the run ended (:class:`RunOutcome`); :func:`main` plans,
prepares the process and executes.

This module never prints: how a run is shown (progress, log routing, the summary, the
wording of a refusal) is the caller's :class:`Display`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from elastic_dew import rundir
from elastic_dew.elastic.events import Sink
from elastic_dew.run.config import RunConfig
from elastic_dew.run.exits import FAILED_EXIT, USAGE_EXIT, UsageError
from elastic_dew.run.planning import RunPlan, choose_run_dir, plan_run, process_options
from elastic_dew.settings import SettingError
from elastic_dew.train_config import TrainConfig

__all__ = ["RunOutcome", "Display", "execute", "main"]

logger = logging.getLogger(__name__)

#: The parts a recipe's ``build()`` returns.
_PARTS = ("init", "loss", "optimizer", "dataset")


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How an executed run ended: its exit status, its directory, and ``Trainer.fit``'s result
    (``None`` after a preemption).

    Args:
        status: the exit status (0 done, 143 preempted, 1 failed, 2 refused).
        run_dir: the run directory.
        result: ``Trainer.fit``'s :class:`~elastic_dew.trainer.FitResult`, or ``None``.
    """

    status: int
    run_dir: Path
    result: Any = None


class Display(Protocol):
    """How a run is shown: the refusal of a bad argument, the run itself, its end."""

    def refused(self, error: UsageError | SettingError) -> None:
        """Show why the run was refused.

        Args:
            error: the refusal.
        """

    def running(self, plan: RunPlan) -> contextlib.AbstractContextManager[Sequence[Sink]]:
        """While the run trains: the sinks that show it (each gets every typed event).

        Args:
            plan: the run.

        Returns:
            A context manager whose value is the sinks.
        """

    def finished(self, plan: RunPlan, outcome: RunOutcome) -> None:
        """Show how the run ended.

        Args:
            plan: the run.
            outcome: how it ended.
        """


class _Quiet:
    """The display of a run nobody watches: refusals are logged, nothing else is shown."""

    def refused(self, error: UsageError | SettingError) -> None:
        logger.error("%s", error)

    def running(self, plan: RunPlan) -> contextlib.AbstractContextManager[Sequence[Sink]]:
        return contextlib.nullcontext(())

    def finished(self, plan: RunPlan, outcome: RunOutcome) -> None:
        pass

@contextlib.contextmanager
def _slices(p: RunPlan, run_dir: Path) -> Iterator[None]:
    if not p.simulate:
        # on the local Pathways backend, its fault schedule hears this loop's phases
        from elastic_dew.proxy.announce import forwarding

        with forwarding():
            yield
        return
    from elastic_dew.simulate import SimulatedSlices

    assert p.sim is not None
    multi_tier = p.elastic.checkpoint_kind == "multi_tier"
    with SimulatedSlices(
        p.sim.slices, p.sim.devices_per_slice, schedule=p.schedule, fault_log=run_dir / rundir.FAULTS_FILE,
        watch_log=run_dir / rundir.WATCH_FILE,
        replicator=run_dir.resolve() / rundir.REPLICATOR_DIR if multi_tier else None,
    ):
        yield


def execute(p: RunPlan, build: Callable[..., dict] | None = None, display: Display | None = None) -> RunOutcome:
    """Train the planned run (after ``prepare_process``) with ``build``, else the recipe's.

    Raises :class:`~elastic_dew.settings.SettingError` for recipe settings its ``build``
    refuses (of the field ``overrides``) and for an evaluation cadence the recipe has no
    evaluation split for, and, on real slices
    (whose count is known only once the protocol is built), a
    :class:`~elastic_dew.elastic.slices.mesh.BatchError` for a batch they cannot take;
    ``command.json`` is written only after those checks. A preemption is an
    :class:`RunOutcome` with status 143.

    Args:
        p: the planned run.
        build: a function returning the ``Trainer``'s model parts (``init``, ``loss``,
            ``optimizer``, ``dataset``, ...), or ``None`` for the recipe's ``build()``.
        display: how the run is shown, or ``None`` for logs only.

    Returns:
        The :class:`RunOutcome`.

    Raises:
        SettingError: recipe settings its ``build`` refuses, or an evaluation cadence for a
            recipe with no evaluation split.
        BatchError: on real slices, a batch they cannot take.
    """
    import jax
    from pathwaysutils.elastic.manager import ElasticRuntimeError

    from elastic_dew.elastic.state.storage import StorageError, left_since, mark
    from elastic_dew.elastic.state.storage_clients import configure_clients, divert_library_errors
    from elastic_dew.runtime import PREEMPTED_EXIT, Preempted
    from elastic_dew.trainer import Trainer

    display = display or _Quiet()
    run_dir = choose_run_dir(p)
    try:
        parts = (build or p.module.build)(**p.overrides)
    except (TypeError, ValueError) as err:
        raise SettingError(RunConfig, "overrides", dict(p.overrides), problem=str(err)) from None
    missing = set(_PARTS) - set(parts)
    if missing:
        raise UsageError(f"recipe {p.recipe}.build() returned no {', '.join(sorted(missing))}")
    if p.train.eval_every is not None and parts.get("eval_dataset") is None:
        raise SettingError(
            TrainConfig, "eval_every", p.train.eval_every,
            problem=f"recipe {p.recipe} has no evaluation split (its build() returns no eval_dataset); "
            "give no evaluation cadence, or return eval_dataset from build()",
        )
    resuming = (run_dir / rundir.EVENTS_FILE).exists()
    logger.info(
        "%s %s in %s: %d steps, global batch %d, %s",
        "resuming" if resuming else "training",
        p.recipe,
        run_dir,
        p.steps,
        p.elastic.global_batch,
        f"{p.sim.slices} simulated slices of {p.sim.devices_per_slice} devices" if p.sim else "real slices",
    )
    from elastic_dew.observe import sinks as observing

    # The display learns the run directory chosen here (a timestamp when none was planned).
    with _slices(p, run_dir), display.running(dataclasses.replace(p, run_dir=run_dir)) as shown:
        elastic = p.elastic
        if p.simulate and elastic.checkpoint_kind == "multi_tier":
            from elastic_dew.simulate.replicator import local_directory

            local = local_directory(run_dir.resolve() / rundir.REPLICATOR_DIR)
            elastic = dataclasses.replace(elastic, checkpoint_dir=str(local))
        # TensorBoard, the goodput export: closed with the summary (their last points).
        observers = observing.chosen(
            p.observe, run_dir, job_name=run_dir.name, total_slices=p.sim.slices if p.sim else None
        )
        result = None
        configure_clients(elastic.storage_timeout)  # before the first Cloud Storage request
        # The storage libraries' tracebacks of failed writes go to RUN_DIR/storage.log.
        diverted = contextlib.ExitStack()
        started = mark()
        try:
            release_held_diversions()  # this run's diversion takes over an earlier run's late records
            diverted.enter_context(divert_library_errors(run_dir / rundir.STORAGE_LOG))
            trainer = Trainer(
                **{name: parts[name] for name in _PARTS},
                config=elastic,
                train=p.train,
                run_dir=run_dir,
                sinks=[*shown, *observers],
                # A recipe that knows its tensor-parallel split gives it as "model_sharding".
                model_sharding=parts.get("model_sharding"),
                # A recipe that reads files may ask for Grain worker processes.
                data_workers=parts.get("data_workers", 0),
                eval_dataset=parts.get("eval_dataset") if p.train.eval_every is not None else None,
                # Written once the protocol has accepted the slices and the batch, so a
                # refused run leaves its directory untouched.
                on_accepted=functools.partial(
                    rundir.write_identity, run_dir, {**p.identity(), "steps": p.steps, "argv": sys.argv}
                ),
            )
            result = trainer.fit(p.steps)
        except Preempted as stop:
            if stop.step:
                logger.warning(
                    "preempted at step %d; its checkpoint is in %s: run the same command again to resume",
                    stop.step,
                    run_dir,
                )
            else:
                logger.warning(
                    "preempted before any state was persisted; run the same command again to start over in %s",
                    run_dir,
                )
            return RunOutcome(PREEMPTED_EXIT, run_dir)
        except StorageError as error:
            # The storage failed or stalled: one line, the libraries' details in storage.log,
            # and the command-line process ends without the writers' shutdown noise
            # (asyncio's "Event loop is closed" from their destructors).
            from elastic_dew.elastic.state.storage import abandoned_write

            if not (error.operation == "listing" and error.cause is not None):
                abandoned_write()  # a listing that failed (a missing bucket) started no writer
            details = run_dir / rundir.STORAGE_LOG
            logger.error(
                "the run stopped: %s.%s", error,
                f" The storage libraries' errors are in {details}" if details.exists() else "",
            )
            return RunOutcome(FAILED_EXIT, run_dir)
        except (jax.errors.JaxRuntimeError, TimeoutError, ElasticRuntimeError) as error:
            # Not retried: an error that is not a slice loss, or the retry gave up.
            logger.error(
                "the run failed and was not retried: %s. Run the same command again to resume "
                "from the newest checkpoint in %s once the cause is fixed",
                error, run_dir,
            )
            return RunOutcome(FAILED_EXIT, run_dir)
        finally:
            if left_since(started):
                # Writers given up on may still log their failure after this returns, whatever
                # stopped the run (the command line then ends the process): their records keep
                # going to storage.log. Held, not dropped: a dropped stack's generator would be
                # closed by the garbage collector, running its finally (the diversion's end).
                _HELD_DIVERSIONS.append(diverted.pop_all())
            else:
                diverted.close()
            observing.close(observers, result.summary if result is not None else None)
    return RunOutcome(0, run_dir, result)


#: The diversion of the storage libraries' errors kept past its run (:func:`execute`): at
#: most one, the last run's, until the next run's diversion takes its place.
_HELD_DIVERSIONS: list[contextlib.ExitStack] = []


def release_held_diversions() -> None:
    """End the diversion an earlier run left held for its writers given up on.

    The next run's own diversion then sends those writers' late records to its
    ``storage.log``, as every library error record while it runs; so a process that runs
    many runs holds one diversion at a time, not one per run that left writers behind.
    """
    while _HELD_DIVERSIONS:
        _HELD_DIVERSIONS.pop().close()


def main(config: RunConfig, build: Callable[..., dict] | None = None, display: Display | None = None) -> int:
    """Plan the run once, prepare the process, execute it; the exit status (0, 143, 1 or 2).

    Args:
        config: the run's :class:`RunConfig`.
        build: as :func:`execute`'s.
        display: as :func:`execute`'s.

    Returns:
        The exit status.
    """
    from elastic_dew.runtime import prepare_process

    display = display or _Quiet()
    try:
        p = plan_run(config)
        prepare_process(**process_options(p))  # before the backend opens: the host device count
        outcome = execute(p, build, display)
    except (UsageError, SettingError) as err:
        display.refused(err)
        return USAGE_EXIT
    display.finished(p, outcome)
    return outcome.status
