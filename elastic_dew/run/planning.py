"""A run planned: what spans the parts of a :class:`~elastic_dew.run.config.RunConfig`
checked, and the run decided, touching nothing.

:func:`plan_run` resolves the recipe module, checks the batch against every slice count the
simulated slices can reach, parses the fault schedule once and checks it against the slices,
decides the run directory and checks its identity (through :mod:`elastic_dew.rundir`, whose
identity includes the fault schedule, so resuming with another ``--schedule`` is refused).
:func:`process_options` are the ``prepare_process`` arguments of a planned run, and
:func:`choose_run_dir` the directory of one that did not name its own.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from elastic_dew import rundir
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.observe.sinks import ObserveOptions
from elastic_dew.run.config import RunConfig, SimConfig
from elastic_dew.run.exits import UsageError
from elastic_dew.run.recipes import load_recipe
from elastic_dew.settings import SettingError, mention
from elastic_dew.train_config import TrainConfig

if TYPE_CHECKING:
    from elastic_dew.simulate import Schedule

__all__ = [
    "RunPlan", "plan_run", "process_options", "compilation_cache_dir", "choose_run_dir", "simulating",
    "RUNS_DIR", "RUN_DIR_OPTION",
]

logger = logging.getLogger(__name__)

#: Where ``--name NAME`` puts a run directory (``runs/NAME``), relative to the working directory.
RUNS_DIR = Path("runs")
#: How a user names the run directory, in refusals of one: the two keywords of
#: :class:`RunConfig` that choose it (a refusal carries them as data, ``_RUN_DIR_FIELDS``,
#: which the command line names by their flags).
RUN_DIR_OPTION = "run_dir= or name="
_RUN_DIR_FIELDS = f"{mention('run_dir')} or {mention('name')}"
#: A URL scheme (gs://, s3://, file://): not a local path, which the run directory must be.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

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
    from elastic_dew.simulate.reachability import unreachable
    from elastic_dew.simulate.schedule import check_fault_slices, parse_schedule

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
