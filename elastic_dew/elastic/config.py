"""Frozen configuration of the elastic layer, checked before any state is touched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["ElasticConfig", "BATCH_POLICIES", "CHECKPOINT_KINDS"]

BATCH_POLICIES = ("constant", "scale_by_active_slices")
CHECKPOINT_KINDS = ("orbax", "multi_tier")


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """How a training run survives slice loss, scale-up and preemption.

    Recovery (pathwaysutils' ``elastic_retry``):
      minimum_slice_count: ``None`` is the guide's pause-resume mode (wait until every
        slice is healthy again); a smaller number is replica-resize (carry on with at
        least that many slices and scale back up when the others return).
      poll_interval: seconds between slice health checks (pathwaysutils' default is 10).
      timeout: seconds to wait for ``minimum_slice_count`` healthy slices before
        ``TimeoutError``; ``None`` waits for ever.
      max_attempts: ``ElasticRetryLimit(max_attempts)`` over slice-loss attempts only;
        scale-ups never count against it. ``None`` retries for ever.
      pre_callback / on_elastic_event_callback: passed through to ``elastic_retry``.

    Mesh and batch:
      model_axis: devices along the ``model`` axis inside a slice; the rest of a slice's
        devices form the ``data`` axis. ``None`` means 1 (pure data parallelism).
      global_batch: examples per step with every slice active.
      batch_policy: ``constant`` keeps the global batch (each slice takes more when
        slices are lost); ``scale_by_active_slices`` scales it with the active slices.

    State:
      snapshot_every: steps between in-memory snapshots (tier 1); 0 turns them off.
      checkpoint_every: steps between persistent checkpoints (tier 2); 0 keeps only the
        checkpoints written at preemption stops.
      checkpoint_dir: a local directory or ``gs://`` path for tier 2; ``None`` disables it.
      checkpoint_kind: ``orbax`` (a ``CheckpointManager``) or ``multi_tier`` (the
        guide's ``ReplicatorCheckpointManager`` with colocated Python; TPU only).
      max_to_keep: persistent checkpoints kept.

    Recovery speed:
      precompile_smaller_meshes: in replica-resize mode, compile the training step for
        every mesh of one slice fewer in a background thread once an attempt has started,
        so that a lost slice finds its step already compiled.
    """

    minimum_slice_count: int | None = None
    poll_interval: float = 10.0
    timeout: float | None = None
    max_attempts: int | None = None
    pre_callback: Callable[[], Any] | None = None
    on_elastic_event_callback: Callable[[], Any] | None = None

    model_axis: int | None = None
    global_batch: int = 32
    batch_policy: Literal["constant", "scale_by_active_slices"] = "constant"

    snapshot_every: int = 10
    checkpoint_every: int = 100
    checkpoint_dir: str | None = None
    checkpoint_kind: Literal["orbax", "multi_tier"] = "orbax"
    max_to_keep: int = 3

    precompile_smaller_meshes: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.minimum_slice_count is not None and self.minimum_slice_count < 1:
            problems.append(
                f"minimum_slice_count={self.minimum_slice_count} must be >= 1, "
                "or None for pause-resume"
            )
        if not self.poll_interval > 0:
            problems.append(f"poll_interval={self.poll_interval} must be > 0 seconds")
        if self.timeout is not None and not self.timeout > 0:
            problems.append(f"timeout={self.timeout} must be > 0 seconds, or None")
        if self.max_attempts is not None and self.max_attempts < 1:
            problems.append(f"max_attempts={self.max_attempts} must be >= 1, or None")
        if self.model_axis is not None and self.model_axis < 1:
            problems.append(f"model_axis={self.model_axis} must be >= 1, or None")
        if self.global_batch < 1:
            problems.append(f"global_batch={self.global_batch} must be >= 1")
        if self.batch_policy not in BATCH_POLICIES:
            problems.append(
                f"batch_policy={self.batch_policy!r} must be one of {', '.join(BATCH_POLICIES)}"
            )
        for name in ("snapshot_every", "checkpoint_every"):
            value = getattr(self, name)
            if value < 0:
                problems.append(f"{name}={value} must be >= 0 steps (0 turns it off)")
        if self.checkpoint_kind not in CHECKPOINT_KINDS:
            problems.append(
                f"checkpoint_kind={self.checkpoint_kind!r} must be one of "
                f"{', '.join(CHECKPOINT_KINDS)}"
            )
        if self.max_to_keep < 1:
            problems.append(f"max_to_keep={self.max_to_keep} must be >= 1")
        if problems:
            raise ValueError("invalid ElasticConfig: " + "; ".join(problems))

    def check_slices(self, total_slices: int) -> None:
        """Refuse a minimum slice count the allocation can never meet."""
        if self.minimum_slice_count is not None and self.minimum_slice_count > total_slices:
            raise ValueError(
                f"minimum_slice_count={self.minimum_slice_count} is above the "
                f"{total_slices} slices of the allocation; use at most {total_slices}, "
                "or None for pause-resume"
            )
