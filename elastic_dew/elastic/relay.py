"""What travels from the simulator back to the running loop, beside the phase announcements.

While an :class:`~elastic_dew.elastic.loop.protocol.ElasticRun` runs it is
:func:`receiving`: every event :func:`report` is given (a fault the simulator fires) joins
the run's one event stream when it fires, in order with the loop's own events. And it is
:func:`finishing_in_flight`: :func:`finish_in_flight` finishes the work it leaves in flight
(a snapshot's transfer to host memory); the simulator calls it before each phase that meets
that work (:attr:`elastic_dew.elastic.hooks.Phase.meets_in_flight`: a snapshot save) and
before each step-keyed fault fires, so what a save and a fault meet depends on the schedule
alone, not on how long a transfer took. Not public: the simulator's and the loop's own seam.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["receiving", "report", "finishing_in_flight", "finish_in_flight"]

_receivers: list[Callable[[Any], None]] = []
_landers: list[Callable[[], None]] = []
_lock = threading.Lock()


@contextmanager
def receiving(receiver: Callable[[Any], None]) -> Iterator[None]:
    """While inside, ``receiver(event)`` is called with every event :func:`report` is given.

    Args:
        receiver: called with each reported event while the context is open.
    """
    with _lock:
        _receivers.append(receiver)
    try:
        yield
    finally:
        with _lock:
            _receivers.remove(receiver)


def report(event: Any) -> None:
    """Hand an event that happened outside the loop (a fault firing) to the running run.

    With no run receiving (the simulator under someone else's loop) it goes nowhere; the
    fault log still holds every fault.

    Args:
        event: the event (an :class:`~elastic_dew.elastic.events.Fault` as it fires).
    """
    with _lock:
        receivers = list(_receivers)
    for receiver in receivers:
        receiver(event)


@contextmanager
def finishing_in_flight(land: Callable[[], None]) -> Iterator[None]:
    """While inside, :func:`finish_in_flight` calls ``land()``, which finishes the work in flight.

    Args:
        land: finishes the run's work in flight (the snapshot being copied to host memory).
    """
    with _lock:
        _landers.append(land)
    try:
        yield
    finally:
        with _lock:
            _landers.remove(land)


def finish_in_flight() -> None:
    """Finish the work in flight of every run inside :func:`finishing_in_flight` (none: a no-op).

    Called by a fault injector on the loop's thread, never while a slice hangs (the work
    could be waiting on it, and only the loop's bounded reads end a hang).
    """
    with _lock:
        landers = list(_landers)
    for land in landers:
        land()
