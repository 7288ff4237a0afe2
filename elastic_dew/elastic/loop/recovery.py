"""How long a recovery took, phase by phase: the durations of a ``Resume`` event.

A recovery from a lost slice has four phases (:data:`~elastic_dew.elastic.events.DURATION_KEYS`):

* ``detection``: from the start of the step that failed to pathwaysutils reporting the loss;
* ``wait_for_slices``: from that report to the start of the next attempt (pathwaysutils
  waits for enough healthy slices in between);
* ``mesh_and_compile``: building the new mesh and getting its compiled step;
* ``restore``: loading the newest state onto the mesh and repositioning the data.

:class:`RecoveryTimer` is told when each step starts, when a slice is lost and when an
attempt starts (pathwaysutils' callbacks); :meth:`RecoveryTimer.recover` then hands the
attempt a :class:`Recovery` that times the last two phases and builds the durations. A
scale-up is a recovery with nothing to detect or wait for (:meth:`Recovery.live`).
"""

from __future__ import annotations

import time

__all__ = ["RecoveryTimer", "Recovery"]


class Recovery:
    """The phases of one recovery, timed as they end (``lap``)."""

    def __init__(self, detection: float, wait_for_slices: float) -> None:
        self.durations = {"detection": detection, "wait_for_slices": wait_for_slices}
        self._since = time.monotonic()

    @classmethod
    def live(cls) -> Recovery:
        """A recovery in place (scale-up): no loss to detect, no slices to wait for."""
        return cls(0.0, 0.0)

    def lap(self, phase: str) -> None:
        """``phase`` ended now; it began when the previous phase (or the recovery) ended.
        A phase that ends a second time adds the time since to its duration."""
        now = time.monotonic()
        self.durations[phase] = self.durations.get(phase, 0.0) + now - self._since
        self._since = now


class RecoveryTimer:
    """Marks when steps start, slices are lost and attempts start; plain numbers only."""

    def __init__(self) -> None:
        self._step_started = 0.0
        self._lost_at: float | None = None
        self._detection = 0.0
        self._attempt_started = 0.0

    def step_started(self, now: float) -> None:
        """A step began at ``now`` (``time.monotonic()``).

        Args:
            now: ``time.monotonic()`` at the step's start.
        """
        self._step_started = now

    def slice_lost(self) -> None:
        """pathwaysutils reported a lost slice (its elastic-event callback)."""
        now = time.monotonic()
        self._lost_at = now
        self._detection = now - self._step_started if self._step_started else 0.0

    def attempt_started(self) -> None:
        """pathwaysutils starts an attempt (its pre-callback, after the wait for slices)."""
        self._attempt_started = time.monotonic()

    def recover(self) -> Recovery:
        """The recovery an attempt begins now, with the loss it recovers from (if any) consumed.

        Returns:
            The :class:`Recovery` that times it.
        """
        started = self._attempt_started or time.monotonic()
        wait = started - self._lost_at if self._lost_at is not None else 0.0
        detection, self._lost_at, self._detection = self._detection, None, 0.0
        return Recovery(detection, wait)
