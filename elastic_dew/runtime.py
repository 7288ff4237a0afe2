"""Process set-up every recipe runs before it builds anything.

rlimits, the XLA flags, the compilation cache, the JAX distributed pool and the env vars
wandb and the tokenizers read are the same in every recipe. That makes them library
wiring, and a recipe calls :func:`prepare_process` once, as the first line of ``main()``.

Besides set-up, this module holds how a run learns that it is being preempted
(:class:`PreemptionNotice`), how it says it stopped for that reason (:class:`Preempted`,
which ends the program with :data:`PREEMPTED_EXIT`), and the one clock every process of a
pool agrees on (:func:`run_timestamp`).

JAX is imported lazily, inside the functions that need it: the XLA flags and the pool
have to be settled before JAX opens a backend, and ``elastic-dew launch`` imports nothing
of JAX at all.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import logging
import os
import re
import resource
import shlex
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "EXECUTION_TIMEOUT",
    "PREEMPTED_EXIT",
    "Layout",
    "Preempted",
    "PreemptionNotice",
    "Wandb",
    "cuda_plugin",
    "prepare_process",
    "run_timestamp",
]

logger = logging.getLogger(__name__)

#: How long one device execution of a process pool may run before XLA ends its process.
#:
#: A rank that stalls without failing leaves the other ranks inside a collective, and no
#: GPU backend times that out: the pool would hang for ever with every process alive.
#: XLA's execution watchdog ends a process whose execution runs past this, and
#: ``elastic-dew launch``, srun or the scheduler then stops the rest. An execution is a
#: whole step, which can run for minutes, so the bound is generous;
#: ``--xla_gpu_execution_terminate_timeout`` in ``XLA_FLAGS`` or ``xla_flags`` sets another.
EXECUTION_TIMEOUT = "30m"

#: The exit status of a program that stopped at a preemption notice: 128 + SIGTERM, the
#: status SIGTERM itself would have left.
PREEMPTED_EXIT = 128 + signal.SIGTERM

_TIMEOUT_FLAG = "--xla_gpu_execution_terminate_timeout"
_CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"
_TIMESTAMP_FORMAT = "%Y-%m-%d_%H:%M:%S"
_LAYOUT_PARTS = frozenset({"params", "opt_state"})
_CUDA_PLUGIN_MODULES = (
    "jax_cuda13_plugin",
    "jax_cuda12_plugin",
    "jax_plugins.xla_cuda13",
    "jax_plugins.xla_cuda12",
)
#: The first jax whose persistent-cache key of a GPU computation spanning several
#: processes is the same on every process (the key strips the device assignment). This is
#: the lower bound elastic_dew pins; its ``jax._src.cache_key`` was read to confirm it.
_POOL_KEYS_ALIKE_SINCE = (0, 10, 1)


# --------------------------------------------------------------------------- config types


@dataclasses.dataclass(frozen=True)
class Wandb:
    """The run's Weights & Biases settings.

    :func:`prepare_process` reads only ``offline``, and has to read it before wandb opens
    a run: wandb takes its mode from ``WANDB_MODE`` when it starts.
    """

    offline: bool = False
    project: str | None = None
    entity: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.offline, bool):
            raise ValueError(f"Wandb.offline must be True or False, got {self.offline!r}")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which parts of the training state the host owns between steps.

    ``host`` names parts from ``params`` and ``opt_state``. With ``params`` among them the
    host holds the transaction (CPU transaction ownership), which needs a CPU backend
    beside the accelerator and one CPU device per local accelerator; :func:`prepare_process`
    checks both. The same ``Layout`` is passed to the trainer.
    """

    host: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        host = self.host
        if isinstance(host, str) or not isinstance(host, (set, frozenset, list, tuple)):
            raise ValueError(
                f"Layout.host must be a set of state parts, e.g. frozenset({{'params'}}), "
                f"got {host!r}"
            )
        unknown = sorted(set(host) - _LAYOUT_PARTS)
        if unknown:
            raise ValueError(
                f"Layout.host names unknown state parts {unknown}; "
                f"the parts a host can own are {sorted(_LAYOUT_PARTS)}"
            )
        object.__setattr__(self, "host", frozenset(host))


# ------------------------------------------------------------------------------ questions


