"""Frozen configuration of the elastic layer, checked before any state is touched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

__all__ = ["ElasticConfig", "Bound", "setting", "BATCH_POLICIES", "CHECKPOINT_KINDS", "SHARDINGS"]

BATCH_POLICIES = ("constant", "scale_by_active_slices")
CHECKPOINT_KINDS = ("orbax", "multi_tier")
#: The named sharding policies of the training state inside a slice (``elastic.sharding``).
SHARDINGS: tuple[str, ...] = ("replicated", "fsdp")


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range of a numeric setting, declared once and worded for each way it is given.

    ``low`` is the smallest value (``strict``: values must exceed it); ``unit`` names what
    is counted; ``off`` says 0 turns the setting off; ``none`` says ``None`` is allowed
    (and, if text, what it means).
    """

    low: float
    strict: bool = False
    unit: str = ""
    off: bool = False
    none: bool | str = False

    def holds(self, value: Any) -> bool:
        if value is None:
            return bool(self.none)
        return value > self.low if self.strict else value >= self.low

    def refusal(self, value: Any, *, name: str | None = None, flag: str | None = None) -> str:
        """Why ``value`` is refused, as ``name=value ...`` (Python) or ``--flag value ...``.

        A flag's help already says it counts steps, so its wording names only other units.
        """
        rule = f"must be {'>' if self.strict else '>='} {self.low}"
        if flag is not None:
            unit = f" {self.unit}" if self.unit and self.unit != "steps" else ""
            return f"{flag} {value} {rule}{unit}{' (0 turns it off)' if self.off else ''}"
        unit = f" {self.unit}" if self.unit else ""
        none = ""
        if self.none:
            none = ", or None" + (f" for {self.none}" if isinstance(self.none, str) else "")
        return f"{name}={value} {rule}{unit}{' (0 turns it off)' if self.off else ''}{none}"


def setting(default: Any, help: str = "", *, bound: Bound | None = None, flag: str | None = None,
            metavar: str | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A configuration field with its range and, for settings the command line offers, its
    flag and help: the command line builds its options from these (one declaration each).

    The help may name ``{default}`` and the run's own defaults (``{simulated_poll}``,
    ``{multi_tier_dir}``), which the command line fills in."""
    metadata = {"help": help, "bound": bound, "flag": flag, "metavar": metavar, "choices": choices}
    return dataclasses.field(default=default, metadata={k: v for k, v in metadata.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """How a training run survives slice loss, scale-up and preemption.

    Recovery (pathwaysutils' ``elastic_retry``):
      minimum_slice_count: ``None`` is the guide's pause-resume mode (wait until every
        slice is healthy again); a smaller number is replica-resize (carry on with at
        least that many slices and scale back up when the others return).
      poll_interval: seconds between slice health checks (pathwaysutils' default is 10).
      timeout: seconds to wait for ``minimum_slice_count`` healthy slices before
        ``TimeoutError``; 300 (the guide's) so that a wait for a slice that never returns
        ends; ``None`` waits for ever.
      max_attempts: ``ElasticRetryLimit(max_attempts)`` over slice-loss attempts only;
        scale-ups never count against it. 10 (the guide's); ``None`` retries for ever.
      step_timeout: seconds a step's result may take to arrive before the step counts as
        a slice loss (``DEADLINE_EXCEEDED``) and the run recovers instead of hanging on a
        slice that stopped answering; ``None`` is automatic
        (:class:`~elastic_dew.elastic.deadline.StepDeadline`).
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

    minimum_slice_count: int | None = setting(
        None,
        "replica-resize: carry on with at least K slices after a loss "
        "(default: pause-resume, wait for every slice)",
        bound=Bound(1, none="pause-resume"), flag="--min-slices", metavar="K",
    )
    poll_interval: float = setting(
        10.0,
        "seconds between slice health checks (default {simulated_poll} simulated, pathwaysutils' 10 on real slices)",
        bound=Bound(0, strict=True, unit="seconds"), flag="--poll-interval", metavar="SECONDS",
    )
    timeout: float | None = setting(
        300.0, "seconds to wait for healthy slices before giving up (default {default})",
        bound=Bound(0, strict=True, unit="seconds", none=True), flag="--timeout", metavar="SECONDS",
    )
    max_attempts: int | None = setting(
        10, "slice losses survived before giving up (default {default})",
        bound=Bound(1, none=True), flag="--max-attempts", metavar="N",
    )
    step_timeout: float | None = setting(
        None, "seconds a step may take before it counts as a slice loss (DEADLINE_EXCEEDED) "
        "(default: 20 times the median step, at least 60 s; 600 s before 5 steps are timed)",
        bound=Bound(0, strict=True, unit="seconds", none="automatic"), flag="--step-timeout", metavar="SECONDS",
    )
    pre_callback: Callable[[], Any] | None = None
    on_elastic_event_callback: Callable[[], Any] | None = None

    model_axis: int | None = setting(
        None,
        "devices of the model (tensor-parallel) axis inside a slice; the rest of a slice's "
        "devices form the data axis (default 1)",
        bound=Bound(1, none=True), flag="--model-axis", metavar="N",
    )
    global_batch: int = setting(
        32, "examples per step (default: the recipe's)", bound=Bound(1), flag="--global-batch", metavar="B"
    )
    batch_policy: Literal["constant", "scale_by_active_slices"] = "constant"

    snapshot_every: int = setting(
        10, "steps between in-memory snapshots; 0 turns them off (default {default})",
        bound=Bound(0, unit="steps", off=True), flag="--snapshot-every", metavar="K",
    )
    checkpoint_every: int = setting(
        100, "steps between persistent checkpoints; 0 keeps only preemption checkpoints (default {default})",
        bound=Bound(0, unit="steps", off=True), flag="--checkpoint-every", metavar="M",
    )
    checkpoint_dir: str | None = setting(
        None,
        "where the persistent tier writes (default RUN_DIR/checkpoints; for multi_tier the "
        "workers' local directory, default {multi_tier_dir})",
        flag="--checkpoint-dir", metavar="DIR",
    )
    checkpoint_kind: Literal["orbax", "multi_tier"] = setting(
        "orbax",
        "persistent tier: orbax (a CheckpointManager in the run directory) or multi_tier "
        "(the guide's ReplicatorCheckpointManager over colocated-Python sidecars; TPU only)",
        flag="--checkpoint-kind", choices=CHECKPOINT_KINDS,
    )
    max_to_keep: int = setting(3, bound=Bound(1))

    precompile_smaller_meshes: bool = True

    def __post_init__(self) -> None:
        problems = [
            field.metadata["bound"].refusal(getattr(self, field.name), name=field.name)
            for field in dataclasses.fields(self)
            if "bound" in field.metadata and not field.metadata["bound"].holds(getattr(self, field.name))
        ]
        if self.batch_policy not in BATCH_POLICIES:
            problems.append(
                f"batch_policy={self.batch_policy!r} must be one of {', '.join(BATCH_POLICIES)}"
            )
        if self.checkpoint_kind not in CHECKPOINT_KINDS:
            problems.append(
                f"checkpoint_kind={self.checkpoint_kind!r} must be one of "
                f"{', '.join(CHECKPOINT_KINDS)}"
            )
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
