"""``prepare_process``: the set-up every recipe runs before it builds anything.

rlimits, the XLA flags, the compilation cache, the JAX distributed pool and the env vars
wandb and the tokenizers read are the same in every recipe. That makes them library
wiring, and a recipe calls :func:`prepare_process` once, as the first line of ``main()``.
It composes the runtime's modules: it checks every argument and decision first
(:mod:`~elastic_dew.runtime.xla_flags`, :mod:`~elastic_dew.runtime.layout`,
:mod:`~elastic_dew.runtime.pool`), then changes things
(:mod:`~elastic_dew.runtime.limits`, the environment, the exit hook, the pool,
:mod:`~elastic_dew.runtime.compilation_cache`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex

from elastic_dew.runtime import backend, compilation_cache, limits, local_bucket, pool
from elastic_dew.runtime import layout as layout_
from elastic_dew.runtime import xla_flags as xla_flags_
from elastic_dew.runtime.layout import Layout
from elastic_dew.runtime.preemption import install_exit_hook

__all__ = ["Wandb", "prepare_process"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Wandb:
    """The run's Weights & Biases settings.

    :func:`prepare_process` reads only ``offline``, and has to read it before wandb opens
    a run: wandb takes its mode from ``WANDB_MODE`` when it starts.

    Args:
        offline: whether wandb runs offline (``WANDB_MODE=offline``).
        project: the wandb project, for the caller's own ``wandb.init``.
        entity: the wandb entity, likewise.

    Raises:
        ValueError: ``offline`` is not a bool.
    """

    offline: bool = False
    project: str | None = None
    entity: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.offline, bool):
            raise ValueError(f"Wandb.offline must be True or False, got {self.offline!r}")


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

    ``compilation_cache_dir`` turns on JAX's persistent compilation cache there, with
    JAX's own threshold (:func:`use_compilation_cache`); a GPU pool on a jax that keys
    multi-process computations differently per process compiles without it and says why in
    a warning. Under Pathways (``JAX_PLATFORMS`` names the proxy backend), which keeps its
    own cache, it is ignored with a warning, and ``pathwaysutils.initialize()`` runs
    instead of joining a JAX pool.

    Joining the pool: ``jax.distributed.initialize()`` with cluster detection (TPU pods,
    Slurm, Open MPI, GKE). ``DEW_PROCESS_COUNT``/``DEW_PROCESS_ID`` left by
    ``elastic-dew launch`` are passed with detection off. With no cluster environment the
    single-host ``ValueError`` naming the coordinator address is swallowed; every other
    failure propagates. ``multi_host=True`` requires the pool, ``multi_host=False`` never
    asks. A Slurm step of one task forms no pool unless ``multi_host=True`` or mpirun
    started the ranks; a Slurm step of several tasks with fewer on this node than the GPUs
    its task sees is refused.

    With ``STORAGE_EMULATOR_HOST`` set (a local Cloud Storage server), every ``gs://``
    client is pointed at it and kept off the cloud metadata server
    (:func:`~elastic_dew.runtime.local_bucket.use_local_bucket`); a malformed address is a
    ``ValueError``.

    ``layout`` with ``"params"`` in ``host`` needs ``JAX_PLATFORMS`` to permit CPU beside
    the accelerator and one CPU device per local accelerator, established before this
    call (``JAX_NUM_CPU_DEVICES`` or ``--xla_force_host_platform_device_count``).

    Every argument and decision is checked before anything changes, so a ``ValueError``
    or ``RuntimeError`` leaves the process as it was. The call also installs the hook that
    makes an uncaught :class:`Preempted` exit with :data:`PREEMPTED_EXIT`
    (:func:`install_exit_hook`).

    Args:
        wandb: the run's :class:`Wandb`, or ``None`` for a run without a tracker.
        multi_host: ``True`` requires a process pool, ``False`` never forms one, ``None``
            forms one where the environment says there is a cluster.
        xla_flags: XLA flags to add to ``XLA_FLAGS`` (they must reach XLA before its backend
            opens), or ``None``.
        compilation_cache_dir: where JAX's persistent compilation cache lives, or ``None``
            for none.
        layout: the :class:`Layout` the trainer will get, checked against the backend
            configuration, or ``None``.

    Raises:
        ValueError: an argument of the wrong kind, a malformed ``STORAGE_EMULATOR_HOST``, a
            layout the backend configuration cannot serve, or a pool that cannot work (a
            Slurm step with fewer tasks on this node than its GPUs); nothing was changed.
        RuntimeError: a JAX backend already started, so the XLA flags could no longer take
            effect; nothing was changed.
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
    compilation_cache._check(compilation_cache_dir, compilation_cache.JAX_MIN_COMPILE_TIME_S)
    for token in shlex.split(xla_flags or ""):
        if not token.startswith("--"):
            raise ValueError(f"xla_flags: {token!r} is not an XLA flag (--name=value)")
    bucket_problem = local_bucket.local_bucket_problem(os.environ)
    if bucket_problem:
        raise ValueError(bucket_problem)

    pathways = backend._pathways_controller()
    started = backend._backend_started()
    existing = os.environ.get("XLA_FLAGS", "")
    wanted = xla_flags_._merge_flags(
        existing, xla_flags, add_timeout=backend.cuda_plugin() and not started
    )
    xla_flags_._refuse_late_flags(existing, wanted, started)
    if layout is not None:
        layout_._check_layout(layout, existing)
    plan = pool._pool_plan(multi_host, os.environ, pathways)

    # ---- then change things
    local_bucket.use_local_bucket()  # before a Cloud Storage client is imported
    limits._raise_limits()
    if wandb is not None and wandb.offline:
        os.environ["WANDB_MODE"] = "offline"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if wanted != existing:
        os.environ["XLA_FLAGS"] = wanted
    install_exit_hook()
    pool._join_pool(plan)
    if compilation_cache_dir is not None:
        compilation_cache.use_compilation_cache(compilation_cache_dir)
