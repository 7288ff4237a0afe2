"""The loop's one instrumentation channel: what the elastic layer is doing, as it does it.

The loop says two kinds of things here, both typed. :func:`phase` announces that a phase of
a step is under way (a step's computation, a snapshot save, a checkpoint restore, ...: each
declared once in :data:`PHASE_TABLE`); :func:`emit` tells an event that happened (a
:class:`~elastic_dew.elastic.events.Event`: a step read, a save, a stop, a resume, ...).
Whoever wants to know what a run does listens here (:func:`add_listener`,
:func:`listening`): the run's own record (an :class:`~elastic_dew.elastic.loop.protocol.ElasticRun`
hears the channel's events into its sink while it runs), the simulator (it fires scheduled
faults at phases and tells each fault it fires here, as a
:class:`~elastic_dew.elastic.events.Fault`, so the fault joins the run's events in order),
the local Pathways backend's forwarding (:mod:`elastic_dew.proxy.announce`) and the chaos
harness (:mod:`elastic_dew.testing`). A loop of your own may announce its phases here too
(``docs/simulator.md``). ``tests/test_layering.py`` names the modules that may tell and
listen.

A listener runs on the announcing thread, in the order listeners were added; it may block
that thread briefly (the simulator lands a snapshot copy in flight before a fault fires) and
what it raises propagates to the announcement, as a real fault at that point would. Nothing
listens in production: an announcement with no listener costs one empty-tuple check. The
elastic layer never imports the simulator; the simulator listens here.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from elastic_dew.elastic.events import Event, Sink

__all__ = ["PHASES", "PHASE_TABLE", "Phase", "phase", "emit", "add_listener", "remove_listener", "listening"]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase the elastic layer announces.

    ``meaning``: what is under way when it is announced, and the step it belongs to.
    ``meets_in_flight``: what the phase starts depends on whether the run's work in flight
    has landed (a snapshot save is skipped while the previous snapshot's copy to host memory
    still runs), so an injector that must be deterministic lands that work before it acts
    on the announcement (the simulator waits for the run's Orbax ``Snapshotter``). Every
    phase declares it.

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

# Replaced whole under the lock, read without it: an announcement reads one tuple.
_phase_listeners: tuple[Callable[[str, int], None], ...] = ()
_event_listeners: tuple[Sink, ...] = ()
_lock = threading.Lock()


def add_listener(listener: Callable[[str, int], None] | None = None, *, events: Sink | None = None) -> None:
    """Hear the channel until removed: ``listener(phase, step)`` at every phase announcement,
    ``events(event)`` at every event told.

    Args:
        listener: called as ``listener(phase, step)``, or ``None``.
        events: called with each event :func:`emit` is given, or ``None``.
    """
    global _phase_listeners, _event_listeners
    with _lock:
        if listener is not None:
            _phase_listeners = (*_phase_listeners, listener)
        if events is not None:
            _event_listeners = (*_event_listeners, events)


def remove_listener(listener: Callable[[str, int], None] | None = None, *, events: Sink | None = None) -> None:
    """Stop calling ``listener`` and ``events``; removing one that is not added is a no-op.

    Args:
        listener: a phase listener given to :func:`add_listener`, or ``None``.
        events: an event listener given to :func:`add_listener`, or ``None``.
    """
    global _phase_listeners, _event_listeners
    with _lock:
        if listener is not None and listener in _phase_listeners:
            at = _phase_listeners.index(listener)
            _phase_listeners = _phase_listeners[:at] + _phase_listeners[at + 1:]
        if events is not None and events in _event_listeners:
            at = _event_listeners.index(events)
            _event_listeners = _event_listeners[:at] + _event_listeners[at + 1:]


@contextmanager
def listening(listener: Callable[[str, int], None] | None = None, *, events: Sink | None = None) -> Iterator[None]:
    """Hear the channel while inside (:func:`add_listener`, then :func:`remove_listener`).

    Args:
        listener: called as ``listener(phase, step)``, or ``None``.
        events: called with each event told, or ``None``.
    """
    add_listener(listener, events=events)
    try:
        yield
    finally:
        remove_listener(listener, events=events)


def phase(name: str, step: int) -> None:
    """Announce that phase ``name`` of step ``step`` is under way.

    A listener may raise (a simulated fault surfacing) or send a signal to this process;
    either propagates to the caller exactly as a real fault at that point would.

    Args:
        name: one of :data:`PHASES`.
        step: the step the phase belongs to (see each phase's meaning in :data:`PHASE_TABLE`).

    Raises:
        ValueError: ``name`` is not a phase (only while a listener is registered: with none,
            an announcement costs one empty-tuple check and checks nothing).
        Exception: whatever a listener raises (a simulated fault surfacing), as a real fault
            at that point would.
    """
    listeners = _phase_listeners
    if not listeners:
        return
    if name not in PHASE_TABLE:
        raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}")
    for listener in listeners:
        listener(name, step)


def emit(event: Event) -> None:
    """Tell every event listener that ``event`` happened (in the order they were added).

    Args:
        event: a typed event (:mod:`elastic_dew.elastic.events`).

    Raises:
        Exception: whatever a listener raises.
    """
    for listener in _event_listeners:
        listener(event)
