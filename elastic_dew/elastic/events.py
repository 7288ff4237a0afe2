"""The run's events, typed: one frozen dataclass per kind, with a JSON round trip.

Every event the protocol, the trainer and the simulator produce is one of these; the run
record (``events.jsonl``) stores ``event.to_json()`` one per line and readers get them back
with :func:`from_json`. The JSON keys are a contract other tools read (``docs/trainer.md``),
so the field names here are the keys, and ``to_json`` adds ``"event": KIND``.

=========  ==============================================================================
kind       fields
=========  ==============================================================================
start      ``process_start`` (the process's own start, epoch seconds), ``pid``
step       ``step``, ``slices`` (active), ``loss``, ``examples`` ``[begin, end)``,
           ``seconds`` (the step, host to result), ``data_seconds`` (waiting for the batch),
           ``metrics`` (the loss function's own metrics, averaged over the step; left out
           of the line when there are none)
eval       ``step`` (the training step evaluated), ``slices``, ``metrics`` (``loss`` and the
           loss function's metrics, averaged over the evaluation set), ``batches``,
           ``examples_evaluated``, ``seconds`` (the pass, dispatch to read)
save       ``tier`` (``snapshot``/``checkpoint``), ``step``, ``taken``, ``seconds``
stop       ``reason`` (:data:`STOP_REASONS`), ``step`` (the last completed step)
resume     ``source`` (:data:`RESUME_SOURCES`), ``step`` (the first step run next),
           ``durations`` (seconds under :data:`DURATION_KEYS`)
storage    ``operation`` (``save``, ``commit``, ``restore``), ``outcome`` (``abandoned``: a
           save that failed or had no storage activity for the storage timeout, never restored;
           ``skipped``: a checkpoint not taken, because the commit before it was still in
           flight or the grace window left was shorter than the commits measured;
           ``quarantined``: a damaged committed step moved aside), ``step``, ``storage``
           (the directory or ``gs://`` path), ``waited`` (seconds from the save's start to
           the decision; for a skip, how long the commit in flight had run), ``error``
           (what failed, or why it was skipped), ``moved_to`` (where a quarantined step
           went, else ``null``)
commit     ``step``, ``storage``, ``seconds`` (from the save's start to its commit),
           ``retries`` (retries the storage clients saw meanwhile), ``nbytes`` (bytes they
           moved meanwhile): a checkpoint committed
fault      ``action``, ``slice``, ``step``, ``phase``, ``scheduled`` (the schedule token),
           ``index`` (its place in the schedule), ``pid`` (the process that fired it)
=========  ==============================================================================

Every event has ``wall``: when it happened, in seconds since the epoch. Keys a reader does
not know are kept in ``extra`` and written back, so a record written by a newer version
survives a round trip through an older one.

The loop tells each event on its one channel (:func:`elastic_dew.elastic.hooks.emit`), where
the simulator tells each fault it fires too. A :data:`Sink` is anything that takes the run's
events one at a time, in order: a run's own sink hears the channel while it runs
(:class:`~elastic_dew.observe.sinks.Sinks` feeds one list of them: the run record, the
progress display, TensorBoard, the goodput export); :func:`describe` is the one human
wording of an event that every display uses.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

__all__ = [
    "STOP_REASONS",
    "RESUME_SOURCES",
    "DURATION_KEYS",
    "Event",
    "Start",
    "Step",
    "Save",
    "Stop",
    "Resume",
    "Fault",
    "Eval",
    "Storage",
    "Commit",
    "STORAGE_OUTCOMES",
    "KINDS",
    "Sink",
    "describe",
    "from_json",
    "to_json",
]

#: Why an attempt stops (a ``stop`` event's ``reason``).
STOP_REASONS = ("preempted", "slice_lost", "scale_up", "done")
#: Where an attempt's state comes from (a ``resume`` event's ``source``).
RESUME_SOURCES = ("live", "snapshot", "checkpoint", "fresh")
#: The phases of a recovery a ``resume`` event times (its ``durations``' keys), in order.
DURATION_KEYS = ("detection", "wait_for_slices", "mesh_and_compile", "restore")
#: What became of a step the storage failed (a ``storage`` event's ``outcome``).
STORAGE_OUTCOMES = ("abandoned", "skipped", "quarantined")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """What every event carries: when it happened, and keys this version does not know.

    Args:
        wall: when it happened (seconds since the epoch; now by default).
        extra: keys of its line this version does not know, kept for the round trip.
    """

    kind: ClassVar[str] = ""
    wall: float = dataclasses.field(default_factory=time.time)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """The event as its run-record line: ``{"event": kind, **fields}``.

        Returns:
            The line's JSON mapping.
        """
        out: dict[str, Any] = {"event": self.kind}
        for field in dataclasses.fields(self):
            if field.name == "extra":
                continue
            value = getattr(self, field.name)
            out[field.name] = dict(value) if isinstance(value, Mapping) else (
                list(value) if isinstance(value, tuple) else value
            )
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Start(Event):
    """A process began (or resumed) the run.

    Args:
        process_start: when the process started (seconds since the epoch).
        pid: the process id.
    """

    kind: ClassVar[str] = "start"
    process_start: float
    pid: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step(Event):
    """A training step whose result has been read.

    Args:
        step: the step.
        slices: the active slices it ran on.
        loss: its loss.
        examples: the ``[start, end)`` global example indices it consumed.
        seconds: its time, its batch's wait included.
        data_seconds: the time it waited for its batch.
        metrics: the loss function's metrics, averaged over the step.
    """

    kind: ClassVar[str] = "step"
    step: int
    slices: int
    loss: float
    examples: tuple[int, int]
    seconds: float
    data_seconds: float = 0.0
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Save(Event):
    """A tier was asked to save a step (``taken``: whether it did, or skipped it).

    Args:
        tier: ``snapshot`` or ``checkpoint``.
        step: the step saved.
        taken: whether the tier took it (``False``: skipped, the previous save still busy).
        seconds: what the save cost the loop.
    """

    kind: ClassVar[str] = "save"
    tier: str
    step: int
    taken: bool
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stop(Event):
    """Why an attempt stopped, after which completed step.

    Args:
        reason: why (:data:`STOP_REASONS`).
        step: the last completed step.

    Raises:
        ValueError: ``reason`` is not one of :data:`STOP_REASONS`.
    """

    kind: ClassVar[str] = "stop"
    reason: str
    step: int

    def __post_init__(self) -> None:
        if self.reason not in STOP_REASONS:
            raise ValueError(f"stop reason {self.reason!r} is not one of {STOP_REASONS}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resume(Event):
    """Where an attempt's state came from, and the first step it runs.

    Args:
        source: where the state came from (:data:`RESUME_SOURCES`).
        step: the first step it runs.
        durations: seconds by recovery phase (:data:`DURATION_KEYS`).

    Raises:
        ValueError: ``source`` is not one of :data:`RESUME_SOURCES`.
    """

    kind: ClassVar[str] = "resume"
    source: str
    step: int
    durations: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source not in RESUME_SOURCES:
            raise ValueError(f"resume source {self.source!r} is not one of {RESUME_SOURCES}")
        given = self.durations or {}
        object.__setattr__(
            self, "durations", {k: round(float(given.get(k, 0.0) or 0.0), 6) for k in DURATION_KEYS}
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fault(Event):
    """A fault the simulator fired (``slice`` is ``None`` for process-wide faults).

    One type wherever a fired fault is: in the run's event stream as it fires, and on its
    durable line in the run directory's fault log (:class:`~elastic_dew.rundir.FaultLog`,
    the same :meth:`to_json`). ``index`` is its place in the schedule and ``pid`` the
    process that fired it (``None`` on a line that does not say).

    Args:
        action: the fault's action (``lose``, ``restore``, ``hang``, ``error``, ``preempt``,
            ``kill``).
        slice: its slice, or ``None``.
        step: the step it fired at (-1: before any step).
        phase: the phase it fired at.
        scheduled: its schedule token (``lose:1@5/step``).
        index: its place in the schedule, or ``None``.
        pid: the process that fired it, or ``None``.
    """

    kind: ClassVar[str] = "fault"
    action: str
    slice: int | None
    step: int
    phase: str
    scheduled: str
    index: int | None = None
    pid: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Eval(Event):
    """An evaluation pass over the evaluation set, run on the state after ``step``.

    A pass cut short by a fault is never emitted; it runs again once the protocol has
    resumed and reached ``step`` again, so each evaluated step has one eval line that the
    commit rule keeps (the same rule as step lines).

    Args:
        step: the step whose state was evaluated.
        slices: the active slices it ran on.
        metrics: ``loss`` and the loss function's metrics, means over the batches.
        batches: the batches evaluated.
        examples_evaluated: the examples evaluated.
        seconds: its time.
    """

    kind: ClassVar[str] = "eval"
    step: int
    slices: int
    metrics: Mapping[str, float]
    batches: int
    examples_evaluated: int
    seconds: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Storage(Event):
    """The persistent tier's storage failed a step: a save abandoned (failed, or no storage activity
    for the storage timeout; the loop's time held by it is in the ``save`` events' seconds),
    a checkpoint skipped (the commit before it still in flight, or too little of the grace
    window left for the commit times measured), or a damaged committed step quarantined.

    Args:
        operation: ``save``, ``commit`` or ``restore``.
        outcome: one of :data:`STORAGE_OUTCOMES`.
        step: the step.
        storage: the directory or ``gs://`` path.
        waited: seconds from the save's start to the decision.
        error: what failed.
        moved_to: where a quarantined step went.

    Raises:
        ValueError: ``outcome`` is not one of :data:`STORAGE_OUTCOMES`.
    """

    kind: ClassVar[str] = "storage"
    operation: str
    outcome: str
    step: int
    storage: str
    waited: float
    error: str
    moved_to: str | None = None

    def __post_init__(self) -> None:
        if self.outcome not in STORAGE_OUTCOMES:
            raise ValueError(f"storage outcome {self.outcome!r} is not one of {STORAGE_OUTCOMES}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Commit(Event):
    """A checkpoint committed: how long it took and what the storage clients did meanwhile,
    which tells a slow bucket (long, many retries, bytes moving) from a stuck one.

    Args:
        step: the step committed.
        storage: the directory or ``gs://`` path.
        seconds: from the save's start to its commit.
        retries: retries the storage clients saw meanwhile (process-wide).
        nbytes: bytes the storage clients moved meanwhile (process-wide).
    """

    kind: ClassVar[str] = "commit"
    step: int
    storage: str
    seconds: float
    retries: int = 0
    nbytes: int = 0


#: Each event kind (a line's ``"event"``) and its type.
KINDS: dict[str, type[Event]] = {
    cls.kind: cls for cls in (Start, Step, Save, Stop, Resume, Fault, Eval, Storage, Commit)
}


#: What takes the run's typed events, one at a time and in order.
Sink = Callable[[Event], None]


def describe(event: Event) -> str:
    """A short human description of an event, the wording every display shows.

    Args:
        event: a typed event.

    Returns:
        Its description (``stop slice_lost after step 10``).
    """
    if isinstance(event, Stop):
        return f"stop {event.reason} after step {event.step}"
    if isinstance(event, Resume):
        return f"resume from {event.source} at step {event.step}"
    if isinstance(event, Save):
        return f"{event.tier} of step {event.step}"
    if isinstance(event, Fault):
        where = f" slice {event.slice}" if event.slice is not None else ""
        return f"fault {event.action}{where} at step {event.step} ({event.phase})"
    if isinstance(event, Start):
        return f"process {event.pid} started"
    if isinstance(event, Step):
        return f"step {event.step} loss {event.loss:.4f} on {event.slices} slices"
    if isinstance(event, Storage):
        if event.outcome == "quarantined":
            return f"checkpoint {event.step} damaged: moved aside to {event.moved_to}"
        if event.outcome == "skipped":
            return f"checkpoint of step {event.step} skipped: {event.error}"
        return f"checkpoint {event.operation} of step {event.step} abandoned after {event.waited:.1f} s"
    if isinstance(event, Commit):
        return (f"checkpoint {event.step} committed in {event.seconds:.1f} s "
                f"({event.retries} retries, {event.nbytes / 1e6:.1f} MB)")
    if isinstance(event, Eval):
        values = " ".join(f"{name} {value:.4g}" for name, value in event.metrics.items())
        return f"eval after step {event.step}: {values}"
    return event.kind


def from_json(line: Mapping[str, Any]) -> Event:
    """The typed event of one run-record line.

    Args:
        line: the line's JSON mapping.

    Returns:
        The typed event.

    Raises:
        ValueError: an unknown kind, or a line missing a field, naming what is wrong.
    """
    kind = line.get("event")
    cls = KINDS.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}; known kinds are {sorted(KINDS)}")
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    values = {k: v for k, v in line.items() if k in names}
    extra = {k: v for k, v in line.items() if k not in names and k != "event"}
    if "examples" in values and values["examples"] is not None:
        values["examples"] = tuple(int(x) for x in values["examples"])
    try:
        return cls(**values, extra=extra)
    except TypeError as error:
        raise ValueError(f"{kind} event {dict(line)!r} is missing fields: {error}") from None


def to_json(event: Event | Mapping[str, Any]) -> dict[str, Any]:
    """A run-record line from a typed event (or an already-JSON mapping, copied).

    Args:
        event: a typed event, or a JSON mapping.

    Returns:
        The line's JSON mapping (a new dict).
    """
    return event.to_json() if isinstance(event, Event) else dict(event)
