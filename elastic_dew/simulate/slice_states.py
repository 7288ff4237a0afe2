"""The slices' health and what a read meets under it: the one fault state machine of both boundaries.

:class:`SliceStates` holds, for a set of slices, which are lost (with the error code a read
or a dispatch meets), which hung (stopped answering), which of those are suspended
(Pathways' transparent suspend), how often each woke, and each slice's *epoch*, counted up
whenever its data goes (at a loss, and at a return from a loss or a hang: what it held
meanwhile never comes back). It holds the wait of a read on a hung slice
(:meth:`SliceStates.await_answer`) and whether the program can reach no step boundary now
(:meth:`SliceStates.idle`: a read waits on a hung slice, or the program waits for slices),
which is when a time-keyed fault fires at once
(:class:`~elastic_dew.simulate.runner.ScheduleRunner`).

Both boundaries keep their slices here: the in-process simulator
(:class:`~elastic_dew.simulate.simulator.SimulatedSlices`, which marks each live array as a
transition happens) and the local Pathways backend (:class:`elastic_dew.proxy.backend.Slices`,
whose arrays remember the epochs of their slices), so a schedule moves both through the
same states and a read meets the same answer through either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from elastic_dew.simulate.schedule import SLICE_DOWN_CODES

__all__ = ["SliceStates", "HUNG_CODE"]

#: The code a read blocked on a hung slice fails with when the boundary stops under it (a
#: worker that stopped answering).
HUNG_CODE = "DEADLINE_EXCEEDED"


class SliceStates:
    """The health of ``count`` slices, under one lock and one condition.

    Every transition returns whether it changed anything (a loss of a lost slice, a
    restore of a healthy one do not); the caller does what its boundary does with the
    slice's arrays inside :attr:`answered` (the condition, whose lock is re-entrant).

    Args:
        count: how many slices (>= 1).
        on_change: called (under the lock) after every change of health.
        active: whether the boundary is active (reads may wait) from the start.
    """

    def __init__(self, count: int, on_change: Callable[[], None] = lambda: None, *, active: bool = True) -> None:
        self.count = count
        self._on_change = on_change
        #: Held while slice health changes.
        self.lock = threading.RLock()
        #: Notified at every change of health and when the boundary stops.
        self.answered = threading.Condition(self.lock)
        self.reset(active=active)

    def reset(self, *, active: bool = True) -> None:
        """Every slice healthy, nothing waiting; the boundary ``active`` or not."""
        with self.answered:
            self.codes: dict[int, str] = {}
            self.hung: frozenset[int] = frozenset()
            self.suspended: frozenset[int] = frozenset()
            self.wakes: dict[int, int] = {}
            self.epochs = [0] * self.count
            self.changes = 0
            self.active = active
            self.blocked_reads = 0
            self.waits = 0

    def stop(self) -> None:
        """The boundary stops: reads blocked on a hung slice give up."""
        with self.answered:
            self.active = False
            self.answered.notify_all()

    def check_index(self, index: int) -> None:
        """Raises ``ValueError`` when ``index`` is not a slice."""
        if not 0 <= index < self.count:
            raise ValueError(f"slice {index} does not exist: there are slices 0..{self.count - 1}")

    @property
    def lost(self) -> frozenset[int]:
        """The slices lost or hung now."""
        return frozenset(self.codes)

    @property
    def down(self) -> frozenset[int]:
        """The slices lost now and not hung (a dispatch onto one fails)."""
        return frozenset(self.codes) - self.hung

    def _set(self, codes: dict[int, str], hung: frozenset[int]) -> None:
        self.codes, self.hung = codes, hung
        self.changes += 1
        self._on_change()
        self.answered.notify_all()

    # ----------------------------------------------------------------- transitions

    def lose(self, i: int, code: str = SLICE_DOWN_CODES[0]) -> bool:
        """Slice ``i`` is lost with ``code``; whether it changed (a hung slice may be lost).

        Raises:
            ValueError: ``i`` is not a slice, or ``code`` is not a slice-down code.
        """
        self.check_index(i)
        if code not in SLICE_DOWN_CODES:
            raise ValueError(f"code {code!r} is not a slice-down code; use one of {', '.join(SLICE_DOWN_CODES)}")
        with self.answered:
            if i in self.codes and i not in self.hung:
                return False
            self.suspended = self.suspended - {i}
            self.epochs[i] += 1
            self._set({**self.codes, i: code}, self.hung - {i})
            return True

    def hang(self, i: int) -> bool:
        """Slice ``i`` stops answering; whether it changed (a lost slice does not hang)."""
        self.check_index(i)
        with self.answered:
            if i in self.codes:
                return False
            self._set({**self.codes, i: HUNG_CODE}, self.hung | {i})
            return True

    def suspend(self, i: int) -> bool:
        """Slice ``i`` stalls until :meth:`wake` (a hang that a wake ends with no error)."""
        with self.answered:
            if not self.hang(i):
                return False
            self.suspended = self.suspended | {i}
            return True

    def is_suspended(self, i: int) -> bool:
        with self.answered:
            return i in self.suspended and i in self.hung

    def wake(self, i: int) -> bool:
        """Slice ``i``'s suspension ends, its pending results arrive; ``False`` (nothing
        changed) when it was not suspended: the caller restores it then."""
        self.check_index(i)
        with self.answered:
            if not self.is_suspended(i):
                return False
            self.suspended = self.suspended - {i}
            self.wakes[i] = self.wakes.get(i, 0) + 1
            codes = dict(self.codes)
            del codes[i]
            self._set(codes, self.hung - {i})
            return True

    def restore(self, i: int) -> bool:
        """Slice ``i`` is healthy again; what it held while down stays lost (its epoch moves)."""
        self.check_index(i)
        with self.answered:
            if i not in self.codes:
                return False
            codes = dict(self.codes)
            del codes[i]
            self.suspended = self.suspended - {i}
            self.epochs[i] += 1
            self._set(codes, self.hung - {i})
            return True

    # ----------------------------------------------------------------- what a read meets

    def epochs_of(self, slices: frozenset[int] | set[int]) -> tuple[tuple[int, int], ...]:
        """The epochs of ``slices`` now (sorted ``(slice, epoch)`` pairs)."""
        with self.answered:
            return tuple((s, self.epochs[s]) for s in sorted(slices))

    def gone(self, epochs: tuple[tuple[int, int], ...]) -> list[int]:
        """The slices of ``epochs`` whose data went since (lost now, or lost or returned since)."""
        with self.answered:
            return [s for s, epoch in epochs if (s in self.codes and s not in self.hung) or self.epochs[s] != epoch]

    def await_answer(self, hung: int) -> tuple[bool, bool, str]:
        """Block while slice ``hung`` stops answering (a read of its result waits).

        Returns:
            ``(released, woke, code)``: whether the boundary was still active when the wait
            ended, whether the slice woke from a suspension meanwhile (the result arrived),
            and the code it is down with now (the loss's code; a slice-down code once
            restored: its results never came).
        """
        with self.answered:
            wakes = self.wakes.get(hung, 0)
            self.blocked_reads += 1
            try:
                while self.active and hung in self.hung:
                    self.answered.wait()
            finally:
                self.blocked_reads -= 1
            released = self.active
            return released, self.wakes.get(hung, 0) > wakes, self.codes.get(hung, SLICE_DOWN_CODES[0])

    def waiting_for_slices(self, delta: int) -> None:
        """The program's wait for slices began (``+1``) or ended (``-1``)."""
        with self.answered:
            self.waits += delta

    def idle(self) -> bool:
        """Whether the program can reach no step boundary now: a read waits on a hung slice,
        or the program waits for slices."""
        return self.blocked_reads > 0 or self.waits > 0

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, or until a slice's health changes (a fault fired)."""
        with self.answered:
            seen = self.changes
            deadline = time.monotonic() + max(0.0, seconds)
            while self.active and self.changes == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.answered.wait(left)
