"""Firing a fault schedule at the elastic layer's phases, or at the step function's
dispatches in a loop that announces nothing, through the run directory's fault log.

:class:`ScheduleRunner` listens to the loop's channel (:mod:`elastic_dew.elastic.hooks`),
records each due fault in the run directory's fault log (:class:`elastic_dew.rundir.FaultLog`,
flushed and fsynced, with the wall time it fired) *before* firing it, tells it on the channel
as a ``fault`` event (:func:`elastic_dew.elastic.hooks.emit`: the running run's record hears
it there, in order with the run's own events), and never fires a fault the log
already holds, so a process restarted with the same schedule and log does not fire it again;
a time-keyed fault counts from the time its predecessor's record holds. What a fault is and
what each action does are :mod:`elastic_dew.simulate.schedule`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from elastic_dew.elastic import events, hooks
from elastic_dew.rundir import FaultLog
from elastic_dew.simulate.schedule import ScheduledFault, Schedule, Target, action_of

__all__ = ["ScheduleRunner"]

logger = logging.getLogger(__name__)

#: How often the runner's clock looks for a due time-keyed fault while the run waits.
_TICK = 0.05


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
    ``STEP``-th dispatch (counted across attempts). Before a step-keyed fault fires, at
    either seam, and before a phase that meets the work in flight, ``land()`` finishes the
    run's work in flight (the simulator lands the Orbax ``Snapshotter`` copies, elastic_dew's
    loop's and the program's own: :meth:`elastic_dew.simulate.patches.Registry.land_snapshots`).

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
        land: Callable[[], None] = lambda: None,
    ) -> None:
        self.schedule = schedule
        self.target = target
        self.fault_log = fault_log
        self.idle = idle
        self.land = land
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
    def fired(self) -> frozenset[ScheduledFault]:
        """Scheduled faults fired so far in this run (this process or an earlier one)."""
        return frozenset(self.schedule.faults[index] for index in self._fired)

    @property
    def unfired(self) -> tuple[ScheduledFault, ...]:
        """Scheduled faults that have not fired in this run, in schedule order."""
        return tuple(f for index, f in enumerate(self.schedule.faults) if index not in self._fired)

    def report_unfired(self) -> tuple[ScheduledFault, ...]:
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

    def _collect(self, phase: str, step: int, *, waiting: bool) -> list[tuple[ScheduledFault, events.Fault]]:
        """Record every fault due at this moment, in schedule order (call under the lock)."""
        due: list[tuple[ScheduledFault, events.Fault]] = []
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

    def _fire(self, due: list[tuple[ScheduledFault, events.Fault]], phase: str, step: int) -> None:
        raised: BaseException | None = None
        for fault, fired in due:
            logger.warning("firing scheduled fault %s at step %d (phase %s)", fault, step, phase)
            hooks.emit(fired)  # the fault joins the run's event stream as it fires
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
        a step-keyed fault fires, that work is landed (``land()``, on the announcing thread;
        not while a slice hangs): a save is then never skipped for a transfer still running,
        and a fault never meets one, so which snapshot a recovery loads depends on the
        schedule alone.
        """
        with self._lock:
            self.announced = True
            self._last_step = step
            self._waiting = step if phase == "wait" else None
            due = self._collect(phase, step, waiting=self._waiting is not None)
        meets = hooks.PHASE_TABLE[phase].meets_in_flight or any(not fault.timed for fault, _ in due)
        if meets and not self.target.hung:
            self.land()
        self._fire(due, phase, step)

    def on_dispatch(self, phase: str, step: int) -> None:
        """The loop's step function is being dispatched (``dispatch``) or was (``step``), for the
        ``step``-th time: fire what is due there, unless the loop announces its own phases."""
        with self._lock:
            if self.announced:
                return
            self._last_step = step
            due = self._collect(phase, step, waiting=False)
        if any(not fault.timed for fault, _ in due) and not self.target.hung:
            self.land()
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
            if due and step is not None:  # nothing is due without a step
                self._fire(due, "wait", step)
