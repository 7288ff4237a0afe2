"""One training run of a recipe: configured, planned once, checked once, executed once.

A :class:`RunConfig` is what a user asks for, one typed part each: the recipe and its
``build()`` overrides, the :class:`~elastic_dew.elastic.config.ElasticConfig`, the
:class:`~elastic_dew.train_config.TrainConfig`, the simulated slices and their fault schedule
(:class:`SimConfig`), the observability options and where the run lives. Each part checks
its own fields as it is built; :func:`plan_run` checks what spans them and decides the run,
touching nothing: the recipe module, the batch against every slice count, the schedule
against the slices, the run directory and its identity (through :mod:`elastic_dew.rundir`,
whose identity includes the fault schedule, so resuming with another ``--schedule`` is
refused). :func:`main` plans, prepares the process (the simulated host
device count must be set before JAX's backend opens) and executes the plan, returning the
exit status: 0, :data:`~elastic_dew.runtime.PREEMPTED_EXIT` (143) after a preemption, and
:data:`USAGE_EXIT` (2) for a bad argument.

On CPU (``JAX_PLATFORMS`` unset or ``cpu``) the slices are simulated: the run trains inside
:class:`~elastic_dew.simulate.SimulatedSlices`, which fires the schedule's faults and records
them in the run directory's fault log, so the same run started again after exit 143 or a kill
resumes and does not fire them again. Under Pathways (``JAX_PLATFORMS=proxy``) the
allocation's real slices are used, and simulator settings are refused.

The run directory is ``run_dir``, else ``runs/NAME`` with NAME from ``name``, else
``$JOBSET_NAME`` (a restarted pod re-uses its run), else a timestamp (refused if that
directory exists). It is a local directory: a URL is refused (mount the bucket).

The package by job: :mod:`~elastic_dew.run.config` (the configuration and its parts),
:mod:`~elastic_dew.run.recipes` (the recipe registry), :mod:`~elastic_dew.run.exits` (the
exit statuses and :class:`UsageError`); this module plans, wires the simulator and executes.

This module never prints: how a run is shown (progress, log routing, the summary, the
wording of a refusal) is the caller's :class:`Display` (:mod:`elastic_dew.console` for a
terminal). The command line and the recipes' ``main`` both come here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from elastic_dew import rundir
from elastic_dew._deprecation import moved_names
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.events import Sink
from elastic_dew.observe.sinks import ObserveOptions
from elastic_dew.run.config import DEFAULT_DEVICES_PER_SLICE, DEFAULT_SLICES, RunConfig, SimConfig
from elastic_dew.run.exits import FAILED_EXIT, USAGE_EXIT, UsageError
from elastic_dew.run.recipes import available_recipes, load_recipe, recipe_defaults
from elastic_dew.settings import SettingError, mention
from elastic_dew.train_config import TrainConfig

if TYPE_CHECKING:
    from elastic_dew.simulate import Schedule


__all__ = [
    "RunConfig",
    "SimConfig",
    "RunPlan",
    "RunOutcome",
    "Display",
    "UsageError",
    "plan_run",
    "execute",
    "main",
    "process_options",
    "compilation_cache_dir",
    "choose_run_dir",
    "simulating",
    "available_recipes",
    "load_recipe",
    "recipe_defaults",
    "RUNS_DIR",
    "DEFAULT_SLICES",
    "DEFAULT_DEVICES_PER_SLICE",
    "RUN_DIR_OPTION",
    "USAGE_EXIT",
    "FAILED_EXIT",
]

logger = logging.getLogger(__name__)

#: The names renamed in 0.2.0, served from here with a warning until 0.3.
__getattr__ = moved_names(__name__, {
    "Plan": "elastic_dew.run.RunPlan",
    "Outcome": "elastic_dew.run.RunOutcome",
    "plan": "elastic_dew.run.plan_run",
})

#: Where ``--name NAME`` puts a run directory (``runs/NAME``), relative to the working directory.
RUNS_DIR = Path("runs")
#: How a user names the run directory, in refusals of one: the two keywords of
#: :class:`RunConfig` that choose it (a refusal carries them as data, ``_RUN_DIR_FIELDS``,
#: which the command line names by their flags).
RUN_DIR_OPTION = "run_dir= or name="
_RUN_DIR_FIELDS = f"{mention('run_dir')} or {mention('name')}"
#: A URL scheme (gs://, s3://, file://): not a local path, which the run directory must be.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PARTS = ("init", "loss", "optimizer", "dataset")


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A checked run: every part resolved, everything decided except a timestamp run name.

    Args:
        recipe: the recipe's module name.
        module: the recipe's module.
        overrides: the recipe's ``build()`` settings.
        steps: the step to train to.
        simulate: whether the slices are simulated.
        sim: the simulated slices, ``None`` on real ones.
        schedule: the parsed fault schedule, ``None`` for none.
        elastic: the elastic settings.
        train: the training settings.
        observe: the observability settings.
        run_dir: the run directory, ``None`` for ``runs/TIMESTAMP`` chosen after
            ``prepare_process``.
    """

    recipe: str  # module name
    module: ModuleType
    overrides: dict[str, Any]
    steps: int
    simulate: bool
    sim: SimConfig | None  # None on real slices
    schedule: Schedule | None  # parsed once, here; None: no faults
    elastic: ElasticConfig
    train: TrainConfig
    observe: ObserveOptions
    run_dir: Path | None  # None: runs/<run_timestamp()>, chosen after prepare_process

    def identity(self) -> dict[str, Any]:
        """What makes two runs different runs (:data:`elastic_dew.rundir.IDENTITY_KEYS`).

        Returns:
            The identity's keys and values (``command.json``).
        """
        return {
            "recipe": self.recipe,
            "overrides": self.overrides,
            "seed": self.train.seed,
            "global_batch": self.elastic.global_batch,
            "schedule": self.sim.schedule if self.sim is not None else "",
        }


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


