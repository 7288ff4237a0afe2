"""Phase hooks: the seam where fault injection meets the elastic layer.

The elastic layer announces each phase of its work (a step's computation, a snapshot
save, a checkpoint restore, ...) with :func:`phase`. Nothing listens in production, so a
phase costs one empty-list check. The simulator (:mod:`elastic_dew.simulate`) registers a
listener that fires scheduled faults at the first announcement of a phase whose step is at
or after the fault's step. The elastic layer never imports the simulator; the simulator
imports this module.

Events travel back the same way: while an :class:`~elastic_dew.elastic.loop.protocol.ElasticRun`
runs, it receives every event :func:`report` is given (a fault the simulator fires), so a
fault joins the run's one event stream when it fires, in order with the loop's own events.

Work the run leaves in flight is landed the same way: while a run is inside
:func:`landing`, :func:`land_in_flight` finishes it (a snapshot's transfer to host memory).
The simulator lands it before each phase that meets it (:attr:`Phase.meets_in_flight`: a
snapshot save) and before each step-keyed fault fires, so what a save and a fault meet
depends on the schedule alone, not on how long a transfer took.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = [
    "PHASES", "PHASE_TABLE", "Phase", "phase", "add_listener", "remove_listener", "Listener", "report", "receiving",
    "landing", "land_in_flight",
]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase the elastic layer announces.

    ``meaning``: what is under way when it is announced, and the step it belongs to.
    ``meets_in_flight``: what the phase starts depends on whether the run's work in flight
    has landed (a snapshot save is skipped while the previous snapshot's copy to host memory
    still runs), so an injector that must be deterministic lands that work
    (:func:`land_in_flight`) before it acts on the announcement. Every phase declares it.

    Args:
        name: the phase's name, as schedules write it (``step``, ``checkpoint``, ...).
        meaning: what is under way when it is announced, and the step it belongs to.
        meets_in_flight: whether what it starts depends on the work in flight having landed.
    """

    name: str
    meaning: str
    meets_in_flight: bool


#: Every phase the elastic layer announces, by name, in the order the grammar lists them.
PHASE_TABLE: Mapping[str, Phase] = {
    entry.name: entry
    for entry in (
        Phase("step", "during step S's computation (after dispatch, before its result is read)",
              meets_in_flight=False),
        Phase("snapshot", "while the in-memory snapshot of step S is being saved", meets_in_flight=True),
        Phase("snapshot_load", "while an attempt that resumes at step S loads a snapshot", meets_in_flight=False),
        Phase("checkpoint", "while the persistent checkpoint of step S is being saved", meets_in_flight=False),
        Phase("checkpoint_restore", "while an attempt that resumes at step S restores a checkpoint",
              meets_in_flight=False),
        Phase("compile", "while an attempt that resumes at step S builds its mesh and compiles",
              meets_in_flight=False),
        Phase("scale_up", "while slices are being added after step S", meets_in_flight=False),
        Phase("stop", "while the preemption stop at step S is being written", meets_in_flight=False),
        Phase("dispatch", "just before step S is dispatched (a loss here fails the dispatch)",
              meets_in_flight=False),
        Phase("wait", "when the run starts waiting for slices after step S (a loss)", meets_in_flight=False),
        Phase("eval", "during the evaluation pass after step S (dispatched, result not read)",
              meets_in_flight=False),
    )
}
#: The phase names, in the order of :data:`PHASE_TABLE`.
PHASES: tuple[str, ...] = tuple(PHASE_TABLE)

#: What :func:`add_listener` takes: called with each announced phase's name and step.
Listener = Callable[[str, int], None]

_listeners: list[Listener] = []
_receivers: list[Callable[[Any], None]] = []
_landers: list[Callable[[], None]] = []
_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    """Call ``listener(phase, step)`` at every phase announcement until removed.

    Args:
        listener: called as ``listener(phase, step)``.
    """
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    """Stop calling ``listener``; removing one that is not registered is a no-op.

    Args:
        listener: a listener given to :func:`add_listener`.
    """
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def phase(name: str, step: int) -> None:
    """Announce that phase ``name`` of step ``step`` is under way.

    A listener may raise (a simulated fault surfacing) or send a signal to this process;
    either propagates to the caller exactly as a real fault at that point would.

    Args:
        name: one of :data:`PHASES`.
        step: the step the phase belongs to (see each phase's meaning in :data:`PHASE_TABLE`).

    Raises:
        ValueError: ``name`` is not a phase (only while a listener is registered: with none,
            an announcement costs one empty-list check and checks nothing).
        Exception: whatever a listener raises (a simulated fault surfacing), as a real fault
            at that point would.
    """
    if not _listeners:
        return
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(name, step)


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
def landing(land: Callable[[], None]) -> Iterator[None]:
    """While inside, :func:`land_in_flight` calls ``land()``, which finishes the work in flight.

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


def land_in_flight() -> None:
    """Finish the work in flight of every run inside :func:`landing` (none: a no-op).

    Called by a fault injector on the loop's thread, never while a slice hangs (the work
    could be waiting on it, and only the loop's bounded reads end a hang).
    """
    with _lock:
        landers = list(_landers)
    for land in landers:
        land()
