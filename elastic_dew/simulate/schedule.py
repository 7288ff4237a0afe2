"""The fault schedule: its grammar, its actions, and firing it at the elastic layer's phases.

A schedule is comma-separated ``ACTION[:SLICE]@STEP[/PHASE]`` tokens, e.g.
``lose:1@20,restore:1@40,preempt@60,kill@80``. A fault fires at the first announcement of
its phase (:data:`PHASES`, ``step`` by default) at a step >= its step, once.

What each action does lives in one table, :data:`ACTION_TABLE` (name -> :class:`Action`):
whether it names a slice, whether it ends the process, and the function that fires it. The
grammar and the firing both read the table, so a new action is one entry.

:class:`ScheduleRunner` fires a schedule: it listens to :mod:`elastic_dew.elastic.hooks`,
records each due fault in the run directory's fault log (:class:`elastic_dew.rundir.FaultLog`,
flushed and fsynced) *before* firing it, and never fires a fault the log already holds, so a
process restarted with the same schedule and log does not fire it again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from elastic_dew.elastic import hooks
from elastic_dew.rundir import FaultLog

__all__ = [
    "ACTIONS",
    "ACTION_TABLE",
    "PHASES",
    "Action",
    "Fault",
    "Schedule",
    "ScheduleRunner",
    "Target",
    "action_of",
    "parse_schedule",
]

logger = logging.getLogger(__name__)

#: When a fault fires: the phases the elastic layer announces (:data:`hooks.PHASES`).
PHASES: tuple[str, ...] = hooks.PHASES


class Target(Protocol):
    """What slice actions act on (the simulator)."""

    def lose(self, i: int) -> None: ...

    def restore(self, i: int) -> None: ...


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``action`` (on ``slice``) at the first ``phase`` of step >= ``step``."""

    action: str
    slice: int | None
    step: int
    phase: str = "step"

    def __str__(self) -> str:
        where = f":{self.slice}" if self.slice is not None else ""
        return f"{self.action}{where}@{self.step}/{self.phase}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Faults in the order they were written (faults due together fire in this order)."""

    faults: tuple[Fault, ...] = ()

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    def __str__(self) -> str:
        return ",".join(str(fault) for fault in self.faults)


# --------------------------------------------------------------------------- actions


@dataclasses.dataclass(frozen=True)
class Action:
    """One kind of fault: whether it names a slice, whether it ends the process, how it fires."""

    name: str
    takes_slice: bool
    ends_process: bool
    fire: Callable[[Target, Fault], None]


def _slice_action(method: str) -> Callable[[Target, Fault], None]:
    def fire(target: Target, fault: Fault) -> None:
        # A slice fault only changes slice health; its error surfaces at the next read, as on
        # Pathways, never inside the announcement.
        try:
            getattr(target, method)(fault.slice)
        except Exception:  # noqa: BLE001 - the schedule was validated; log, never raise here
            logger.exception("scheduled fault %s could not be applied", fault)

    return fire


def _preempt(target: Target, fault: Fault) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _kill(target: Target, fault: Fault) -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


#: Every action, by name: ``lose``/``restore`` a slice, ``preempt`` (SIGTERM to this
#: process), ``kill`` (SIGKILL to this process).
ACTION_TABLE: Mapping[str, Action] = {
    action.name: action
    for action in (
        Action("lose", takes_slice=True, ends_process=False, fire=_slice_action("lose")),
        Action("restore", takes_slice=True, ends_process=False, fire=_slice_action("restore")),
        Action("preempt", takes_slice=False, ends_process=True, fire=_preempt),
        Action("kill", takes_slice=False, ends_process=True, fire=_kill),
    )
}
#: The action names, in the order the grammar lists them.
ACTIONS: tuple[str, ...] = tuple(ACTION_TABLE)


def action_of(fault: Fault) -> Action:
    """The table entry of ``fault``'s action."""
    return ACTION_TABLE[fault.action]


# --------------------------------------------------------------------------- grammar

_TOKEN = re.compile(r"^(?P<action>[^:@/]*)(?::(?P<slice>[^@/]*))?@(?P<step>[^/]*)(?:/(?P<phase>.*))?$")
_GRAMMAR = "ACTION[:SLICE]@STEP[/PHASE], comma-separated"


