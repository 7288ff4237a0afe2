"""Faults at the proxy boundary: the schedule fired at the steps the backend sees dispatched.

Through the proxy nothing runs in the program's process but the program, so the steps are
counted where Pathways would see them: at the backend, from the programs it is asked to
run, by the simulator's one step rule (:meth:`elastic_dew.simulate.step_count.StepCount.chained`:
the program that carries the loop's state from one dispatch to the next, or the one named
with ``step_function``). :class:`StepSchedule` fires a fault schedule with the simulator's
:class:`~elastic_dew.simulate.runner.ScheduleRunner` at those counted dispatches
(``dispatch`` before a step runs, ``step`` after), on the backend's slices (the fault state
machine both boundaries share, :class:`~elastic_dew.simulate.slice_states.SliceStates`), and
records each run attempt's slices: ``elastic_retry`` starts an attempt by waiting for
slices, whose health check probes every slice, those the program runs on too (a program on
each, :func:`probe_programs`), while the ``Manager``'s monitor probes only the inactive ones; so the first step after
probes of every slice the last step ran on starts an attempt (the retry on a smaller mesh, the
scale-up by ``ScaleUpSignalError``, a retry onto the same slices after a pause), and so does
the first step after the program met the loss of a slice its last step ran on. A loop that
takes a returned slice up in place, at a step boundary, starts none. (With a health check
whose probes the backend does not see, a step on other slices than the previous one starts
an attempt.) It also
records when the program first met a loss that fired (the backend answered one of its
requests with a slice-down error), so the verdict can tell a loss the program handled from
one it never saw.

Every schedule action is served: ``lose``, ``restore``, ``hang`` (the program's reads of the
slice's results never answer until the slice is lost or restored), ``suspend`` and ``wake``
at the backend's slices; ``error`` as the failure of the request that dispatches the step
(a runtime error that is not a slice loss, ``INVALID_ARGUMENT``); ``preempt`` and ``kill``
to the program's process, once it announced itself (:mod:`elastic_dew.proxy.exec_program`).
A time-keyed fault fires while the program can reach no step: while one of its reads waits
on a hung slice, and from the first slice-down error it meets while a slice its last step ran
on is lost until its next step (it waits for slices, as pathwaysutils' ``elastic_retry`` does
after a loss; a probe of a slice outside its mesh is not such an error).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from typing import Any, cast

from elastic_dew.simulate.step_count import StepCount

__all__ = ["StepSchedule"]

logger = logging.getLogger(__name__)

#: The longest a read of a step's results waits for the program's ``Manager`` to see a
#: returned slice (its monitor's probes) before it is answered anyway.
TAKE_UP_WAIT_S = 10.0


@functools.lru_cache(maxsize=1)
def pmap_program() -> str:
    """The name a ``jax.pmap``'s program reaches the backend by (all pmaps share it): the
    program pathwaysutils' health check probes each slice with."""
    import jax
    import numpy as np

    text = jax.pmap(lambda x: x, devices=jax.devices()[:1]).lower(np.zeros(1)).as_text()
    match = re.match(r"module @([\w.$-]+)", text)
    return match.group(1) if match else ""


@functools.lru_cache(maxsize=1)
def probe_programs() -> frozenset[str]:
    """The names of the programs a health check probes each slice with: pathwaysutils' (a
    ``pmap``, :func:`pmap_program`) and elastic_dew's own (``jax.jit`` of the probe of
    :mod:`elastic_dew.elastic.slices.health`, which its loop installs)."""
    from elastic_dew.elastic.slices import health

    return frozenset({pmap_program(), f"jit_{health._plus_one.__name__}"})


