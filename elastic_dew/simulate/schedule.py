"""The fault schedule: its grammar and its actions.

A schedule is comma-separated tokens of two forms:

* ``ACTION[:SLICE]@STEP[/PHASE]``, keyed to a step: the fault fires at the first
  announcement of its phase (:data:`elastic_dew.elastic.hooks.PHASES`, ``step`` by default)
  at a step >= its step, once. ``lose:1@20,restore:1@40,preempt@60,kill@80``.
* ``ACTION[:SLICE]@+SECONDS[/PHASE]``, keyed to time: the fault is due ``SECONDS`` of wall
  time after the previous fault of the schedule fired (never before it). For determinism a
  due fault becomes visible to the run at a boundary: the next announcement of its phase,
  or at once while the run waits for slices (the ``wait`` phase), when no step announces
  anything. ``lose:3@17,restore:3@+3`` brings slice 3 back three seconds after its loss,
  which a paused run (pause-resume stops stepping while a slice is lost) can reach.

A token's shape and the reading of its numbers are :mod:`elastic_dew.simulate.fault_token`
(the planner writes the schedules it draws with it too); this module checks what the parts name.

What each action does lives in one table, :data:`ACTION_TABLE` (name -> :class:`Action`):
whether it names a slice, whether it ends the process, whether it raises where it fires,
and the function that fires it. The grammar and the firing both read the table, so a new
action is one entry. The ``lose`` faults of a schedule raise, in turn, each error code
pathwaysutils counts as slice-down (:data:`SLICE_DOWN_CODES`), so one schedule exercises
every code the retry must recognise.

:func:`~elastic_dew.simulate.reachability.unreachable` finds a fault that can never fire (a
step the run cannot reach because it is paused waiting for a slice whose return is keyed to a
later step), so a run can refuse the schedule before anything runs.

:class:`~elastic_dew.simulate.runner.ScheduleRunner` fires a schedule (:mod:`elastic_dew.simulate.runner`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from elastic_dew.elastic import events, hooks
from elastic_dew.simulate import fault_token

__all__ = [
    "ACTIONS",
    "ACTION_TABLE",
    "SLICE_DOWN_CODES",
    "Action",
    "ScheduledFault",
    "Schedule",
    "Target",
    "action_of",
    "as_schedule",
    "check_fault_slices",
    "parse_schedule",
]

logger = logging.getLogger(__name__)

#: The error codes pathwaysutils 0.1.13 counts as a slice down
#: (``pathwaysutils/elastic/elastic.py``: ``_ELASTIC_DOWN_ERROR_TYPES`` and
#: ``_ELASTIC_DOWN_ADDITIONAL_ERROR_TYPES``), in the order the ``lose`` faults of a
#: schedule raise them.
SLICE_DOWN_CODES: tuple[str, ...] = ("DATA_LOSS", "INTERNAL", "NOT_FOUND", "DEADLINE_EXCEEDED")

#: The code of the ``error`` action: a runtime error that is not a slice loss, which the
#: retry must not retry.
NOT_A_SLICE_LOSS = "INVALID_ARGUMENT"

class Target(Protocol):
    """What slice actions act on (the simulator)."""

    def lose(self, i: int, code: str = ...) -> None: ...

    def restore(self, i: int) -> None: ...

    def hang(self, i: int) -> None: ...

    def suspend(self, i: int) -> None: ...

    def wake(self, i: int) -> None: ...

    @property
    def hung(self) -> frozenset[int]: ...


@dataclasses.dataclass(frozen=True)
class ScheduledFault:
    """One scheduled fault: ``action`` (on ``slice``) at the first ``phase`` of step >= ``step``,
    or, when ``after`` is set, ``after`` seconds after the previous fault fired.

    A schedule's entry says what is to fire and when (a step, or seconds after its
    predecessor), whether or not it ever does; what did fire, where and when, is another
    concept, the run's ``fault`` event (:class:`elastic_dew.elastic.events.Fault`, which
    :meth:`fired` makes), the one type the event stream and the fault log hold.

    ``code`` is the error a ``lose`` raises (set by :func:`parse_schedule`, in turn); it is
    not part of the fault's text or identity.

    Args:
        action: the action's name.
        slice: its slice, or ``None``.
        step: the step it is due at (with ``after``: unused, 0).
        phase: the phase it is due at.
        after: seconds after the previous fault fired, or ``None`` (step-keyed).
        code: the error a ``lose`` raises.
    """

    action: str
    slice: int | None
    step: int
    phase: str = "step"
    after: float | None = None
    code: str | None = dataclasses.field(default=None, compare=False)

    @property
    def timed(self) -> bool:
        """Whether the fault is keyed to time (``@+SECONDS``) rather than to a step."""
        return self.after is not None

    def fired(self, index: int, phase: str, step: int | None) -> events.Fault:
        """This entry, the schedule's ``index``-th, as the ``fault`` event of firing now, in
        this process, at ``phase`` of ``step`` (``None``: no step seen yet, recorded as -1).

        Args:
            index: its place in the schedule.
            phase: the phase it fires at.
            step: the step it fires at, or ``None``.

        Returns:
            The ``fault`` event.
        """
        return events.Fault(action=self.action, slice=self.slice, step=-1 if step is None else step,
                            phase=phase, scheduled=str(self), index=index, pid=os.getpid())

    def __str__(self) -> str:
        return str(fault_token.Token.of(self.action, self.slice, self.step, self.after, self.phase))


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Faults in the order they were written (faults due together fire in this order).

    Args:
        faults: the faults.
    """

    faults: tuple[ScheduledFault, ...] = ()

    def __iter__(self) -> Iterator[ScheduledFault]:
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    def __str__(self) -> str:
        return ",".join(str(fault) for fault in self.faults)


