"""A simulated run's records, read and indexed for the diagnosis's costs and rules.

Two things only: the faults that fired (the fault log's records, each ``scheduled``,
``action``, ``slice``, ``phase``, ``step``, ``pid``, ``wall``) and what the program's processes
did (:class:`elastic_dew.simulate.watch.Watch`'s records, in the order they happened). No
JAX: the diagnosis runs after the program's processes have ended.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["FAULT_FIELDS", "Records", "announced_records", "fault_record"]

#: The faults that take a slice down.
_DOWN = ("lose", "hang", "suspend")


class Records:
    """The records of a run, indexed for the costs and the rules.

    Args:
        faults: the fired faults' records.
        events: the watch's records of every process, in order.
    """

    def __init__(self, faults: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> None:
        self.faults = sorted(faults, key=lambda f: f["wall"])
        self.events = _counted(events)
        self.pids: list[int] = []
        for record in [*self.events, *self.faults]:
            pid = record.get("pid")
            if pid is not None and pid not in self.pids:
                self.pids.append(pid)
        self.steps = self.of("step")
        self.resumes = self.of("resume")
        self.attempts = self.of("attempt")
        self.saves = [e for e in self.of("save") if not e.get("skipped")]

    def up_until(self, slice_index: int, wall: float) -> float | None:
        """Until when slice ``slice_index``, back at ``wall``, stayed up: the wall time of the
        next fault that took it down again (``inf``: never); ``None`` when it was down at
        ``wall`` (the last fault on it before then stopped it)."""
        on = [f for f in self.faults if f.get("slice") == slice_index]
        before = [f for f in on if f["wall"] <= wall]
        if before and before[-1]["action"] in _DOWN:
            return None
        return next((f["wall"] for f in on if f["wall"] > wall and f["action"] in _DOWN), float("inf"))

    def of(self, kind: str) -> list[Mapping[str, Any]]:
        return [e for e in self.events if e["e"] == kind]

    def process(self, pid: int | None) -> int:
        return self.pids.index(pid) + 1 if pid in self.pids else 0

    def position_at(self, wall: float, pid: int | None = None) -> int:
        before = [s for s in self.steps if s["w"] <= wall and (pid is None or s["pid"] == pid)]
        return before[-1]["p"] if before else 0

    def attempt_at(self, wall: float, pid: int) -> int:
        before = [a for a in self.attempts if a["w"] <= wall and a["pid"] == pid]
        return before[-1]["n"] if before else 0

    def next_resume(self, wall: float) -> Mapping[str, Any] | None:
        return next((r for r in self.resumes if r["w"] > wall), None)


def _counted(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``events`` less the ``step`` and ``resume`` records a later ``superseded`` record of
    their process says were no steps (the simulator's count started again at a program that
    carries more state: a data generator's dispatches had been counted first)."""
    last = {e["pid"]: i for i, e in enumerate(events) if e["e"] == "superseded"}
    return [e for i, e in enumerate(events)
            if not (e["e"] in ("step", "resume") and i < last.get(e["pid"], -1))]


#: The announced restore phases and the tier each loads from.
_RESTORES = {"snapshot_load": "snapshot", "checkpoint_restore": "checkpoint"}


def announced_records(phase: str, step: int, first: bool, restored: tuple[str, int] | None,
                      emit: Callable[..., object]) -> tuple[str, int] | None:
    """Record elastic_dew's loop's announcement ``phase`` of ``step`` as the watch's records
    (the in-process watch's and the proxy backend's alike): ``resume`` before an attempt's
    first ``step``, ``save``, ``scaled_up`` (returned slices join in place) and ``restore``,
    each through ``emit(event, **fields)``.

    Args:
        phase: the announced phase.
        step: its step.
        first: whether it is the attempt's first ``step`` (the caller records ``landed`` before).
        restored: the tier and step of a restore announced since the attempt's last step, or ``None``.
        emit: writes one record.

    Returns:
        The restore announced since the attempt's last step, after this announcement.
    """
    if phase == "step":
        if first:
            origin, saved = restored or (("live", step - 1) if step > 1 else ("nothing", None))
            emit("resume", origin=origin, step=saved, p=saved or 0)
            restored = None
        emit("step", p=step)
    elif phase in ("snapshot", "checkpoint"):
        emit("save", kind=phase, step=step, p=step, skipped=False)
    elif phase == "scale_up":
        emit("scaled_up", step=step)
    elif phase in _RESTORES:
        restored = (_RESTORES[phase], step - 1)
        emit("restore", kind=restored[0], step=step - 1, p=step - 1)
    return restored


#: A fired fault's fields the rules read (of its ``fault`` event, as the fault log holds it).
FAULT_FIELDS = ("scheduled", "action", "slice", "phase", "step", "pid", "wall")


def fault_record(event: Any) -> dict[str, Any]:
    """A fired fault's ``fault`` event (:class:`elastic_dew.elastic.events.Fault`) as the
    rules read it.

    Args:
        event: the event.

    Returns:
        Its ``scheduled``, ``action``, ``slice``, ``phase``, ``step``, ``pid`` and ``wall``.
    """
    raw = event.to_json()
    return {key: raw[key] for key in FAULT_FIELDS}
