"""The fault schedule: its grammar, its actions, and firing it at the elastic layer's phases.

A schedule is comma-separated tokens of two forms:

* ``ACTION[:SLICE]@STEP[/PHASE]``, keyed to a step: the fault fires at the first
  announcement of its phase (:data:`PHASES`, ``step`` by default) at a step >= its step,
  once. ``lose:1@20,restore:1@40,preempt@60,kill@80``.
* ``ACTION[:SLICE]@+SECONDS[/PHASE]``, keyed to time: the fault is due ``SECONDS`` of wall
  time after the previous fault of the schedule fired (never before it). For determinism a
  due fault becomes visible to the run at a boundary: the next announcement of its phase,
  or at once while the run waits for slices (the ``wait`` phase), when no step announces
  anything. ``lose:3@17,restore:3@+3`` brings slice 3 back three seconds after its loss,
  which a paused run (pause-resume stops stepping while a slice is lost) can reach.

A token's shape and the reading of its numbers are :mod:`elastic_dew.elastic.fault_token`
(the fault log reads tokens back with it too); this module checks what the parts name.

What each action does lives in one table, :data:`ACTION_TABLE` (name -> :class:`Action`):
whether it names a slice, whether it ends the process, whether it raises where it fires,
and the function that fires it. The grammar and the firing both read the table, so a new
action is one entry. The ``lose`` faults of a schedule raise, in turn, each error code
pathwaysutils counts as slice-down (:data:`SLICE_DOWN_CODES`), so one schedule exercises
every code the retry must recognise.

:func:`unreachable` finds a fault that can never fire (a step the run cannot reach because
it is paused waiting for a slice whose return is keyed to a later step), so a run can refuse
the schedule before anything runs.

:class:`ScheduleRunner` fires a schedule: it listens to :mod:`elastic_dew.elastic.hooks`,
records each due fault in the run directory's fault log (:class:`elastic_dew.rundir.FaultLog`,
flushed and fsynced, with the wall time it fired) *before* firing it, reports it to the
running run as a ``fault`` event (:func:`elastic_dew.elastic.hooks.report`), and never fires a
fault the log already holds, so a process restarted with the same schedule and log does not
fire it again; a time-keyed fault counts from the time its predecessor's record holds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from elastic_dew._deprecation import renamed_keywords
from elastic_dew.elastic import events, fault_token, hooks
from elastic_dew.rundir import FaultLog

__all__ = [
    "ACTIONS",
    "ACTION_TABLE",
    "PHASES",
    "SLICE_DOWN_CODES",
    "Action",
    "Fault",
    "Schedule",
    "ScheduleRunner",
    "Target",
    "action_of",
    "as_schedule",
    "check_slices",
    "parse_schedule",
    "unreachable",
]

logger = logging.getLogger(__name__)

#: When a fault fires: the phases the elastic layer announces (:data:`hooks.PHASES`).
PHASES: tuple[str, ...] = hooks.PHASES

#: The error codes pathwaysutils 0.1.13 counts as a slice down
#: (``pathwaysutils/elastic/elastic.py``: ``_ELASTIC_DOWN_ERROR_TYPES`` and
#: ``_ELASTIC_DOWN_ADDITIONAL_ERROR_TYPES``), in the order the ``lose`` faults of a
#: schedule raise them.
SLICE_DOWN_CODES: tuple[str, ...] = ("DATA_LOSS", "INTERNAL", "NOT_FOUND", "DEADLINE_EXCEEDED")

#: The code of the ``error`` action: a runtime error that is not a slice loss, which the
#: retry must not retry.
NOT_A_SLICE_LOSS = "INVALID_ARGUMENT"

#: How often the runner's clock looks for a due time-keyed fault while the run waits.
_TICK = 0.05


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
class Fault:
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
    """One kind of fault: whether it names a slice, ends the process or raises, how it fires.

    ``raises``: the fault raises where it fires (``error``), so it fires only at an
    announcement on the run's own thread, never from the runner's clock during a wait.
    ``slice_healthy``: what the fault leaves its slice as (``False``: down, ``True``:
    healthy again, ``None``: unchanged), which :func:`unreachable` follows.

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
    fire: Callable[[Target, Fault], None]
    raises: bool = False
    slice_healthy: bool | None = None


