"""Phase hooks: the seam where fault injection meets the elastic layer.

The elastic layer announces each phase of its work (a step's computation, a snapshot
save, a checkpoint restore, ...) with :func:`phase`. Nothing listens in production, so a
phase costs one empty-list check. The simulator (:mod:`elastic_dew.simulate`) registers a
listener that fires scheduled faults at the first announcement of a phase whose step is at
or after the fault's step. The elastic layer never imports the simulator; the simulator
imports this module.

What travels back from the simulator to the running loop (the faults it fires, the work in
flight it finishes first) is :mod:`elastic_dew.elastic.relay`'s.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping

from elastic_dew._deprecation import moved_names

__all__ = ["PHASES", "PHASE_TABLE", "Phase", "phase", "add_listener", "remove_listener", "Listener"]


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase the elastic layer announces.

    ``meaning``: what is under way when it is announced, and the step it belongs to.
    ``meets_in_flight``: what the phase starts depends on whether the run's work in flight
    has landed (a snapshot save is skipped while the previous snapshot's copy to host memory
    still runs), so an injector that must be deterministic lands that work
    (:func:`elastic_dew.elastic.relay.finish_in_flight`) before it acts on the announcement. Every phase declares it.

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


#: What left the public list in 0.2.0 for :mod:`elastic_dew.elastic.relay` (the simulator's and
#: the loop's own plumbing), served from here with a warning until 0.3.
__getattr__ = moved_names(__name__, {
    "report": "elastic_dew.elastic.relay.report",
    "receiving": "elastic_dew.elastic.relay.receiving",
    "landing": "elastic_dew.elastic.relay.finishing_in_flight",
    "land_in_flight": "elastic_dew.elastic.relay.finish_in_flight",
})