# --------------------------------------------------------------------------- actions


@dataclasses.dataclass(frozen=True)
class Action:
    """One kind of fault: whether it names a slice, ends the process or raises, how it fires.

    ``raises``: the fault raises where it fires (``error``), so it fires only at an
    announcement on the run's own thread, never from the runner's clock during a wait.
    ``slice_healthy``: what the fault leaves its slice as (``False``: down, ``True``:
    healthy again, ``None``: unchanged), which
    :func:`~elastic_dew.simulate.reachability.unreachable` follows.

    Args:
        name: the action's name in the grammar.
        takes_slice: whether its token names a slice (``lose:1``).
        ends_process: whether it ends the process (``preempt``, ``kill``).
        fire: ``fire(target, fault)`` does it.
        raises: whether it raises where it fires.
        slice_healthy: what it leaves its slice as.
    """

    name: str
    takes_slice: bool
    ends_process: bool
    fire: Callable[[Target, ScheduledFault], None]
    raises: bool = False
    slice_healthy: bool | None = None


def _slice_action(method: str) -> Callable[[Target, ScheduledFault], None]:
    def fire(target: Target, fault: ScheduledFault) -> None:
        # A slice fault only changes slice health; its error surfaces at the next read or
        # dispatch, as on Pathways, never inside the announcement.
        try:
            if fault.code is not None:
                getattr(target, method)(fault.slice, fault.code)
            else:
                getattr(target, method)(fault.slice)
        except Exception:  # noqa: BLE001 - the schedule was validated; log, never raise here
            logger.exception("scheduled fault %s could not be applied", fault)

    return fire


def _end_process(target: Target, signum: int) -> None:
    """Send ``signum`` to the program's process: the target's own ``end_process(signum)`` where
    it has one (the local Pathways backend signals the program it serves), else this process."""
    end = getattr(target, "end_process", None)
    if end is not None:
        end(signum)
        return
    if signum == signal.SIGKILL:
        for handler in logging.getLogger().handlers:
            handler.flush()
    os.kill(os.getpid(), signum)


def _preempt(target: Target, fault: ScheduledFault) -> None:
    _end_process(target, signal.SIGTERM)


def _kill(target: Target, fault: ScheduledFault) -> None:
    _end_process(target, signal.SIGKILL)


def _error(target: Target, fault: ScheduledFault) -> None:
    import jax  # here, so the grammar is read without starting JAX

    raise jax.errors.JaxRuntimeError(
        f"{NOT_A_SLICE_LOSS}: simulated runtime error {fault} (elastic_dew.simulate): not a "
        "slice loss, so it is not retried"
    )