def cuda_plugin() -> bool:
    """Whether JAX's CUDA plugin is installed, the one reader of XLA's GPU flags.

    Asked before the backend opens, which no other question (``jax.devices()``) can be:
    it looks for the plugin's module without importing it.
    """
    for name in _CUDA_PLUGIN_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _backend_started() -> bool:
    """Whether this process already opened a JAX backend (XLA has read its flags)."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    check = getattr(xla_bridge, "backends_are_initialized", None)
    if check is not None:
        return bool(check())
    return bool(getattr(xla_bridge, "_backends", {}))


def _platforms() -> str:
    """The platforms JAX may use, as ``JAX_PLATFORMS`` (or jax's config) names them."""
    env = os.environ.get("JAX_PLATFORMS", "")
    if env:
        return env
    if "jax" in sys.modules:
        import jax

        return jax.config.jax_platforms or ""
    return ""


def _pathways_controller() -> bool:
    """Whether this process is a Pathways single controller (the proxy backend)."""
    return "proxy" in _platforms().lower()


def _jax_version() -> tuple[int, ...]:
    import jax

    return tuple(int(p) for p in re.findall(r"\d+", jax.__version__)[:3])


def _pool_keys_alike(version: tuple[int, ...]) -> bool:
    """Whether this jax keys a computation spanning processes alike on every process.

    If it does not, some ranks of a GPU pool would load a step from the persistent cache
    that the others compile, and that compile waits for every rank for ever.
    """
    return tuple(version) >= _POOL_KEYS_ALIKE_SINCE


# ----------------------------------------------------------------------------- XLA flags


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0]


def _merge_flags(existing: str, requested: str | None, add_timeout: bool) -> str:
    """``existing`` with ``requested`` merged in: a flag already set takes the requested
    value in place, new flags are appended, nothing appears twice."""
    tokens = shlex.split(existing)
    positions = {_flag_name(t): i for i, t in enumerate(tokens)}
    for token in shlex.split(requested or ""):
        name = _flag_name(token)
        if name in positions:
            tokens[positions[name]] = token
        else:
            positions[name] = len(tokens)
            tokens.append(token)
    if add_timeout and _TIMEOUT_FLAG not in positions:
        tokens.append(f"{_TIMEOUT_FLAG}={EXECUTION_TIMEOUT}")
    return " ".join(tokens)


# -------------------------------------------------------------------------------- layout