def _slice_action(method: str) -> Callable[[Target, Fault], None]:
    def fire(target: Target, fault: Fault) -> None:
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


def _preempt(target: Target, fault: Fault) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _kill(target: Target, fault: Fault) -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _error(target: Target, fault: Fault) -> None:
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


def action_of(fault: Fault) -> Action:
    """The table entry of ``fault``'s action."""
    return ACTION_TABLE[fault.action]


# --------------------------------------------------------------------------- grammar

_GRAMMAR = f"{' or '.join(fault_token.FORMS)}, comma-separated"


def _parse_token(token: str, bad: Callable[[str], ValueError]) -> Fault:
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
    elif phase not in PHASES:
        raise bad(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
    return Fault(name, slice_index, step, phase, after)


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


# --------------------------------------------------------------------------- reachability


@renamed_keywords("check_slices", num_slices="slices")
def check_slices(schedule: Schedule, slices: int) -> None:
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



@renamed_keywords("unreachable", num_slices="slices")
def unreachable(schedule: Schedule, slices: int, minimum_slice_count: int | None = None, *,
                name: Callable[[str, Any], str] | None = None) -> str | None:
    """Why a fault of ``schedule`` can never fire on ``slices`` slices, or ``None``.

    A run stops stepping while fewer than ``minimum_slice_count`` slices are healthy (all of
    them in pause-resume, ``None``), so a fault keyed to a later step than the one the run
    paused at can fire only after something brings the slices back, and a return keyed to
    such a step never comes. Faults are followed in the order they fire: step-keyed ones by
    step; a time-keyed one right after its predecessor when that fired while the run was
    paused (wall time passes in a wait). Where the order is not certain (a time-keyed fault
    whose predecessor fired while the run was stepping) the check stops and accepts: only
    a fault that certainly cannot fire is reported. A process-ending fault starts a new
    process, with every slice healthy again. The reason names the setting with ``name``
    (the field and its value), by default as Python does (``minimum_slice_count=3``);
    :func:`elastic_dew.settings.mention` keeps it as data for a refusal a command line words.

    Args:
        schedule: the parsed schedule.
        slices: how many slices there are.
        minimum_slice_count: the run's minimum, ``None`` for pause-resume.
        name: names ``minimum_slice_count`` in the reason, given the field and the value.

    Returns:
        Why a fault cannot fire, or ``None`` when every fault can.
    """
    name = name or (lambda field, value: f"{field}={value}")
    faults = schedule.faults
    needed = slices if minimum_slice_count is None else minimum_slice_count
    lost: set[int] = set()
    paused: list[int | None] = [None]  # the step the run paused at, or None while it steps
    cause: list[Fault | None] = [None]

    def apply(fault: Fault, step: int) -> None:
        healthy = action_of(fault).slice_healthy
        if healthy is False:
            lost.add(fault.slice)
        elif healthy:
            lost.discard(fault.slice)
        elif action_of(fault).ends_process:
            lost.clear()
        if len(lost) > slices - needed:
            if paused[0] is None:
                paused[0], cause[0] = step, fault
        else:
            paused[0] = None

    def fire_chain(index: int, step: int) -> bool:
        """Apply fault ``index`` and the time-keyed faults chained after it; False when unsure."""
        apply(faults[index], step)
        following = index + 1
        while following < len(faults) and faults[following].timed:
            fault = faults[following]
            if paused[0] is None or action_of(fault).raises:
                return False  # it fires at a step nobody can name: the order is not certain
            apply(fault, paused[0])
            following += 1
        return True

    if faults and faults[0].timed:
        return None
    keyed = sorted((fault.step, index) for index, fault in enumerate(faults) if not fault.timed)
    for step, index in keyed:
        fault = faults[index]
        if paused[0] is not None and step > paused[0]:
            down = sorted(lost)
            names = ", ".join(map(str, down))
            first = down[0]
            mode = ("pause-resume waits for every slice" if minimum_slice_count is None
                    else f"{name('minimum_slice_count', minimum_slice_count)} needs {needed} healthy slices")
            back = next(name for name, action in ACTION_TABLE.items() if action.slice_healthy)
            return (
                f"fault {fault} can never fire: after {cause[0]} the run stops stepping at step "
                f"{paused[0]} and waits for slice {names} ({mode}), and nothing brings "
                f"{'it' if len(down) == 1 else 'them'} back before step {step}. Key the return "
                f"to time instead, e.g. {back}:{first}@+3 (3 s after the previous fault fired), "
                f"or let the run carry on without {'it' if len(down) == 1 else 'them'} with "
                f"{name('minimum_slice_count', max(1, slices - len(down)))}"
            )
        if not fire_chain(index, step):
            return None
    return None


# --------------------------------------------------------------------------- firing


class ScheduleRunner:
    """Fire ``schedule``'s faults on ``target`` at the phases the elastic layer announces, or,
    in a loop that announces nothing, at its own step function's dispatches.

    With ``fault_log`` each fault is recorded durably before it fires and a fault the log
    already holds never fires; a log from another schedule is refused (``ValueError``) here,
    before anything is listened to. Use as a context manager (listens while inside).

    Two seams, one at a time. Announcements (:mod:`elastic_dew.elastic.hooks`, elastic_dew's
    own loop) are the precise one: once one is heard, only announcements fire faults.
    Until then :meth:`on_dispatch` is the seam: the simulator calls it just before
    (``dispatch``) and just after (``step``) each dispatch of the loop's step function, with
    the number of that dispatch, so a step-keyed fault fires at the step function's
    ``STEP``-th dispatch (counted across attempts).

    A time-keyed fault is due ``after`` seconds after its predecessor fired (the first fault
    of a schedule counts from the runner's creation). It fires at the next boundary of its
    phase once due (an announcement, or a counted dispatch); while nothing can reach such a
    boundary (the run waits for slices after a ``wait`` announcement, or, in a loop that
    announces nothing, or in any loop, ``idle()`` says the loop is blocked in a read on a
    hung slice or in pathwaysutils' wait for slices) the runner's clock thread fires it at
    once, whatever its phase, unless it raises where it fires (``error``).
    """

    def __init__(
        self,
        schedule: Schedule,
        target: Target,
        fault_log: FaultLog | None,
        *,
        idle: Callable[[], bool] = lambda: False,
    ) -> None:
        self.schedule = schedule
        self.target = target
        self.fault_log = fault_log
        self.idle = idle
        #: Whether the loop announces its phases (elastic_dew's loop): then only
        #: announcements fire faults, never counted dispatches.
        self.announced = False
        self._last_step: int | None = None
        logged = fault_log.fired([str(fault) for fault in schedule]) if fault_log is not None else {}
        #: When each fired fault of the schedule fired (wall time), by its index.
        self._fired: dict[int, float] = {index: fired.wall for index, fired in logged.items()}
        self._started = time.time()
        self._lock = threading.Lock()
        self._listener = self.on_phase
        self._waiting: int | None = None  # the step of the wait under way, or None
        self._stop = threading.Event()
        self._clock: threading.Thread | None = None

    @property
    def fired(self) -> frozenset[Fault]:
        """Scheduled faults fired so far in this run (this process or an earlier one)."""
        return frozenset(self.schedule.faults[index] for index in self._fired)

    @property
    def unfired(self) -> tuple[Fault, ...]:
        """Scheduled faults that have not fired in this run, in schedule order."""
        return tuple(f for index, f in enumerate(self.schedule.faults) if index not in self._fired)

    def report_unfired(self) -> tuple[Fault, ...]:
        """Warn of every fault that never fired, and record each in the fault log, so a test
        of a loop the schedule never reached cannot pass by accident; returns them."""
        unfired = self.unfired
        if not unfired:
            return unfired
        step = self._last_step
        where = f"the last step seen was {step}" if step is not None else "no step was seen"
        logger.warning(
            "scheduled faults never fired: %s (%s; %s)", [str(f) for f in unfired], where,
            "elastic_dew's loop announces its phases" if self.announced
            else "the loop announced nothing: steps are its step function's dispatches",
        )
        if self.fault_log is not None:
            for index, fault in enumerate(self.schedule.faults):
                if index not in self._fired:
                    self.fault_log.append_never_fired(fault.fired(index, fault.phase, step))
        return unfired

    def __enter__(self) -> ScheduleRunner:
        hooks.add_listener(self._listener)
        if any(fault.timed for fault in self.schedule):
            self._stop.clear()
            self._clock = threading.Thread(target=self._tick, name="elastic-dew-fault-clock", daemon=True)
            self._clock.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        hooks.remove_listener(self._listener)
        self._stop.set()
        if self._clock is not None:
            self._clock.join(timeout=5)
            self._clock = None

    def _due_at(self, index: int) -> float | None:
        """The wall time a time-keyed fault is due, or None while its predecessor has not fired."""
        after = self.schedule.faults[index].after or 0.0
        if index == 0:
            return self._started + after
        previous = self._fired.get(index - 1)
        return None if previous is None else previous + after

    def _collect(self, phase: str, step: int, *, waiting: bool) -> list[tuple[Fault, events.Fault]]:
        """Record every fault due at this moment, in schedule order (call under the lock)."""
        due: list[tuple[Fault, events.Fault]] = []
        for index, fault in enumerate(self.schedule.faults):
            if index in self._fired:
                continue
            if fault.timed:
                at = self._due_at(index)
                if at is None or time.time() < at:
                    continue
                if fault.phase != phase and not (waiting and not action_of(fault).raises):
                    continue
            elif fault.phase != phase or step < fault.step:
                continue
            fired = fault.fired(index, phase, step)
            if self.fault_log is not None:
                self.fault_log.append(fired)
            self._fired[index] = fired.wall
            due.append((fault, fired))
        return due

    def _fire(self, due: list[tuple[Fault, events.Fault]], phase: str, step: int) -> None:
        raised: BaseException | None = None
        for fault, fired in due:
            logger.warning("firing scheduled fault %s at step %d (phase %s)", fault, step, phase)
            hooks.report(fired)  # the fault joins the run's event stream as it fires
            try:
                action_of(fault).fire(self.target, fault)
            except Exception as error:  # noqa: BLE001 - fire the rest, then raise the first
                raised = raised or error
        if raised is not None:
            raise raised

    def on_phase(self, phase: str, step: int) -> None:
        """Record, then fire, every fault due at this announcement, in schedule order.

        Before a phase that meets the run's work in flight
        (:attr:`elastic_dew.elastic.hooks.Phase.meets_in_flight`: a snapshot save), and before
        a step-keyed fault fires, that work is landed
        (:func:`elastic_dew.elastic.hooks.land_in_flight`; not while a slice hangs): a save is
        then never skipped for a transfer still running, and a fault never meets one, so
        which snapshot a recovery loads depends on the schedule alone.
        """
        with self._lock:
            self.announced = True
            self._last_step = step
            self._waiting = step if phase == "wait" else None
            due = self._collect(phase, step, waiting=self._waiting is not None)
        meets = hooks.PHASE_TABLE[phase].meets_in_flight or any(not fault.timed for fault, _ in due)
        if meets and not self.target.hung:
            hooks.land_in_flight()
        self._fire(due, phase, step)

    def on_dispatch(self, phase: str, step: int) -> None:
        """The loop's step function is being dispatched (``dispatch``) or was (``step``), for the
        ``step``-th time: fire what is due there, unless the loop announces its own phases."""
        with self._lock:
            if self.announced:
                return
            self._last_step = step
            due = self._collect(phase, step, waiting=False)
        self._fire(due, phase, step)

    def _tick(self) -> None:
        """While nothing can reach a boundary, fire time-keyed faults as they fall due."""
        while not self._stop.wait(_TICK):
            with self._lock:
                step = self._waiting
                if step is None and self.idle():
                    # Blocked in a read on a hung slice or in pathwaysutils' wait for
                    # slices, in any loop, announced or not: no boundary comes.
                    step = self._last_step or 0
                due = self._collect("wait", step, waiting=True) if step is not None else []
            if due:
                self._fire(due, "wait", step)