#: Every action, by name: ``lose`` a slice (its reads, dispatches and results derived from
#: it fail), ``restore`` it, ``hang`` it (reads of its results block), ``suspend`` it
#: (Pathways' transparent suspend: reads of its results block until ``wake``, then complete
#: with no error; a slice loss under multi-tier checkpointing), ``error`` (a runtime
#: error that is not a slice loss, raised where it fires), ``preempt`` (SIGTERM to this
#: process), ``kill`` (SIGKILL to this process).
ACTION_TABLE: Mapping[str, Action] = {
    action.name: action
    for action in (
        Action("lose", takes_slice=True, ends_process=False, fire=_slice_action("lose"), slice_healthy=False),
        Action("restore", takes_slice=True, ends_process=False, fire=_slice_action("restore"), slice_healthy=True),
        Action("hang", takes_slice=True, ends_process=False, fire=_slice_action("hang"), slice_healthy=False),
        Action("suspend", takes_slice=True, ends_process=False, fire=_slice_action("suspend"), slice_healthy=False),
        Action("wake", takes_slice=True, ends_process=False, fire=_slice_action("wake"), slice_healthy=True),
        Action("error", takes_slice=False, ends_process=False, fire=_error, raises=True),
        Action("preempt", takes_slice=False, ends_process=True, fire=_preempt),
        Action("kill", takes_slice=False, ends_process=True, fire=_kill),
    )
}
#: The action names, in the order the grammar lists them.
ACTIONS: tuple[str, ...] = tuple(ACTION_TABLE)


def action_of(fault: ScheduledFault) -> Action:
    """The table entry of ``fault``'s action."""
    return ACTION_TABLE[fault.action]


# --------------------------------------------------------------------------- grammar

_GRAMMAR = f"{' or '.join(fault_token.FORMS)}, comma-separated"


def _parse_token(token: str, bad: Callable[[str], ValueError]) -> ScheduledFault:
    if not token:
        raise bad("empty token (a stray comma?)")
    parts = fault_token.split(token)
    if parts is None:
        raise bad(f"expected {fault_token.FORMS[0]}, e.g. lose:1@20, preempt@60/checkpoint or restore:1@+3")
    name, slice_text, step_text, phase = parts.action, parts.slice, parts.when, parts.phase
    action = ACTION_TABLE.get(name)
    if action is None:
        raise bad(f"unknown action {name!r}; actions are {', '.join(ACTIONS)}")
    if action.takes_slice:
        if slice_text is None:
            raise bad(f"{name} needs a slice, e.g. {name}:1@{step_text}")
        slice_index = fault_token.whole(slice_text)
        if slice_index is None:
            raise bad(f"slice {slice_text!r} is not a whole number >= 0")
    else:
        if slice_text is not None:
            raise bad(f"{name} acts on the whole process and takes no slice; write {name}@{step_text}")
        slice_index = None
    after = None
    step: int | None
    if step_text.startswith("+"):
        after, step = fault_token.seconds(step_text), 0
        if after is None:
            raise bad(f"time {step_text!r} is not +SECONDS with SECONDS a number >= 0, e.g. +3 or +0.5")
    else:
        step = fault_token.whole(step_text)
        if step is None:
            raise bad(f"step {step_text!r} is not a whole number >= 0 (or +SECONDS after the previous fault)")
    if phase is None:
        phase = "step"
    elif phase not in hooks.PHASE_TABLE:
        raise bad(f"unknown phase {phase!r}; phases are {', '.join(hooks.PHASES)}")
    return ScheduledFault(name, slice_index, step, phase, after)


def parse_schedule(text: str) -> Schedule:
    """Parse the schedule's tokens, comma-separated; empty text is no faults.

    A time-keyed first fault counts from the start of the run's first process. The
    ``lose`` faults take :data:`SLICE_DOWN_CODES` in turn.

    Args:
        text: the schedule (``lose:1@20,restore:1@+3,preempt@60``).

    Returns:
        The :class:`Schedule`.

    Raises:
        ValueError: a token that does not parse, naming it, what is wrong with it and the
            accepted values.
    """
    if not text or not text.strip():
        return Schedule()
    faults = []
    losses = 0
    for raw in text.split(","):
        token = raw.strip()

        def bad(problem: str, token: str = token) -> ValueError:
            return ValueError(f"bad fault {token!r} in schedule {text!r}: {problem} (grammar: {_GRAMMAR})")

        fault = _parse_token(token, bad)
        if fault.action == "lose":
            fault = dataclasses.replace(fault, code=SLICE_DOWN_CODES[losses % len(SLICE_DOWN_CODES)])
            losses += 1
        faults.append(fault)
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


# --------------------------------------------------------------------------- slices


def check_fault_slices(schedule: Schedule, slices: int) -> None:
    """Refuse a fault naming a slice the ``slices`` slices do not have.

    Args:
        schedule: the parsed schedule.
        slices: how many slices there are.

    Raises:
        ValueError: a fault names a slice outside ``0 .. slices - 1``.
    """
    for fault in schedule:
        if fault.slice is not None and fault.slice >= slices:
            raise ValueError(
                f"fault {fault} names slice {fault.slice}, but there are {slices} slices "
                f"(0..{slices - 1}); fix the schedule or use more slices"
            )