def _whole(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _parse_token(token: str, bad: Callable[[str], ValueError]) -> Fault:
    if not token:
        raise bad("empty token (a stray comma?)")
    match = _TOKEN.match(token)
    if match is None:
        raise bad("expected ACTION[:SLICE]@STEP[/PHASE], e.g. lose:1@20 or preempt@60/checkpoint")
    name, slice_text, step_text, phase = match.group("action", "slice", "step", "phase")
    action = ACTION_TABLE.get(name)
    if action is None:
        raise bad(f"unknown action {name!r}; actions are {', '.join(ACTIONS)}")
    if action.takes_slice:
        if slice_text is None:
            raise bad(f"{name} needs a slice, e.g. {name}:1@{step_text}")
        slice_index = _whole(slice_text)
        if slice_index is None:
            raise bad(f"slice {slice_text!r} is not a whole number >= 0")
    else:
        if slice_text is not None:
            raise bad(f"{name} acts on the whole process and takes no slice; write {name}@{step_text}")
        slice_index = None
    step = _whole(step_text)
    if step is None:
        raise bad(f"step {step_text!r} is not a whole number >= 0")
    if phase is None:
        phase = "step"
    elif phase not in PHASES:
        raise bad(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
    return Fault(name, slice_index, step, phase)


def parse_schedule(text: str) -> Schedule:
    """Parse ``ACTION[:SLICE]@STEP[/PHASE]`` tokens, comma-separated; empty text is no faults.

    A syntax error is a ``ValueError`` naming the bad token, what is wrong with it and the
    accepted values.
    """
    if not text or not text.strip():
        return Schedule()
    faults = []
    for raw in text.split(","):
        token = raw.strip()

        def bad(problem: str, token: str = token) -> ValueError:
            return ValueError(f"bad fault {token!r} in schedule {text!r}: {problem} (grammar: {_GRAMMAR})")

        faults.append(_parse_token(token, bad))
    return Schedule(tuple(faults))


def as_schedule(schedule: str | Schedule | None) -> Schedule:
    """A :class:`Schedule` from text, a schedule or ``None`` (no faults)."""
    if schedule is None:
        return Schedule()
    if isinstance(schedule, str):
        return parse_schedule(schedule)
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be text or a Schedule, not {type(schedule).__name__}")
    return schedule


# --------------------------------------------------------------------------- firing


class ScheduleRunner:
    """Fire ``schedule``'s faults on ``target`` at the phases the elastic layer announces.

    With ``fault_log`` each fault is recorded durably before it fires and a fault the log
    already holds never fires; a log from another schedule is refused (``ValueError``) here,
    before anything is listened to. Use as a context manager (listens while inside).
    """

    def __init__(self, schedule: Schedule, target: Target, fault_log: FaultLog | None) -> None:
        self.schedule = schedule
        self.target = target
        self.fault_log = fault_log
        texts = [str(fault) for fault in schedule]
        self._fired: set[int] = fault_log.fired(texts) if fault_log is not None else set()
        self._lock = threading.Lock()
        self._listener = self.on_phase

    @property
    def fired(self) -> frozenset[Fault]:
        """Scheduled faults fired so far in this run (this process or an earlier one)."""
        return frozenset(self.schedule.faults[index] for index in self._fired)

    def __enter__(self) -> ScheduleRunner:
        hooks.add_listener(self._listener)
        return self

    def __exit__(self, *exc_info: object) -> None:
        hooks.remove_listener(self._listener)

    def on_phase(self, phase: str, step: int) -> None:
        """Record, then fire, every fault due at this announcement, in schedule order."""
        due: list[Fault] = []
        with self._lock:
            for index, fault in enumerate(self.schedule.faults):
                if index in self._fired or fault.phase != phase or step < fault.step:
                    continue
                if self.fault_log is not None:
                    self.fault_log.append(index, str(fault), phase, step)
                self._fired.add(index)
                due.append(fault)
        for fault in due:
            logger.warning("firing scheduled fault %s at %s of step %d", fault, phase, step)
            action_of(fault).fire(self.target, fault)