def _cpu_devices_established(xla_flags: str) -> int | None:
    """How many CPU devices JAX will make, if something set it before this call."""
    value = os.environ.get("JAX_NUM_CPU_DEVICES")
    if value is None and "jax" in sys.modules:
        import jax

        configured = getattr(jax.config, "jax_num_cpu_devices", -1)
        if configured is not None and configured >= 0:
            value = str(configured)
    if value is None:
        for token in shlex.split(xla_flags):
            if _flag_name(token) == _CPU_COUNT_FLAG and "=" in token:
                value = token.split("=", 1)[1]
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _local_accelerators_from_env() -> int | None:
    """The number of local accelerators, where the environment says so before start."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    chips = os.environ.get("TPU_VISIBLE_CHIPS")
    if chips:
        return len([c for c in chips.split(",") if c.strip()])
    return None


def _check_layout(layout: Layout, xla_flags_env: str) -> None:
    """Refuse a host-owned ``params`` layout the backend was not set up for.

    Reads configuration only; it never changes it, before or after the backend started.
    """
    if "params" not in layout.host:
        return
    platforms = [p.strip().lower() for p in _platforms().split(",") if p.strip()]
    if platforms == ["cpu"]:
        return  # CPU is the accelerator: host memory is device memory
    if platforms and "cpu" not in platforms:
        raise ValueError(
            f"Layout(host=...) includes 'params', so the host owns the transaction and needs "
            f"a CPU backend beside the accelerator, but JAX_PLATFORMS={','.join(platforms)!r} "
            f"excludes CPU. Set JAX_PLATFORMS={','.join(platforms)},cpu before the process starts."
        )
    if _backend_started():
        import jax

        accelerators = jax.local_device_count()
        cpus = len(jax.local_devices(backend="cpu"))
        where = "the started backend has"
    else:
        accelerators = _local_accelerators_from_env()
        cpus = _cpu_devices_established(xla_flags_env)
        where = "the environment establishes"
        if cpus is None:
            raise ValueError(
                "Layout(host=...) includes 'params', which needs one CPU device per local "
                "accelerator, and nothing establishes the CPU device count. Set "
                "JAX_NUM_CPU_DEVICES=<local accelerators> (or XLA_FLAGS="
                f"{_CPU_COUNT_FLAG}=<local accelerators>) before calling prepare_process."
            )
    if accelerators is not None and cpus != accelerators:
        raise ValueError(
            f"Layout(host=...) includes 'params', which needs one CPU device per local "
            f"accelerator: {where} {cpus} CPU device(s) for {accelerators} accelerator(s). "
            f"Set JAX_NUM_CPU_DEVICES={accelerators} before the process starts."
        )


# ---------------------------------------------------------------------------------- pool


@dataclasses.dataclass(frozen=True)
class _PoolPlan:
    """How this process joins (or does not join) a pool: decided before anything changes."""

    action: str  # "none", "pathways", "dew", "detect"
    why: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    required: bool = False


def _int_env(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not an integer; fix the launcher") from None


def _slurm_tasks_on_node(env: Mapping[str, str]) -> int | None:
    """Tasks of this Slurm step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` ("2(x3),1")."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if spec:
        counts: list[int] = []
        for part in spec.split(","):
            m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
            if not m:
                return None
            counts += [int(m.group(1))] * int(m.group(2) or 1)
        node = int(env.get("SLURM_NODEID", "0") or 0)
        if 0 <= node < len(counts):
            return counts[node]
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    return int(per_node) if per_node and per_node.isdigit() else None


def _slurm_gpus_seen(env: Mapping[str, str]) -> int | None:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    on_node = env.get("SLURM_GPUS_ON_NODE")
    return int(on_node) if on_node and on_node.isdigit() else None


def _pool_plan(multi_host: bool | None, env: Mapping[str, str], pathways: bool) -> _PoolPlan:
    """Decide how to join the pool from the environment a scheduler left."""
    if pathways:
        if multi_host:
            raise ValueError(
                "multi_host=True asks for a JAX process pool, but JAX_PLATFORMS names the "
                "Pathways proxy backend: a Pathways single controller forms no pool. "
                "Pass multi_host=None (or False) under Pathways."
            )
        return _PoolPlan("pathways", "JAX_PLATFORMS names the Pathways proxy backend")
    if multi_host is False:
        return _PoolPlan("none", "multi_host=False")
    if "DEW_PROCESS_COUNT" in env or "DEW_PROCESS_ID" in env:
        missing = [
            n
            for n in ("DEW_PROCESS_COUNT", "DEW_PROCESS_ID", "JAX_COORDINATOR_ADDRESS")
            if not env.get(n)
        ]
        if missing:
            raise ValueError(
                f"a launcher left DEW_PROCESS_COUNT/DEW_PROCESS_ID but not {missing}; "
                "start the ranks with `elastic-dew launch -n N -- CMD`, which sets all three"
            )
        count, rank = _int_env(env, "DEW_PROCESS_COUNT"), _int_env(env, "DEW_PROCESS_ID")
        if not 0 <= rank < count:
            raise ValueError(
                f"DEW_PROCESS_ID={rank} is outside the pool of DEW_PROCESS_COUNT={count}"
            )
        return _PoolPlan(
            "dew",
            f"elastic-dew launch rank {rank} of {count}",
            {
                "coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
                "num_processes": count,
                "process_id": rank,
                "cluster_detection_method": "deactivate",
            },
            required=True,
        )
    mpirun = "OMPI_MCA_orte_hnp_uri" in env  # what JAX's Open MPI detection reads
    slurm = all(
        n in env
        for n in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    )
    if slurm and not mpirun:
        tasks = _int_env(env, "SLURM_NTASKS")
        if tasks == 1 and not multi_host:
            return _PoolPlan(
                "none",
                "a Slurm step of one task: no pool (pass multi_host=True to ask for one)",
            )
        if tasks > 1:
            on_node, gpus = _slurm_tasks_on_node(env), _slurm_gpus_seen(env)
            if on_node is not None and gpus is not None and on_node < gpus:
                raise ValueError(
                    f"this Slurm step runs {on_node} task(s) on this node, but its task sees "
                    f"{gpus} GPUs: JAX gives each task only the GPU at its SLURM_LOCALID, so "
                    f"{gpus - on_node} would sit idle. Run one task per GPU "
                    f"(srun --ntasks-per-node={gpus}), or one task in all and "
                    "`elastic-dew launch -n N` inside it."
                )
    return _PoolPlan("detect", "JAX cluster detection", required=bool(multi_host))


def _join_pool(plan: _PoolPlan) -> None:
    if plan.action == "pathways":
        import pathwaysutils

        logger.info("Pathways single controller: pathwaysutils.initialize(), no JAX pool")
        pathwaysutils.initialize()
        return
    if plan.action == "none":
        logger.debug("no JAX process pool: %s", plan.why)
        return
    import jax

    if jax.distributed.is_initialized():
        logger.debug("the JAX process pool is already joined")
        return
    try:
        jax.distributed.initialize(**plan.kwargs)
    except ValueError as err:
        if plan.action == "detect" and "coordinator_address" in str(err):
            if plan.required:
                raise RuntimeError(
                    "multi_host=True requires a JAX process pool, but no cluster environment "
                    f"names a coordinator ({err}). Start the ranks with a scheduler (Slurm, "
                    "mpirun, a TPU pod) or `elastic-dew launch -n N -- CMD`."
                ) from err
            logger.debug("single host: %s", err)
            return
        raise
    logger.info("joined the JAX process pool (%s)", plan.why)


def _pool_size() -> int:
    if "jax" not in sys.modules:
        return 1
    from jax._src import distributed

    return distributed.global_state.num_processes if distributed.global_state.client else 1


def _gpu_platform_allowed() -> bool:
    platforms = [p.strip().lower() for p in _platforms().split(",") if p.strip()]
    return not platforms or any(p in ("cuda", "gpu", "rocm") for p in platforms)


def _enable_cache(directory: str | os.PathLike[str]) -> None:
    import jax

    if _pool_size() > 1 and cuda_plugin() and _gpu_platform_allowed():
        if not _pool_keys_alike(_jax_version()):
            logger.warning(
                "compiling without the persistent compilation cache: jax %s keys a GPU "
                "computation that spans processes differently on each process, so some ranks "
                "would load a step the others compile, and that compile would wait for ever",
                ".".join(map(str, _jax_version())),
            )
            return
    jax.config.update("jax_compilation_cache_dir", os.fspath(directory))
    logger.debug("persistent compilation cache at %s", directory)


# ---------------------------------------------------------------------------- preemption


class Preempted(Exception):
    """The run stopped at a preemption notice, at ``step``, with that step's checkpoint
    and data position written.

    Uncaught, it ends the program with :data:`PREEMPTED_EXIT` and no traceback, the way
    SIGTERM itself would have; the same program run again resumes from the checkpoint.
    """

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted at step {step}")
        self.step = step

    def __reduce__(self):
        return (type(self), (self.step,))


def _preempted_excepthook(exc_type, exc, tb) -> None:
    if not (isinstance(exc_type, type) and issubclass(exc_type, Preempted)):
        _previous_excepthook(exc_type, exc, tb)
        return
    logger.info("%s: exiting with status %d", exc, PREEMPTED_EXIT)
    # The exit status cannot be changed once the hook returns, so do the interpreter's own
    # shutdown here and leave with os._exit. threading._shutdown is that shutdown's first
    # part: it runs the threading atexit callbacks (which tell idle ThreadPoolExecutor
    # workers, such as Grain's and Orbax's, to stop) and then joins non-daemon threads.
    # Joining them without those callbacks would wait for ever.
    if threading.current_thread() is threading.main_thread():
        threading._shutdown()
    try:
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream must not change the status
                pass
        os._exit(PREEMPTED_EXIT)


_previous_excepthook = sys.excepthook


def _install_excepthook() -> None:
    """Make an uncaught :class:`Preempted` exit with ``PREEMPTED_EXIT``; other exceptions
    go to the hook that was there before."""
    global _previous_excepthook
    if sys.excepthook is not _preempted_excepthook:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _preempted_excepthook


_install_excepthook()


class PreemptionNotice:
    """Whether a preemption notice reached the run, asked once a step, from creation until
    :meth:`close`.

    A scheduler stops a job with SIGTERM and SIGKILLs it a grace period later. In a pool,
    JAX's preemption service takes the SIGTERM (XLA's notifier replaces the handler when
    the pool forms, so the process runs on), shares the notice through the coordination
    service, and :meth:`reached` agrees one step on every process. A pool whose preemption
    service is off (``jax_enable_preemption_service``) never reports a notice, and SIGTERM
    ends it as it always did. A process outside any pool, the Pathways controller
    included, has no such service: the notice is SIGTERM itself, caught from creation
    until :meth:`close`. A second SIGTERM is logged and ignored: the run is already
    stopping. Use it as a context manager to close it on the way out.
    """

    def __init__(self) -> None:
        from jax._src import distributed

        self._state = distributed.global_state
        self._pooled = self._state.client is not None
        self._signals = 0
        self._reported = False
        self._previous: Any = None
        self._closed = False
        if self._pooled:
            if self._state.preemption_sync_manager is None:
                logger.info(
                    "the JAX preemption service is off (jax_enable_preemption_service): "
                    "this pool gets no preemption notice, and SIGTERM ends it"
                )
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "PreemptionNotice() outside a pool catches SIGTERM, which Python allows only "
                "in the main thread; create it there"
            )
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self._signals += 1
        if self._signals == 1:
            logger.warning("SIGTERM: preemption notice, stopping at the next step")
        else:
            logger.warning("SIGTERM again (%d): ignored, already stopping", self._signals)

    def reached(self, step: int) -> bool:
        """Whether to stop at ``step``: in a pool, whether every process agreed on it;
        alone, whether SIGTERM arrived."""
        if self._pooled:
            manager = self._state.preemption_sync_manager
            hit = manager is not None and bool(manager.reached_sync_point(int(step)))
        else:
            hit = self._signals > 0
        if hit and not self._reported:
            self._reported = True
            logger.warning("preemption notice reached: stopping at step %d", step)
        return hit

    def close(self) -> None:
        """Put back the SIGTERM handler this notice replaced."""
        if self._closed:
            return
        self._closed = True
        if not self._pooled and self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def __enter__(self) -> PreemptionNotice:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


# ----------------------------------------------------------------------------- the clock

_timestamp_calls = 0


def run_timestamp() -> str:
    """Return process 0's wall clock as ``%Y-%m-%d_%H:%M:%S``, on every process.

    A default run name carries it, and the name is the checkpoint directory every process
    writes into, so a process that read its own clock a second later would write into a
    different directory. In a pool, process 0 publishes its clock in the coordination
    service's key-value store and the others wait for it; alone, it is the local clock.
    The n-th call on each process reads the n-th published value, so every process must
    call it the same number of times.
    """
    global _timestamp_calls
    if "jax" in sys.modules:
        from jax._src import distributed

        client = distributed.global_state.client
    else:
        client = None
    if client is None:
        return time.strftime(_TIMESTAMP_FORMAT)
    key = f"elastic_dew/run_timestamp/{_timestamp_calls}"
    _timestamp_calls += 1
    if distributed.global_state.process_id == 0:
        stamp = time.strftime(_TIMESTAMP_FORMAT)
        client.key_value_set(key, stamp)
        return stamp
    return client.blocking_key_value_get(key, 10 * 60 * 1000)


# ----------------------------------------------------------------------- prepare_process


def _raise_limit(which: int) -> None:
    soft, hard = resource.getrlimit(which)
    if soft == resource.RLIM_INFINITY or (hard != resource.RLIM_INFINITY and soft >= hard):
        return
    try:
        resource.setrlimit(which, (hard, hard))
    except (ValueError, OSError):
        if which == resource.RLIMIT_NOFILE and hard == resource.RLIM_INFINITY:
            # Linux caps open files at fs.nr_open even when the hard limit says unlimited.
            try:
                nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
                if nr_open > soft:
                    resource.setrlimit(which, (nr_open, hard))
                    return
            except (OSError, ValueError):
                pass
        logger.debug("could not raise rlimit %d from %d toward %d", which, soft, hard)


def prepare_process(
    wandb: Wandb | None = None,
    multi_host: bool | None = None,
    xla_flags: str | None = None,
    compilation_cache_dir: str | os.PathLike[str] | None = None,
    *,
    layout: Layout | None = None,
) -> None:
    """Raise the fd/core limits, set the env vars, join the JAX process pool.

    ``wandb`` is the run's :class:`Wandb`, or None for a run without a tracker; only its
    ``offline`` switch is read (``WANDB_MODE=offline``). ``TOKENIZERS_PARALLELISM`` is set
    to ``false`` unless the environment already sets it.

    ``xla_flags`` reaches XLA through ``XLA_FLAGS``, which XLA reads when it opens a
    backend, so this call comes before the first JAX call: a recipe's first line. With
    JAX's CUDA plugin installed, ``--xla_gpu_execution_terminate_timeout=EXECUTION_TIMEOUT``
    is added unless a value is already set. Called after a backend started, with flags
    that could no longer take effect, it raises ``RuntimeError`` and changes nothing.

    ``compilation_cache_dir`` turns on JAX's persistent compilation cache there; a GPU
    pool on a jax that keys multi-process computations differently per process compiles
    without it and says why in a warning. Under Pathways (``JAX_PLATFORMS`` names the
    proxy backend), which keeps its own cache, it is ignored with a warning, and
    ``pathwaysutils.initialize()`` runs instead of joining a JAX pool.

    Joining the pool: ``jax.distributed.initialize()`` with cluster detection (TPU pods,
    Slurm, Open MPI, GKE). ``DEW_PROCESS_COUNT``/``DEW_PROCESS_ID`` left by
    ``elastic-dew launch`` are passed with detection off. With no cluster environment the
    single-host ``ValueError`` naming the coordinator address is swallowed; every other
    failure propagates. ``multi_host=True`` requires the pool, ``multi_host=False`` never
    asks. A Slurm step of one task forms no pool unless ``multi_host=True`` or mpirun
    started the ranks; a Slurm step of several tasks with fewer on this node than the GPUs
    its task sees is refused.

    ``layout`` with ``"params"`` in ``host`` needs ``JAX_PLATFORMS`` to permit CPU beside
    the accelerator and one CPU device per local accelerator, established before this
    call (``JAX_NUM_CPU_DEVICES`` or ``--xla_force_host_platform_device_count``).

    Every argument and decision is checked before anything changes, so a ``ValueError``
    or ``RuntimeError`` leaves the process as it was. The call also installs the hook that
    makes an uncaught :class:`Preempted` exit with :data:`PREEMPTED_EXIT`.
    """
    # ---- check everything first
    if wandb is not None and not isinstance(wandb, Wandb):
        raise ValueError(f"wandb must be an elastic_dew.runtime.Wandb or None, got {wandb!r}")
    if multi_host not in (None, True, False):
        raise ValueError(f"multi_host must be True, False or None, got {multi_host!r}")
    if xla_flags is not None and not isinstance(xla_flags, str):
        raise ValueError(f"xla_flags must be a string of XLA flags or None, got {xla_flags!r}")
    if layout is not None and not isinstance(layout, Layout):
        raise ValueError(f"layout must be an elastic_dew.runtime.Layout or None, got {layout!r}")
    if compilation_cache_dir is not None and not isinstance(compilation_cache_dir, (str, os.PathLike)):
        raise ValueError(
            f"compilation_cache_dir must be a path or None, got {compilation_cache_dir!r}"
        )
    for token in shlex.split(xla_flags or ""):
        if not token.startswith("--"):
            raise ValueError(f"xla_flags: {token!r} is not an XLA flag (--name=value)")

    pathways = _pathways_controller()
    started = _backend_started()
    existing = os.environ.get("XLA_FLAGS", "")
    wanted = _merge_flags(existing, xla_flags, add_timeout=cuda_plugin() and not started)
    if started and shlex.split(wanted) != shlex.split(existing):
        new = sorted(set(shlex.split(wanted)) - set(shlex.split(existing)))
        raise RuntimeError(
            f"a JAX backend already started in this process, so XLA flags {new} can no longer "
            "take effect; call prepare_process() before the first JAX call (the first line of "
            "main()), or set XLA_FLAGS in the environment before the process starts"
        )
    if layout is not None:
        _check_layout(layout, existing)
    plan = _pool_plan(multi_host, os.environ, pathways)

    # ---- then change things
    _raise_limit(resource.RLIMIT_NOFILE)
    _raise_limit(resource.RLIMIT_CORE)
    if wandb is not None and wandb.offline:
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if wanted != existing:
        os.environ["XLA_FLAGS"] = wanted
    _install_excepthook()
    _join_pool(plan)
    if compilation_cache_dir is not None:
        if pathways:
            logger.warning(
                "compilation_cache_dir=%s ignored: Pathways keeps its own compilation cache "
                "and turns JAX's off",
                compilation_cache_dir,
            )
        else:
            _enable_cache(compilation_cache_dir)
