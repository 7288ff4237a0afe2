"""Frozen configuration of the elastic layer, checked once as it is built, before any state is touched.

:class:`ElasticConfig` declares each setting once, in Python terms, with
:func:`~elastic_dew.settings.setting` (its default, its range or choices); as it is built it
checks its fields and raises one :class:`~elastic_dew.settings.SettingError` naming the
field, the value and the rule. The command line that offers these settings is built in the
console (:mod:`elastic_dew.console`); nothing here names a flag.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

from elastic_dew import settings as _settings

__all__ = [
    "ElasticConfig",
    "BATCH_POLICIES",
    "CHECKPOINT_KINDS",
    "SHARDINGS",
    "MICROBATCH",
    "SIMULATED_POLL_INTERVAL",
    "PATHWAYS_POLL_INTERVAL",
    "MULTI_TIER_DIR",
    "CHECKPOINTS_DIR",
]

_Bound, _setting = _settings.Bound, _settings.setting

#: What the global batch does when slices are lost: ``constant`` keeps it (more examples per
#: surviving device), ``scale_by_active_slices`` scales it with the active slices.
BatchPolicy = Literal["constant", "scale_by_active_slices"]
BATCH_POLICIES: tuple[str, ...] = get_args(BatchPolicy)
#: The persistent tier's default directory inside a run directory (``RUN_DIR/checkpoints``);
#: the run directory's layout (:mod:`elastic_dew.rundir`) takes it from here.
CHECKPOINTS_DIR = "checkpoints"
#: The persistent tier's kinds (``ElasticConfig.checkpoint_kind``): declared once, as the
#: field's type, and read from it.
CheckpointKind = Literal["orbax", "multi_tier"]
CHECKPOINT_KINDS: tuple[str, ...] = get_args(CheckpointKind)
#: Seconds between slice health checks when ``poll_interval`` is left out, on simulated
#: (CPU) slices, which come back at once, so polling fast keeps waits short ...
SIMULATED_POLL_INTERVAL = 0.5
#: ... and on real slices (pathwaysutils' own default).
PATHWAYS_POLL_INTERVAL = 10.0
#: The workers' local multi-tier checkpoint directory (the guide's --gke-mtc-ramdisk-dir).
MULTI_TIER_DIR = "/tmp/mtc_checkpoints"

#: The named sharding policies of the training state inside a slice (``elastic.sharding``).
SHARDINGS: tuple[str, ...] = ("replicated", "fsdp")

#: What a microbatch may be (examples per data-parallel device per micro-step): a whole
#: number >= 1, or ``None`` for the whole per-device batch at once. One declaration for
#: :class:`~elastic_dew.train_config.TrainConfig`'s field and for the microbatch a
#: protocol ``Program`` brings (:func:`~elastic_dew.elastic.slices.mesh.check_batch_for_every_slice_count`).
MICROBATCH = _Bound(1, none=True, whole=True)

@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """How a training run survives slice loss, scale-up and preemption.

    Args:
      (each field, by what it sets)

    Recovery (pathwaysutils' ``elastic_retry``):
      minimum_slice_count: replica-resize: carry on with at least this many slices after a
        loss, and scale back up when the others return. ``None`` is the guide's
        pause-resume mode: wait until every slice is healthy again.
      poll_interval: seconds between slice health checks. ``None`` is
        :data:`SIMULATED_POLL_INTERVAL` on simulated (CPU) slices and pathwaysutils' 10
        (:data:`PATHWAYS_POLL_INTERVAL`) on real ones (:meth:`poll_seconds`).
      timeout: seconds to wait for healthy slices before giving up with ``TimeoutError``. 300
        (the guide's), so that a wait for a slice that never returns ends; ``None`` waits
        for ever.
      max_attempts: slice losses within ``retry_reset_steps`` steps of progress survived
        before giving up. ``ElasticRetryLimit(max_attempts)`` over slice-loss attempts only:
        scale-ups never count against it. 10 (the guide's); ``None`` retries for ever.
      retry_reset_steps: steps of progress after which the count of slice losses starts
        again; 0 counts them over the whole run, as pathwaysutils' ``ElasticRetryLimit``
        does. The count starts again once the run has got this many steps past the furthest
        step it had completed at the first loss counted, so the run gives up after
        ``max_attempts`` losses within that much progress (a crash loop still ends after
        ``max_attempts``) rather than after ``max_attempts`` over its whole life
        (:class:`~elastic_dew.elastic.slices.retry.SliceLossRetryLimit`).
      step_timeout: seconds a step's result may take to arrive before the step counts as a
        slice loss (``DEADLINE_EXCEEDED``) and the run recovers instead of hanging on a slice
        that stopped answering. ``None`` is automatic
        (:class:`~elastic_dew.elastic.deadline.StepDeadline`).
      pre_callback / on_elastic_event_callback: passed through to ``elastic_retry``.

    Mesh and batch:
      model_axis: devices of the ``model`` (tensor-parallel) axis inside a slice; the rest of
        a slice's devices form the ``data`` axis. ``None`` means 1 (pure data parallelism).
      global_batch: examples per step with every slice active.
      batch_policy: ``constant`` keeps the global batch (each slice takes more when
        slices are lost); ``scale_by_active_slices`` scales it with the active slices.

    State:
      snapshot_every: steps between in-memory snapshots (tier 1); 0 turns them off.
      checkpoint_every: steps between persistent checkpoints (tier 2); 0 keeps only the
        checkpoints written at preemption stops.
      checkpoint_dir: where the persistent tier writes: a local directory or a ``gs://``
        path. ``None`` is the default (:meth:`checkpoint_dir_for`: ``RUN_DIR/checkpoints``,
        or :data:`MULTI_TIER_DIR` for ``multi_tier``) where a run directory is known, and no
        tier 2 for an :class:`~elastic_dew.elastic.loop.protocol.ElasticRun` built alone.
      checkpoint_kind: the persistent tier: ``orbax`` (a ``CheckpointManager`` in the run
        directory) or ``multi_tier`` (the guide's ``ReplicatorCheckpointManager`` over
        colocated-Python sidecars: a Pathways backend, or the simulator with its stand-in for
        GKE's replicator in ``RUN_DIR/replicator``).
      max_to_keep: persistent checkpoints kept.
      mtc_backup_minutes: ``multi_tier``: minutes between the replicator's backups of the
        local checkpoints to the bucket. Its ``backup_interval_minutes``; the guide's 10.
      mtc_init_timeout: ``multi_tier``: seconds one initialisation (at start, every attempt
        and scale-up) may wait for the replicator before the run fails. Orbax's
        ``jax_initialization_timeout_seconds``.

    Storage (:mod:`~elastic_dew.elastic.state.storage`):
      storage_timeout: the longest time in seconds the storage may go without activity (no
        request answered, no byte moved, retries included) during a checkpoint save, commit,
        restore or listing before it counts as stalled and is given up on: a stalled save is
        abandoned and training goes on; a stalled restore ends the run with an error naming
        the storage. A commit that stays active is never given up on, however long it
        takes (:mod:`~elastic_dew.elastic.state.activity` says what counts). A data read,
        which no storage client measures, may take this long in all. ``None`` is automatic:
        ten times the state's transfer time at the bandwidth measured so far, at least 180 s
        (:func:`~elastic_dew.elastic.state.storage.automatic_timeout`).
      grace_period: the preemption grace window in seconds (the pod's
        ``terminationGracePeriodSeconds``): a preemption's checkpoint gets what is left of
        it, less a margin, so the process exits 143 before the kubelet's SIGKILL. ``None``:
        ``$ELASTIC_DEW_GRACE_PERIOD`` (the rendered JobSets set it), else 30.
      max_failed_saves: checkpoint saves abandoned in a row before the run stops with an
        error rather than train on with nothing durable.
      max_uncommitted_seconds: stop the run when saves keep failing and no checkpoint
        committed for this many seconds. ``None`` turns the limit off.
      quarantine_damaged: move a committed checkpoint that cannot be read aside
        (``STEP.damaged``, never deleted) and restore the previous one;
        ``quarantine_damaged=False`` refuses it with the fix instead, for an operator to act.

    Recovery speed:
      precompile_smaller_meshes: in replica-resize mode, compile the training step for
        every mesh of one slice fewer in a background thread once an attempt has started,
        and the snapshot's load and pack on that mesh, so that a lost slice finds them
        already compiled.

    Raises:
        SettingError: a field outside its declaration (its range, its choices), naming the
            field and what it accepts; the config is never built.
    """

    minimum_slice_count: int | None = _setting(None, bound=_Bound(1, none="pause-resume"))
    poll_interval: float | None = _setting(None, bound=_Bound(0, strict=True, unit="seconds", none="automatic"))
    timeout: float | None = _setting(300.0, bound=_Bound(0, strict=True, unit="seconds", none=True))
    max_attempts: int | None = _setting(10, bound=_Bound(1, none=True))
    retry_reset_steps: int = _setting(50, bound=_Bound(0, unit="steps", off=True))
    step_timeout: float | None = _setting(None, bound=_Bound(0, strict=True, unit="seconds", none="automatic"))
    pre_callback: Callable[[], Any] | None = None
    on_elastic_event_callback: Callable[[], Any] | None = None

    model_axis: int | None = _setting(None, bound=_Bound(1, none=True))
    global_batch: int = _setting(32, bound=_Bound(1))
    batch_policy: BatchPolicy = _setting("constant", choices=BATCH_POLICIES)

    snapshot_every: int = _setting(10, bound=_Bound(0, unit="steps", off=True))
    checkpoint_every: int = _setting(100, bound=_Bound(0, unit="steps", off=True))
    checkpoint_dir: str | None = None
    checkpoint_kind: CheckpointKind = _setting("orbax", choices=CHECKPOINT_KINDS)
    max_to_keep: int = _setting(3, bound=_Bound(1))
    mtc_backup_minutes: int = _setting(10, bound=_Bound(1, unit="minutes"))
    mtc_init_timeout: int = _setting(900, bound=_Bound(1, unit="seconds"))

    storage_timeout: float | None = _setting(None, bound=_Bound(0, strict=True, unit="seconds", none="automatic"))
    grace_period: float | None = _setting(None, bound=_Bound(0, strict=True, unit="seconds", none="automatic"))
    max_failed_saves: int = _setting(3, bound=_Bound(1, whole=True))
    max_uncommitted_seconds: float | None = _setting(
        None, bound=_Bound(0, strict=True, unit="seconds", none="no limit")
    )
    quarantine_damaged: bool = True

    precompile_smaller_meshes: bool = True

    def __post_init__(self) -> None:
        _settings.check_fields(self)

    def poll_seconds(self, simulated: bool) -> float:
        """The seconds between health checks: ``poll_interval``, else the default of
        simulated or real slices.

        Args:
            simulated: whether the slices are simulated (CPU).

        Returns:
            Seconds between slice health checks.
        """
        if self.poll_interval is not None:
            return self.poll_interval
        return SIMULATED_POLL_INTERVAL if simulated else PATHWAYS_POLL_INTERVAL

    def checkpoint_dir_for(self, run_dir: str | os.PathLike[str]) -> str:
        """Where the persistent tier writes for a run in ``run_dir``: ``checkpoint_dir``,
        else the workers' :data:`MULTI_TIER_DIR` for ``multi_tier``, else
        ``RUN_DIR/checkpoints`` (absolute).

        Args:
            run_dir: the run's directory.

        Returns:
            The persistent tier's directory or ``gs://`` URL.
        """
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        if self.checkpoint_kind == "multi_tier":
            return MULTI_TIER_DIR
        return str(Path(run_dir).resolve() / CHECKPOINTS_DIR)

    def check_slices(self, total_slices: int) -> None:
        """Refuse a minimum slice count the allocation can never meet (:class:`~elastic_dew.settings.SettingError`);
        the one home of that rule.

        Args:
            total_slices: the slices of the allocation.

        Raises:
            SettingError: ``minimum_slice_count`` is above ``total_slices``.
        """
        if self.minimum_slice_count is not None and self.minimum_slice_count > total_slices:
            raise _settings.SettingError(
                ElasticConfig, "minimum_slice_count", self.minimum_slice_count,
                problem=f"{_settings.mention('minimum_slice_count', self.minimum_slice_count)} is above the "
                f"{total_slices} slices of the allocation; use at most {total_slices}, "
                "or leave it out for pause-resume",
            )
