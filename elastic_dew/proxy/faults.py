"""Faults at the proxy boundary: the schedule fired at the steps the backend sees dispatched.

Through the proxy nothing runs in the program's process but the program, so the steps are
counted where Pathways would see them: at the backend, from the programs it is asked to
run. :class:`StepCounter` is the simulator's step rule read at the boundary (a program's
carried bytes are those of its arguments that are its own earlier results, at most its
results'; the loop's step is the
program that carries the most, or the one named with ``step_function``: see
:meth:`elastic_dew.simulate.SimulatedSlices.step_of`), without the caller frame the
boundary cannot see. :class:`StepSchedule` fires a fault schedule with the simulator's
:class:`~elastic_dew.simulate.schedule.ScheduleRunner` at those counted dispatches
(``dispatch`` before a step runs, ``step`` after), on the backend's slices, and records each
run attempt's slices: a step whose program spans other slices than the previous one starts
a new attempt (the retry on a smaller mesh, the scale-up). It also records when the program
first met a loss that fired (the backend answered one of its requests with ``DATA_LOSS``),
so the verdict can tell a loss the program handled from one it never saw.

The boundary serves the slice faults (``lose``, ``restore``) and, to a program that announced
its process, ``preempt`` and ``kill``; a schedule with any other action is refused with the
reason (:func:`check_served`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, cast

__all__ = ["MIN_STEP_BYTES", "SERVED_ACTIONS", "StepCounter", "StepSchedule", "check_served"]

logger = logging.getLogger(__name__)

#: The fewest bytes a step carries: less is a counter or a PRNG key carried along (4-16 bytes).
MIN_STEP_BYTES = 64

#: The schedule actions the proxy boundary fires: slice losses and returns at the backend, a
#: preemption (SIGTERM) or a kill (SIGKILL) to the program's process, once it announced itself
#: (:mod:`elastic_dew.proxy.exec_program`).
SERVED_ACTIONS = ("lose", "restore", "preempt", "kill")


def check_served(schedule: Any) -> None:
    """Refuse a schedule with an action the proxy boundary does not serve.

    Raises:
        ValueError: naming the action and what the boundary serves.
    """
    for fault in schedule:
        if fault.action not in SERVED_ACTIONS:
            raise ValueError(
                f"fault {str(fault)!r}: the proxy boundary fires {', '.join(SERVED_ACTIONS)} only "
                f"(a {fault.action} acts inside the program's process; run it in-process, without --boundary proxy)")


class StepCounter:
    """Which dispatches are the loop's steps, read from the programs alone.

    The boundary sees no caller, so it tells the loop's step from an initialiser's or a
    library's programs by what a training step does: it carries its state from one dispatch
    to the next. A program becomes the step when a dispatch of it takes a result of its own
    earlier dispatch (the state) and that state (the bytes of those arguments, at most its
    results') is at least half the bytes of the largest step so far; its earlier dispatches count too (the first step took the initial state). From
    then on every dispatch of a program of that name counts (a retry recompiles it for the
    smaller mesh under the same name, and its first dispatch takes a restored state). A
    program that chains carrying more than twice the largest so far supersedes the steps
    counted before (a data generator's key, split step by step): only its name counts from
    then on, with the count its own dispatches give. The rule reads only the programs and
    their arrays, never the time, so the same loop counts the same steps. A program that
    carries fewer than :data:`MIN_STEP_BYTES` (a step counter, a PRNG key) is never the step.

    Args:
        step_function: count every dispatch of the function of this name (``train_step``
            for ``jax.jit(train_step)``, whose program is ``jit_train_step``) instead.
    """

    def __init__(self, step_function: str | None = None):
        self.step_function = step_function
        self.steps = 0
        self._largest = 0
        self._names: set[str] = set()
        self._dispatches: dict[str, int] = {}

    def count(self, name: str, in_bytes: int, out_bytes: int, chained: int = 0) -> int | None:
        """The step number of this dispatch of program ``name``, or ``None`` when it is not one.

        ``chained`` is how many bytes of its arguments are results of its own earlier
        dispatches (the state it carries; 0: none). Only those count as carried: an eager
        op fed one scalar of its own earlier result (jax 0.12's ``random.normal`` runs
        ``multiply`` twice, the second on the first's scalar) carries that scalar, not
        the array beside it."""
        carried = min(chained, out_bytes) if chained else min(in_bytes, out_bytes)
        seen = self._dispatches[name] = self._dispatches.get(name, 0) + 1
        if self.step_function is not None:
            if name not in (self.step_function, f"jit_{self.step_function}"):
                return None
            self.steps += 1
        elif name in self._names:
            self.steps += 1
        elif chained and carried >= MIN_STEP_BYTES and 2 * carried >= self._largest:
            if self._names and carried > 2 * self._largest:
                logger.info("program %s carries %d bytes, more than twice %s: it is the step function",
                            name, carried, sorted(self._names))
                self._names, self.steps = set(), 0
            self._names.add(name)
            self.steps += seen
        else:
            return None
        self._largest = max(self._largest, carried)
        logger.info("step %d: program %s carries %d bytes", self.steps, name, carried)
        return self.steps


class _Target:
    """The schedule runner's target: the backend's slices (a loss reads as DATA_LOSS), and the
    program's process for a preemption or a kill."""

    def __init__(self, slices: Any, pid: Any, lost: Any):
        self.slices = slices
        self._pid = pid
        self._lost = lost

    def end_process(self, signum: int) -> None:
        import os

        pid = self._pid()
        if pid is None:
            logger.error("no program process announced itself: signal %d goes nowhere", signum)
            return
        logger.warning("signal %d to the program's process %d", signum, pid)
        os.kill(pid, signum)

    def lose(self, i: int, code: str = "DATA_LOSS") -> None:
        self.slices.lose(i)
        self._lost()

    def restore(self, i: int) -> None:
        self.slices.restore(i)

    @property
    def hung(self) -> frozenset[int]:
        return frozenset()


class StepSchedule:
    """A fault schedule fired at the counted step dispatches of a backend.

    Args:
        schedule: the schedule's text (``lose:1@6,restore:1@12``).
        step_function: as :class:`StepCounter`'s.
        fault_log: the fault log's path, or ``None``.

    Raises:
        ValueError: a schedule that does not parse, or that the boundary does not serve.
    """

    def __init__(self, schedule: str, step_function: str | None = None, fault_log: str | None = None,
                 attempts: str | None = None):
        from elastic_dew.simulate.schedule import parse_schedule

        self.schedule = parse_schedule(schedule)
        check_served(self.schedule)
        self.step_function = step_function
        self.counter = StepCounter(step_function)
        self.fault_log = fault_log
        self.attempts_file = attempts
        self.runner: Any = None
        self.attempts: list[dict[str, Any]] = []
        self.pid: int | None = None
        self._unmet = False  # a loss fired and no DATA_LOSS has been answered since
        self._lock = threading.Lock()

    def process_started(self, pid: int) -> None:
        """A new process of the run starts (``pid``): its steps count from 1 (the fault log
        keeps what fired), its start and attempts are recorded under ``pid``."""
        with self._lock:
            self.pid = pid
            self.counter = StepCounter(self.step_function)
            self.attempts = []
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
        # A Target for the actions this boundary serves: check_served refused the others.
        target = cast(Target, _Target(backend.slices, lambda: self.pid, self._fired_loss))
        self.runner = ScheduleRunner(self.schedule, target, log)
        self.runner.__enter__()
        backend.stepper = self

    def _fired_loss(self) -> None:
        with self._lock:
            self._unmet = True

    def met_loss(self) -> None:
        """The backend answered a request of the program with ``DATA_LOSS``: the first such
        answer after a loss fired is recorded (``{"pid", "met": true, "wall"}``)."""
        with self._lock:
            if not self._unmet:
                return
            self._unmet = False
            self._record({"pid": self.pid, "met": True, "wall": time.time()})

    def before(self, program: Any, in_bytes: int, out_bytes: int, slices: frozenset[int],
               chained: int = 0) -> int | None:
        """Count this dispatch; fire what is due at its ``dispatch``. Its step, or ``None``."""
        with self._lock:
            before = self.counter.steps
            step = self.counter.count(program.name, in_bytes, out_bytes, chained)
            if step is None:
                return None
            if step <= before:  # the count started again: a new step function
                self.attempts = []
            if not self.attempts or set(self.attempts[-1]["active"]) != set(slices):
                self.attempts.append({"step": step, "active": sorted(slices), "wall": time.time()})
                self._record({"pid": self.pid, "active": sorted(slices), "step": step, "wall": time.time()})
        self.runner.on_dispatch("dispatch", step)
        return step

    def after(self, step: int | None) -> None:
        """Fire what is due at the ``step`` phase of the dispatch ``before`` counted."""
        if step is not None:
            self.runner.on_dispatch("step", step)

    def close(self) -> tuple[str, ...]:
        """Stop; the faults that never fired (each recorded in the fault log)."""
        if self.runner is None:
            return ()
        unfired = self.runner.report_unfired()
        self.runner.__exit__(None, None, None)
        return tuple(str(f) for f in unfired)

    def fired(self) -> list[str]:
        return [str(f) for f in self.schedule if self.runner is not None and f in self.runner.fired]