class _Target:
    """The schedule runner's target: the backend's slices, and the program's process for a
    preemption or a kill."""

    def __init__(self, slices: Any, pid: Any, lost: Any, back: Any, down: Any):
        self.slices = slices
        self._pid = pid
        self._lost = lost
        self._back = back
        self._down = down

    def end_process(self, signum: int) -> None:
        import os

        pid = self._pid()
        if pid is None:
            logger.error("no program process announced itself: signal %d goes nowhere", signum)
            return
        logger.warning("signal %d to the program's process %d", signum, pid)
        os.kill(pid, signum)

    def lose(self, i: int, code: str = "DATA_LOSS") -> None:
        self.slices.lose(i, code)
        self._lost(i)

    def restore(self, i: int) -> None:
        self.slices.restore(i)
        self._back(i)

    def hang(self, i: int) -> None:
        self.slices.hang(i)
        self._down()

    def suspend(self, i: int) -> None:
        self.slices.suspend(i)
        self._down()

    def wake(self, i: int) -> None:
        self.slices.wake(i)
        self._back(i)

    @property
    def hung(self) -> frozenset[int]:
        return frozenset(self.slices.states.hung)


class StepSchedule:
    """A fault schedule fired at the counted step dispatches of a backend.

    Args:
        schedule: the schedule's text (``lose:1@6,restore:1@12``).
        step_function: the loop's step function, as :class:`~elastic_dew.simulate.step_count.StepCount`'s.
        fault_log: the fault log's path, or ``None``.

    Raises:
        ValueError: a schedule that does not parse.
    """

    def __init__(self, schedule: str, step_function: str | None = None, fault_log: str | None = None,
                 attempts: str | None = None, watch: str | None = None):
        from elastic_dew.proxy.records import StateRecords
        from elastic_dew.simulate.schedule import parse_schedule

        self.schedule = parse_schedule(schedule)
        self.step_function = step_function
        self.counter = StepCount(step_function)
        self.fault_log = fault_log
        self.attempts_file = attempts
        self.runner: Any = None
        self.attempts: list[dict[str, Any]] = []
        self.pid: int | None = None
        self._unmet = False  # a loss fired and no slice-down error has been answered since
        self._met_since_step = False  # since its last step the program met the loss of a slice it ran on
        self._step_epochs: tuple[tuple[int, int], ...] = ()  # the epochs of the last step's slices
        self._step_slices: frozenset[int] = frozenset()  # the last step's slices
        self._probed: set[int] = set()  # the slices the program probed since its last step
        self._probes_seen = False  # the program's health check probes were seen
        self._slices: Any = None
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)  # notified as a returned slice is seen or taken
        self._returned: dict[int, int] = {}  # each returned slice not yet seen: its live probes since
        #: What the backend sees of the program's state, as the in-process watch's records.
        self.records = StateRecords(watch)
        self.step_mark: Any = None  # the mark of the results of the step ``before`` counted
        self._waited = False  # since the last slice went down the program met it and probed the slices
        self._backend: Any = None

    def process_started(self, pid: int) -> None:
        """A new process of the run starts (``pid``): its steps count from 1 (the fault log
        keeps what fired), its start and attempts are recorded under ``pid``."""
        with self._lock:
            self.pid = pid
            self.counter = StepCount(self.step_function)
            self._met_since_step = self._probes_seen = False
            self._probed = set()
            self._returned.clear()
            self._taken.notify_all()
            self._step_slices = frozenset()
            self._waited = False
            self.attempts = []
            self.records.process_started(pid)
            self._record({"pid": pid, "start": True, "wall": time.time()})

    def _record(self, line: dict[str, Any]) -> None:
        if self.attempts_file is None:
            return
        import json
        from pathlib import Path

        from elastic_dew.rundir import fsync_append

        fsync_append(Path(self.attempts_file), json.dumps(line))

    @property
    def steps(self) -> int:
        return self.counter.steps

    def attach(self, backend: Any) -> None:
        """Fire the schedule on ``backend``'s slices at its step dispatches."""
        from elastic_dew.rundir import FaultLog
        from elastic_dew.simulate.runner import ScheduleRunner
        from elastic_dew.simulate.schedule import Target

        log = FaultLog(self.fault_log) if self.fault_log else None
        self._slices = backend.slices
        self._backend = backend
        target = cast(Target, _Target(backend.slices, lambda: self.pid, self._fired_loss, self._slice_back,
                                      self._slice_down))
        self.runner = ScheduleRunner(self.schedule, target, log, idle=self.idle)
        self.runner.__enter__()
        backend.stepper = self

    def _slice_down(self) -> None:
        with self._lock:
            self._waited = False

    def _fired_loss(self, index: int) -> None:
        with self._lock:
            self._unmet = True
            self._waited = False
            self._returned.pop(index, None)
            self._taken.notify_all()

    def _slice_back(self, index: int) -> None:
        with self._lock:
            if self._probes_seen:
                self._returned[index] = 0

    @property
    def holding(self) -> bool:
        """Whether a read of a step's results waits for the program to see a returned slice."""
        return bool(self._returned)

    def hold(self, producer: str | None, mark: Any = None) -> None:
        """Before a read of a result of program ``producer`` (its data marked ``mark``) is
        answered: when it is the loop's step, or made from one, and a slice came back, wait (at
        most :data:`TAKE_UP_WAIT_S`) until the program's ``Manager`` has seen it (its monitor
        probed the slice twice since with inputs sent after the return: its monitor polls again
        only once its first check that saw the slice has finished and recorded it; a probe whose
        input was sent while the slice was lost fails, and its check records nothing), the
        program took it up, or it was lost again. In-process the simulator shows the ``Manager``
        a returned slice at once, so a loop sees it at the step boundary the return fired at; the
        hold gives the proxy boundary the same step (``docs/pathways-boundary.md``, "The hold after a return")."""
        if not self._returned:
            return
        with self._taken:
            if not ((producer is not None and self.counter.is_step(producer))
                    or (mark is not None and mark.origin == "step")):
                return
            if not self._taken.wait_for(lambda: not self._returned, TAKE_UP_WAIT_S):
                logger.warning("the program's Manager did not probe returned slices %s within %g s: its read "
                               "is answered", sorted(self._returned), TAKE_UP_WAIT_S)
                self._returned.clear()

    def idle(self) -> bool:
        """Whether the program can reach no step now: a read of it waits on a hung slice, or
        since its last step it met a slice-down error while a slice that step ran on was lost
        (it retries: it waits for slices, then starts a new attempt)."""
        return self._met_since_step or (self._slices is not None and self._slices.states.idle())

    def met_loss(self) -> None:
        """The backend answered a request of the program with a slice-down error: the first
        such answer after a loss fired is recorded (``{"pid", "met": true, "wall"}``)."""
        with self._lock:
            if self._slices is not None and self._slices.lost_among(self._step_epochs):
                self._met_since_step = True  # not a probe of a slice outside the program's mesh
                self.records.detected()
            if not self._unmet:
                return
            self._unmet = False
            self._record({"pid": self.pid, "met": True, "wall": time.time()})

    def before(self, program: Any, in_bytes: int, out_bytes: int, slices: frozenset[int],
               chained: int = 0, marks: Any = ()) -> int | None:
        """Count this dispatch; fire what is due at its ``dispatch``. Its step, or ``None``
        (a step's results' mark is then :attr:`step_mark`; ``marks``: its inputs', ``None``
        when an input was lost before the dispatch)."""
        with self._lock:
            before = self.counter.steps
            step = self.counter.chained(program.name, in_bytes, out_bytes, chained)
            if step is None:
                if len(slices) == 1 and program.name in probe_programs():
                    self._probes_seen = True  # the health check probes each slice with a program of its own
                    self._waited = self._waited or self._met_since_step
                    self._probed |= slices
                    (probed_slice,) = slices
                    # a probe whose input reached the slice before it came back fails, as on Pathways: its
                    # check records nothing, so only a probe with live inputs counts as the monitor's
                    if probed_slice in self._returned and marks is not None:
                        self._returned[probed_slice] += 1
                        if self._returned[probed_slice] >= 2:
                            del self._returned[probed_slice]
                            self._taken.notify_all()
                return None
            if self._returned.keys() & slices:  # taken up
                for taken in self._returned.keys() & slices:
                    del self._returned[taken]
                self._taken.notify_all()
            retried, self._met_since_step = self._met_since_step, False
            if retried and self._slices is not None and slices & self._slices.states.lost:
                # dispatched before the program learned of the loss (a client that pipelines its
                # dispatches sends it after the read that failed): the old attempt's, not a retry's,
                # whose mesh holds no lost slice
                self._met_since_step, retried = True, False
            # elastic_retry's health check probes every slice, those the last step ran on among
            # them; the Manager's monitor probes only inactive ones, and one of its probes that
            # lands after an in-place take-up (a slice just made active) starts no attempt
            probed = bool(self._step_slices) and self._step_slices <= self._probed
            self._probed = set()
            self._step_epochs = self._slices.states.epochs_of(slices) if self._slices is not None else ()
            last_slices, self._step_slices = self._step_slices, slices
            if step <= before:  # the count started again: a new step function
                self.attempts = []
            moved = set(self.attempts[-1]["active"]) != set(slices) if self.attempts else True
            if not self.attempts or retried or probed or (moved and not self._probes_seen):
                self.attempts.append({"step": step, "active": sorted(slices), "wall": time.time()})
                self._record({"pid": self.pid, "active": sorted(slices), "step": step, "wall": time.time()})
                self.records.attempt_started(slices)
            elif slices - last_slices:  # a returned slice taken up in place: no new attempt
                self.records.taken_up(slices, slices - last_slices)
            # ``marks`` None: its inputs were lost before it was dispatched, so it is no step the
            # program's state went through (in-process such a dispatch fails at once)
            self.step_mark = None if marks is None else self.records.stepped(
                marks, self._snapshot_held, step - before if step > before else 1)
        self._fire("dispatch", step)
        return step

    def _snapshot_held(self, pid: int | None) -> int | None:
        """The newest position of a state process ``pid`` copied into host memory that the
        backend still holds readable, or ``None``."""
        backend = self._backend
        if backend is None:
            return None
        held = [a.mark.position for a in list(backend.arrays.values())
                if a.mark is not None and a.mark.origin == "snapshot" and a.mark.restored is None
                and a.mark.pid == pid and a.memory_kind in ("pinned_host", "unpinned_host")
                and backend.status(a) is None]
        return max(held, default=None)

    def placing(self, device_ids: Any, api: str) -> None:
        """``api`` puts work on ``device_ids``: recorded (``placed``) when, after the program met
        a loss and its retry probed the slices, it spans several slices, one of them down."""
        if not self._waited or self._slices is None:
            return
        slices = {self._slices.slice_of(d) for d in device_ids}
        down = slices & set(self._slices.states.down)
        if len(slices) > 1 and down:
            self.records.placed(down, api)

    def after(self, step: int | None) -> None:
        """Fire what is due at the ``step`` phase of the dispatch ``before`` counted."""
        if step is not None:
            self._fire("step", step)

    def _fire(self, phase: str, step: int) -> None:
        """Fire what is due; an ``error`` fails the request that dispatched the step."""
        import jax

        from elastic_dew.proxy.ifrt import INVALID_ARGUMENT, ProxyError

        try:
            self.runner.on_dispatch(phase, step)
        except jax.errors.JaxRuntimeError as error:
            raise ProxyError(INVALID_ARGUMENT, str(error).split(": ", 1)[-1]) from None

    def close(self) -> tuple[str, ...]:
        """Stop; the faults that never fired (each recorded in the fault log)."""
        if self.runner is None:
            return ()
        unfired = self.runner.report_unfired()
        self.runner.__exit__(None, None, None)
        return tuple(str(f) for f in unfired)

    def fired(self) -> list[str]:
        return [str(f) for f in self.schedule if self.runner is not None and f in self.runner.fired]