def simulating() -> bool:
    """Whether this process simulates its slices: ``JAX_PLATFORMS`` unset or ``cpu``.

    Returns:
        Whether the slices are simulated.
    """
    return os.environ.get("JAX_PLATFORMS", "").strip().lower() in ("", "cpu")


def _run_dir_of(spec: RunConfig) -> Path | None:
    if spec.run_dir and spec.name:
        raise UsageError(f"give {mention('run_dir')} or {mention('name')}, not both ({mention('name', 'NAME')} "
                         f"means {mention('run_dir', 'runs/NAME')})")
    if spec.run_dir and _URL.match(spec.run_dir):
        raise UsageError(
            f"{mention('run_dir', spec.run_dir)} is a URL, but the run directory must be a local directory (the run "
            "record is appended to, and fsynced at every save, stop and resume); mount the bucket, for example "
            f"with Cloud Storage FUSE, and give the mounted path ({mention('run_dir', '/gcs/runs/NAME')})")
    if spec.run_dir:
        run_dir = Path(spec.run_dir)
        top = Path(*run_dir.parts[:2]) if run_dir.is_absolute() and len(run_dir.parts) > 2 else None
        if top is not None and not simulating() and not top.exists():
            # On real slices an absolute run directory lives on a mounted volume (the
            # manifests mount the bucket at /gcs); without the mount it would land in the
            # container's own filesystem and vanish with the pod, and a restart would
            # silently start over.
            raise UsageError(
                f"{mention('run_dir', run_dir)}: {top} does not exist, so the volume it should be on is "
                "not mounted; mount the persistent volume (the manifests mount the bucket with "
                "Cloud Storage FUSE at /gcs) or give a run directory on one")
        return run_dir
    name = spec.name or os.environ.get("JOBSET_NAME")
    if name is not None:
        if not name or "/" in name or name in (".", ".."):
            raise UsageError(f"run name {name!r} must be a plain directory name (no '/')")
        return RUNS_DIR / name
    return None


