"""Frozen configuration of the elastic layer, checked once as it is built, before any state is touched.

A setting is declared once, as a field made by :func:`setting`: its default, its help, its
range (:class:`Bound`) or ``choices``, and the flag the command line offers it as. Every
configuration dataclass checks its fields with :func:`check_fields` as it is built and
raises one :class:`SettingError` naming the field, the value and the rule; only the console
words that with the flag (:mod:`elastic_dew.console`).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ElasticConfig",
    "Bound",
    "SettingError",
    "setting",
    "check_fields",
    "BATCH_POLICIES",
    "CHECKPOINT_KINDS",
    "SHARDINGS",
    "MICROBATCH",
    "SIMULATED_POLL_INTERVAL",
    "PATHWAYS_POLL_INTERVAL",
    "MULTI_TIER_DIR",
    "CHECKPOINTS_DIR",
]

#: What the global batch does when slices are lost: ``constant`` keeps it (more examples per
#: surviving device), ``scale_by_active_slices`` scales it with the active slices.
BATCH_POLICIES = ("constant", "scale_by_active_slices")
#: The persistent tier's default directory inside a run directory (``RUN_DIR/checkpoints``);
#: the run directory's layout (:mod:`elastic_dew.rundir`) takes it from here.
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_KINDS = ("orbax", "multi_tier")
#: Seconds between slice health checks when ``poll_interval`` is left out, on simulated
#: (CPU) slices, which come back at once, so polling fast keeps waits short ...
SIMULATED_POLL_INTERVAL = 0.5
#: ... and on real slices (pathwaysutils' own default).
PATHWAYS_POLL_INTERVAL = 10.0
#: The workers' local multi-tier checkpoint directory (the guide's --gke-mtc-ramdisk-dir).
MULTI_TIER_DIR = "/tmp/mtc_checkpoints"

#: The named sharding policies of the training state inside a slice (``elastic.sharding``).
SHARDINGS: tuple[str, ...] = ("replicated", "fsdp")


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range of a numeric setting, declared once and worded for each way it is given.

    ``low`` is the smallest value (``strict``: values must exceed it); ``unit`` names what
    is counted; ``off`` says 0 turns the setting off; ``none`` says ``None`` is allowed
    (and, if text, what it means); ``whole`` says the value must be an ``int`` (not a
    ``bool``).
    """

    low: float
    strict: bool = False
    unit: str = ""
    off: bool = False
    none: bool | str = False
    whole: bool = False

    def holds(self, value: Any) -> bool:
        if value is None:
            return bool(self.none)
        if self.whole and (not isinstance(value, numbers.Integral) or isinstance(value, bool)):
            return False
        return value > self.low if self.strict else value >= self.low

    def refusal(self, value: Any, *, name: str | None = None, flag: str | None = None) -> str:
        """Why ``value`` is refused, as ``name=value ...`` (Python) or ``--flag value ...``.

        A flag's help already says it counts steps, so its wording names only other units.
        """
        rule = f"must be {'>' if self.strict else '>='} {self.low}"
        if flag is not None:  # the command line parses a whole-number flag as an int already
            unit = f" {self.unit}" if self.unit and self.unit != "steps" else ""
            return f"{flag} {value} {rule}{unit}{' (0 turns it off)' if self.off else ''}"
        unit = f" {self.unit}" if self.unit else ""
        if self.whole:
            rule = rule.replace("must be ", "must be a whole number ")
        none = ""
        if self.none:
            none = ", or None" + (f" for {self.none}" if isinstance(self.none, str) else "")
        return f"{name}={value} {rule}{unit}{' (0 turns it off)' if self.off else ''}{none}"


#: What a microbatch may be (examples per data-parallel device per micro-step): a whole
#: number >= 1, or ``None`` for the whole per-device batch at once. One declaration for
#: :class:`~elastic_dew.train_config.TrainConfig`'s field and for the microbatch a
#: protocol ``Program`` brings (:func:`~elastic_dew.elastic.slices.mesh.check_batch_for_every_slice_count`).
MICROBATCH = Bound(1, none=True, whole=True)


def setting(default: Any, help: str = "", *, bound: Bound | None = None, flag: str | None = None,
            metavar: str | None = None, choices: tuple[str, ...] | None = None,
            or_callable: bool = False, factory: Callable[[], Any] | None = None) -> Any:
    """A configuration field with its range or choices and, for settings the command line
    offers, its flag and help: the command line builds its options (and the controller
    command the Kubernetes renderer writes) from these, one declaration each.

    ``or_callable``: besides its ``choices``, the field takes a callable (a policy the
    Python API gives as a function; the command line offers only the named ones). The help
    may name ``{default}``, which the command line fills in. ``factory`` makes each default
    anew (a mapping's), in place of ``default``."""
    metadata = {"help": help, "bound": bound, "flag": flag, "metavar": metavar, "choices": choices,
                "or_callable": or_callable or None}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class SettingError(ValueError):
    """A setting outside what its field declares: which configuration, which field, the value.

    Raised once, by the configuration's own check as it is built (:func:`check_fields`),
    before any state is touched. ``str()`` is the Python wording (``invalid ElasticConfig:
    snapshot_every=-1 must be >= 0 steps (0 turns it off)``); :meth:`wording` with a flag is
    the command line's (``--snapshot-every -1 must be >= 0 (0 turns it off)``), which only
    the console asks for.
    """

    def __init__(self, owner: type, field: str, value: Any, bound: Bound | None = None,
                 *, choices: tuple[Any, ...] | None = None, problem: str | None = None) -> None:
        self.owner, self.field, self.value, self.bound, self.choices = owner, field, value, bound, choices
        self.problem = problem
        super().__init__(problem if problem is not None else f"invalid {owner.__name__}: {self.wording()}")

    def wording(self, flag: str | None = None) -> str:
        """The refusal worded for Python (``name=value ...``) or for ``flag`` (``--flag value ...``).

        A refusal that is not a range or a choice (``problem``: a batch some slice count
        cannot divide, say) keeps its own text, after the flag."""
        if self.problem is not None:
            return self.problem if flag is None else f"{flag}: {self.problem}"
        if self.bound is not None:
            return self.bound.refusal(self.value, name=self.field, flag=flag)
        allowed = ", ".join(map(str, self.choices or ()))
        if dataclasses.is_dataclass(self.owner) and any(
            f.name == self.field and f.metadata.get("or_callable") for f in dataclasses.fields(self.owner)
        ):
            allowed += ", or a callable"
        if flag is not None:
            return f"{flag} {self.value} must be one of {allowed}"
        return f"{self.field}={self.value!r} must be one of {allowed}"