def _sim_of(config: RunConfig, simulate: bool) -> SimConfig | None:
    """The simulated slices (their defaults when none are given); refuses them on real slices."""
    if simulate:
        return config.sim if config.sim is not None else SimConfig()
    if config.sim is not None:
        given = [mention(f.name) for f in dataclasses.fields(SimConfig) if getattr(config.sim, f.name) != f.default]
        raise UsageError(
            f"{', '.join(given) or 'simulated slices'} only apply to simulated slices, but JAX_PLATFORMS="
            f"{os.environ.get('JAX_PLATFORMS')!r} runs on the real allocation; drop them, or "
            "set JAX_PLATFORMS=cpu to simulate")
    return None


def _schedule_of(sim: SimConfig | None, minimum: int | None) -> Schedule | None:
    """The fault schedule, parsed once and checked against the slices (``None``: no faults)."""
    if sim is None or not sim.schedule:
        return None
    from elastic_dew.simulate.schedule import check_fault_slices, parse_schedule, unreachable

    try:
        schedule = parse_schedule(sim.schedule)
        check_fault_slices(schedule, sim.slices)
        never = unreachable(schedule, sim.slices, minimum, name=mention)
        if never is not None:
            raise ValueError(never)
    except ValueError as err:
        raise SettingError(SimConfig, "schedule", sim.schedule, problem=str(err)) from None
    return schedule


def _elastic_of(config: RunConfig, defaults: Mapping[str, Any], simulate: bool) -> ElasticConfig:
    """The run's :class:`ElasticConfig`: the one given, else the defaults with the recipe's
    global batch; refuses a checkpoint directory the run cannot use."""
    elastic = config.elastic
    if elastic is None:
        elastic = ElasticConfig(global_batch=defaults.get("global_batch", ElasticConfig.global_batch))
    directory = elastic.checkpoint_dir
    if directory is not None and _URL.match(directory) is None and not os.path.isabs(directory):
        raise UsageError(
            f"{mention('checkpoint_dir', directory)} must be an absolute path or a gs:// URL")
    if elastic.checkpoint_kind == "multi_tier" and simulate and directory:
        raise UsageError(
            f"{mention('checkpoint_dir')} is the TPU workers' local volume for "
            f"{mention('checkpoint_kind', 'multi_tier')}; simulated slices write to the replicator stand-in's "
            f"RUN_DIR/{rundir.REPLICATOR_DIR}/local: drop {mention('checkpoint_dir', directory)}")
    return elastic


def _check_checkpoint_dir(config: ElasticConfig, run_dir: Path | None) -> None:
    """Refuse a persistent tier the TPU workers cannot write under Pathways persistence.

    With ``ENABLE_PATHWAYS_PERSISTENCE=1`` the workers write the checkpoint arrays
    themselves (:mod:`elastic_dew.elastic.state.persistence` says why), so the directory must be a
    ``gs://`` URL. The multi-tier kind writes the workers' own local volume on purpose.
    """
    if config.checkpoint_kind != "orbax":
        return
    from elastic_dew.elastic.state.persistence import checkpoint_dir_problem

    directory = config.checkpoint_dir_for(run_dir or RUNS_DIR / "NAME")
    problem = checkpoint_dir_problem(directory, os.environ)
    if problem is not None:  # one of the directory, or one of the environment alone
        raise UsageError(problem)