def check_fields(config: Any) -> None:
    """Check every field of a configuration dataclass against its declared ``bound`` and
    ``choices``; raises :class:`SettingError` for the first one outside them. ``None`` is
    accepted where the bound allows it or the field's default is ``None`` (not given)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        bound, choices = field.metadata.get("bound"), field.metadata.get("choices")
        if value is None and (field.default is None or (bound is not None and bound.none)):
            continue
        if bound is not None and not bound.holds(value):
            raise SettingError(type(config), field.name, value, bound)
        if choices is not None and value not in choices and not (
            field.metadata.get("or_callable") and callable(value)
        ):
            raise SettingError(type(config), field.name, value, choices=choices)


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """How a training run survives slice loss, scale-up and preemption.

    Args:
      (each field, by what it sets)

    Recovery (pathwaysutils' ``elastic_retry``):
      minimum_slice_count: ``None`` is the guide's pause-resume mode (wait until every
        slice is healthy again); a smaller number is replica-resize (carry on with at
        least that many slices and scale back up when the others return).
      poll_interval: seconds between slice health checks; ``None`` is
        :data:`SIMULATED_POLL_INTERVAL` on simulated (CPU) slices and pathwaysutils' 10
        (:data:`PATHWAYS_POLL_INTERVAL`) on real ones (:meth:`poll_seconds`).
      timeout: seconds to wait for ``minimum_slice_count`` healthy slices before
        ``TimeoutError``; 300 (the guide's) so that a wait for a slice that never returns
        ends; ``None`` waits for ever.
      max_attempts: ``ElasticRetryLimit(max_attempts)`` over slice-loss attempts only;
        scale-ups never count against it. 10 (the guide's); ``None`` retries for ever.
      retry_reset_steps: the count of slice losses starts again once the run has got
        this many steps past the furthest step it had completed at the first loss
        counted, so the run gives up after ``max_attempts`` losses within that much
        progress (a crash loop still ends after ``max_attempts``) rather than after
        ``max_attempts`` over its whole life; 0 counts over the whole run, as
        pathwaysutils' ``ElasticRetryLimit`` does (:class:`~elastic_dew.elastic.slices.retry.SliceLossRetryLimit`).
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
      checkpoint_dir: a local directory or ``gs://`` path for tier 2; ``None`` is the
        default (:meth:`checkpoint_dir_for`: ``RUN_DIR/checkpoints``, or
        :data:`MULTI_TIER_DIR` for ``multi_tier``) where a run directory is known, and no
        tier 2 for an :class:`~elastic_dew.elastic.loop.protocol.ElasticRun` built alone.
      checkpoint_kind: ``orbax`` (a ``CheckpointManager``) or ``multi_tier`` (the
        guide's ``ReplicatorCheckpointManager`` with colocated Python: a Pathways backend,
        or the simulator with its replicator stand-in).
      max_to_keep: persistent checkpoints kept.
      mtc_backup_minutes: ``multi_tier`` only: the replicator's backup cadence to the
        bucket (``backup_interval_minutes``; the guide's 10).
      mtc_init_timeout: ``multi_tier`` only: seconds one initialisation of multi-tier
        checkpointing may wait for the replicator (Orbax's
        ``jax_initialization_timeout_seconds``, 900); initialisation runs at start, on every
        attempt and at every scale-up.

    Recovery speed:
      precompile_smaller_meshes: in replica-resize mode, compile the training step for
        every mesh of one slice fewer in a background thread once an attempt has started,
        and the snapshot's load and pack on that mesh, so that a lost slice finds them
        already compiled.

    Raises:
        SettingError: a field outside its declaration (its range, its choices), naming the
            field and what it accepts; the config is never built.
    """

    minimum_slice_count: int | None = setting(
        None,
        "replica-resize: carry on with at least K slices after a loss "
        "(default: pause-resume, wait for every slice)",
        bound=Bound(1, none="pause-resume"), flag="--min-slices", metavar="K",
    )
    poll_interval: float | None = setting(
        None,
        f"seconds between slice health checks (default {SIMULATED_POLL_INTERVAL:g} on simulated slices, "
        f"pathwaysutils' {PATHWAYS_POLL_INTERVAL:g} on real ones)",
        bound=Bound(0, strict=True, unit="seconds", none="automatic"), flag="--poll-interval", metavar="SECONDS",
    )
    timeout: float | None = setting(
        300.0, "seconds to wait for healthy slices before giving up (default {default})",
        bound=Bound(0, strict=True, unit="seconds", none=True), flag="--timeout", metavar="SECONDS",
    )
    max_attempts: int | None = setting(
        10, "slice losses within --retry-reset-steps steps of progress survived before giving up (default {default})",
        bound=Bound(1, none=True), flag="--max-attempts", metavar="N",
    )
    retry_reset_steps: int = setting(
        50, "steps of progress after which the count of slice losses starts again; 0 counts "
        "them over the whole run, as pathwaysutils' ElasticRetryLimit does (default {default})",
        bound=Bound(0, unit="steps", off=True), flag="--retry-reset-steps", metavar="STEPS",
    )
    step_timeout: float | None = setting(
        None, "seconds a step may take before it counts as a slice loss (DEADLINE_EXCEEDED) "
        "(default: 20 times the median step, at least 60 s, or 600 s when the run waits for every slice; "
        "600 s before 5 steps are timed)",
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
    batch_policy: Literal["constant", "scale_by_active_slices"] = setting("constant", choices=BATCH_POLICIES)

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
        f"where the persistent tier writes (default RUN_DIR/{CHECKPOINTS_DIR}; for multi_tier the "
        f"workers' local directory, default {MULTI_TIER_DIR})",
        flag="--checkpoint-dir", metavar="DIR",
    )
    checkpoint_kind: Literal["orbax", "multi_tier"] = setting(
        "orbax",
        "persistent tier: orbax (a CheckpointManager in the run directory) or multi_tier "
        "(the guide's ReplicatorCheckpointManager over colocated-Python sidecars; simulated "
        "with a stand-in for GKE's replicator in RUN_DIR/replicator)",
        flag="--checkpoint-kind", choices=CHECKPOINT_KINDS,
    )
    max_to_keep: int = setting(3, bound=Bound(1))
    mtc_backup_minutes: int = setting(
        10, "multi_tier: minutes between the replicator's backups of the local checkpoints to "
        "the bucket (default {default}, the guide's)",
        bound=Bound(1, unit="minutes"), flag="--mtc-backup-minutes", metavar="MINUTES",
    )
    mtc_init_timeout: int = setting(
        900, "multi_tier: seconds one initialisation (at start, every attempt and scale-up) may wait "
        "for the replicator before the run fails (default {default}, Orbax's)",
        bound=Bound(1, unit="seconds"), flag="--mtc-init-timeout", metavar="SECONDS",
    )

    precompile_smaller_meshes: bool = True

    def __post_init__(self) -> None:
        check_fields(self)

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
        """Refuse a minimum slice count the allocation can never meet (:class:`SettingError`);
        the one home of that rule.

        Args:
            total_slices: the slices of the allocation.

        Raises:
            SettingError: ``minimum_slice_count`` is above ``total_slices``.
        """
        if self.minimum_slice_count is not None and self.minimum_slice_count > total_slices:
            raise SettingError(
                ElasticConfig, "minimum_slice_count", self.minimum_slice_count,
                problem=f"minimum_slice_count={self.minimum_slice_count} is above the "
                f"{total_slices} slices of the allocation; use at most {total_slices}, "
                "or leave it out (None) for pause-resume",
            )