def plan_run(config: RunConfig) -> RunPlan:
    """Check what spans the parts of ``config`` and decide the run, touching nothing.

    Args:
        config: the run's :class:`RunConfig`.

    Returns:
        The :class:`RunPlan`.

    Raises:
        UsageError: an argument the run cannot use (an unknown recipe, a run directory
            that is not one, ...).
        SettingError: a setting its rule refuses (a batch some slice count cannot take
            among them).
    """
    simulate = simulating()
    module = load_recipe(config.recipe)
    defaults = getattr(module, "DEFAULTS", {})
    sim = _sim_of(config, simulate)
    elastic = _elastic_of(config, defaults, simulate)
    if sim is not None:  # real slices are counted when the protocol is built: execute refuses there
        from elastic_dew.elastic.slices.mesh import check_batch_for_every_slice_count

        check_batch_for_every_slice_count(elastic, sim.slices, sim.devices_per_slice, config.train.microbatch)
    result = RunPlan(
        recipe=module.__name__,
        module=module,
        overrides=dict(config.overrides),
        steps=config.steps or defaults.get("steps", 100),
        simulate=simulate,
        sim=sim,
        schedule=_schedule_of(sim, elastic.minimum_slice_count),
        elastic=elastic,
        train=config.train,
        observe=config.observe,
        run_dir=_run_dir_of(config),
    )
    _check_checkpoint_dir(elastic, result.run_dir)
    if result.run_dir is not None:
        try:
            rundir.check(result.run_dir, result.identity(), option=_RUN_DIR_FIELDS)
        except rundir.RunDirError as err:
            raise UsageError(str(err)) from None
    return result


def compilation_cache_dir() -> Path:
    """Where simulated runs keep JAX's persistent compilation cache: JAX's own
    ``$JAX_COMPILATION_CACHE_DIR`` when the user set it, else
    ``$XDG_CACHE_HOME/elastic_dew/jax-compilation-cache`` (``~/.cache`` without it).

    One per user, not per run: JAX keys an entry by the program, its devices, the flags and
    the jax version, so runs can share it, and the run directory is chosen only after the
    process is prepared.

    Returns:
        The cache's directory.
    """
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "elastic_dew" / "jax-compilation-cache"


def process_options(p: RunPlan) -> dict[str, Any]:
    """The ``prepare_process`` arguments of a planned run: on CPU, the host device count and
    JAX's persistent compilation cache (:func:`compilation_cache_dir`), so a restarted
    process loads the programs the previous one compiled. Without a writable cache
    directory the run compiles without one. On real slices (Pathways) nothing: Pathways
    keeps its own compilation cache.

    Args:
        p: the planned run.

    Returns:
        Keyword arguments for ``prepare_process``.
    """
    if not p.simulate:
        return {}
    assert p.sim is not None
    devices = p.sim.slices * p.sim.devices_per_slice
    options: dict[str, Any] = {"xla_flags": f"--xla_force_host_platform_device_count={devices}"}
    cache = compilation_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        logger.info("compiling without a persistent compilation cache: %s is not writable (%s)", cache, error)
    else:
        options["compilation_cache_dir"] = str(cache)
    return options


def choose_run_dir(p: RunPlan) -> Path:
    """The planned run directory, else a fresh ``runs/TIMESTAMP`` (refused if it exists).

    Args:
        p: the planned run.

    Returns:
        The run directory.

    Raises:
        UsageError: the timestamped directory already exists.
    """
    if p.run_dir is not None:
        return p.run_dir
    from elastic_dew.runtime import run_timestamp

    run_dir = RUNS_DIR / run_timestamp()
    if run_dir.exists():
        raise UsageError(
            f"{run_dir} already exists (another run started this second); give {mention('name')} or "
            f"{mention('run_dir')} to resume a run, or start again for a new timestamp"
        )
    return run_dir


@contextlib.contextmanager
def _slices(p: RunPlan, run_dir: Path) -> Iterator[None]:
    if not p.simulate:
        yield
        return
    from elastic_dew.simulate import SimulatedSlices

    assert p.sim is not None
    multi_tier = p.elastic.checkpoint_kind == "multi_tier"
    with SimulatedSlices(
        p.sim.slices, p.sim.devices_per_slice, schedule=p.schedule, fault_log=run_dir / rundir.FAULTS_FILE,
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

    from elastic_dew.elastic.state.storage import (
        StorageError,
        configure_clients,
        divert_library_errors,
        left_since,
        mark,
    )
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
            from elastic_dew.elastic.state.storage import orphaned

            if not (error.operation == "listing" and error.cause is not None):
                orphaned()  # a listing that failed (a missing bucket) started no writer
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


#: Diversions of the storage libraries' errors kept past their run (:func:`execute`).
_HELD_DIVERSIONS: list[contextlib.ExitStack] = []


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
