"""Orbax's experimental ``Snapshotter`` as tier 1 uses it: the private members it reads, checked,
and :class:`HostSnapshotter`, the subclass that reads them and ends Orbax's worker thread.

Each private member is declared in :data:`PRIVATE` (with why and what public API would replace
it), read against :data:`ORBAX_VERSION_READ` (the release the whole Orbax seam was read
against, with :func:`refusal`, its one wording of an installed release that differs; both
bound in :mod:`elastic_dew._compat.orbax` too).

**The experimental Snapshotter** (tier 1, :mod:`elastic_dew.elastic.state.snapshots`), in
``orbax/checkpoint/experimental/v1/_src/training/pathways/snapshotter.py``. Its public
surface serves saving (``save``), loading (``load``), waiting (``join``) and the newest
step (``latest``). Tier 1 also needs whether a request is still queued (so a skipped save
costs no packing, and whether a ``save`` took the state: ``save`` returns ``None`` either
way, and takes it exactly when nothing is queued, the training thread being its only
caller), and the stored replica trees themselves (to read the JSON leaf without touching
arrays, and to drop a snapshot whose buffers a failed load donated).
:class:`HostSnapshotter` holds them, where:

* ``_queue`` is a ``queue.Queue(maxsize=1)`` of requests the worker thread has not finished
  (its ``unfinished_tasks`` counts a request taken and still landing, as ``join`` does);
* ``_lock`` is the ``threading.Lock`` guarding ``_latest_snapshot``;
* ``_latest_snapshot`` is ``None`` or ``(replica_trees, step)``, set by the worker thread
  once a snapshot has landed in pinned host memory and by ``load``;
* ``_worker`` is the worker thread's loop (``threading.Thread(target=self._worker)``, started
  by ``__init__`` and kept in ``_worker_thread``), which unpacks each queued request as
  ``(state, step)`` before anything else and never returns: Orbax gives it no way to end,
  so every ``Snapshotter`` leaves a thread behind for the life of the process.
  :meth:`HostSnapshotter.stop` ends it with a request whose unpacking raises.
"""

from __future__ import annotations

import functools
import inspect
import queue
import threading
from typing import Any

from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter

from elastic_dew._compat import Private

__all__ = [
    "ORBAX_VERSION_READ",
    "refusal",
    "METHODS",
    "ATTRIBUTES",
    "PRIVATE",
    "HostSnapshotter",
    "Snapshotter",
    "snapshot_busy",
    "snapshot_landing",
    "class_incompatibilities",
    "instance_incompatibilities",
]

#: The orbax-checkpoint release whose internals this seam was written against.
ORBAX_VERSION_READ = "0.12.8"


def refusal(what: str, problems: list[str]) -> RuntimeError:
    """The error refusing an installed Orbax whose ``what`` lacks or changed the members in ``problems``."""
    return RuntimeError(
        f"the installed orbax-checkpoint's {what} differs from the one elastic_dew._compat.orbax was written "
        f"against ({ORBAX_VERSION_READ}): {'; '.join(problems)}; install orbax-checkpoint {ORBAX_VERSION_READ} "
        "or update the adapter"
    )


#: Methods used, with the parameter names (after ``self``) this module relies on.
METHODS: dict[str, tuple[str, ...]] = {
    "save": ("step", "state"),
    "load": (),  # called with the abstract state as its first argument
    "join": (),
    "_worker": (),
}

#: Instance attributes used, with the type each must have right after construction.
ATTRIBUTES: dict[str, tuple[type, ...]] = {
    "_queue": (queue.Queue,),
    "_lock": (type(threading.Lock()),),
    "_latest_snapshot": (type(None),),
    "_worker_thread": (threading.Thread,),
}


def class_incompatibilities(cls: type = Snapshotter) -> list[str]:
    """What of the methods this adapter relies on ``cls`` lacks or has changed, named."""
    problems = []
    for name, params in METHODS.items():
        method = inspect.getattr_static(cls, name, None)
        if method is None or not callable(getattr(cls, name, None)):
            problems.append(f"Snapshotter.{name} is gone (this adapter calls it)")
            continue
        names = list(inspect.signature(getattr(cls, name)).parameters)[1:]
        if names[: len(params)] != list(params):
            problems.append(
                f"Snapshotter.{name} takes ({', '.join(names)}), this adapter expects "
                f"({', '.join(params)}) first"
            )
    if not isinstance(inspect.getattr_static(cls, "latest", None), property):
        problems.append("Snapshotter.latest is no longer a property (this adapter reads it)")
    return problems


def instance_incompatibilities(snapshotter: Any) -> list[str]:
    """What of the instance attributes this adapter relies on a fresh ``snapshotter`` lacks."""
    problems = []
    for name, types in ATTRIBUTES.items():
        if not hasattr(snapshotter, name):
            problems.append(f"Snapshotter.{name} is gone (this adapter reads it)")
        elif not isinstance(getattr(snapshotter, name), types):
            problems.append(
                f"Snapshotter.{name} is a {type(getattr(snapshotter, name)).__name__}, this adapter "
                f"expects {' or '.join(t.__name__ for t in types)}"
            )
    if isinstance(getattr(snapshotter, "_queue", None), queue.Queue) and snapshotter._queue.maxsize != 1:
        problems.append(
            f"Snapshotter._queue holds {snapshotter._queue.maxsize} requests, this adapter "
            "expects 1 (a full queue means the next save is skipped)"
        )
    return problems


@functools.cache
def _snapshotter_probe() -> Any:
    """One fresh ``Snapshotter`` for the canary to look at (its worker thread stays: one a process)."""
    return Snapshotter(replica_axis_index=0)


_SNAPSHOTTER = "orbax.checkpoint.experimental.v1.training.pathways:Snapshotter"
_SNAPSHOTTER_WHY = {
    "_queue": "whether a request is still queued (a save now would be skipped, so tier 1 "
    "packs nothing), and where the stop request goes",
    "_lock": "guards _latest_snapshot",
    "_latest_snapshot": "the landed replica trees, read for the JSON leaf without touching "
    "arrays, and dropped when a failed load donated its buffers",
    "_worker_thread": "whether the worker runs; joined by stop, started again by a later save_or_skip",
    "_worker": "the worker's loop, ended by a stop request (Orbax gives it no way to end)",
}
PRIVATE: tuple[Private, ...] = tuple(
    Private(
        "orbax-checkpoint",
        f"{_SNAPSHOTTER}.{name}",
        why=why,
        instead="Snapshotter.save returning whether it took the state, a public read of the "
        "newest snapshot's trees and a drop of it, and a close() that ends the worker",
        probe=_snapshotter_probe if name in ATTRIBUTES else None,
    )
    for name, why in _SNAPSHOTTER_WHY.items()
)


def snapshot_busy(snapshotter: Any) -> bool:
    """Whether a request is still queued in ``snapshotter`` (any Orbax ``Snapshotter``), so
    that a ``save`` now would be skipped (``_queue``, declared above)."""
    return snapshotter._queue.full()


def snapshot_landing(snapshotter: Any) -> bool:
    """Whether ``snapshotter``'s worker has a request it has not finished (queued, or taken and
    still waiting for its copy to land in host memory): ``_queue``'s count of unfinished
    tasks, which ``join`` waits on."""
    return snapshotter._queue.unfinished_tasks > 0


class _StopWorker(BaseException):
    """Raised inside the worker thread to end it (``SystemExit``'s cousin: not an error)."""


class _StopRequest:
    """A queued request whose unpacking as ``(state, step)`` ends Orbax's worker loop."""

    def __iter__(self):
        raise _StopWorker


class HostSnapshotter(Snapshotter):
    """Orbax's Snapshotter with the few private reads tier 1 needs, as methods, and a way
    to end its worker thread (:meth:`stop`; a later :meth:`save_or_skip` starts a new one).

    Construction refuses, with the members named, an installed Orbax whose Snapshotter no
    longer has what these methods use, rather than failing later inside a training step.
    """

    def __init__(self, *, replica_axis_index: int = 0) -> None:
        problems = class_incompatibilities(Snapshotter)
        super().__init__(replica_axis_index=replica_axis_index)
        problems += instance_incompatibilities(self)
        if problems:
            raise refusal("Snapshotter", problems)
        self._worker_thread.name = "elastic-dew-snapshots"  # Orbax started it; it runs this class's _worker

    def busy(self) -> bool:
        """Whether a request is still queued, so that a ``save`` now would be skipped."""
        return snapshot_busy(self)

    def save_or_skip(self, step: int, tree: Any) -> bool:
        """``save(step, tree)``, returning whether Orbax took the tree or skipped it.

        ``save`` skips exactly when a request is still queued, and only the worker empties
        the queue, so with one caller a queue not full now is not full at ``save``'s own check.
        """
        if self.stopped():
            self._restart()
        if self.busy():
            return False
        self.save(step, tree)
        return True

    def newest(self) -> tuple[list[Any], int] | None:
        """The newest landed snapshot as ``(replica_trees, step)``, or ``None``."""
        with self._lock:
            return self._latest_snapshot

    def drop(self) -> None:
        """Forget the newest snapshot, releasing its pinned host memory."""
        with self._lock:
            self._latest_snapshot = None

    def _worker(self) -> None:
        # Orbax's loop, ended by a _StopRequest: it unpacks the request before its try.
        try:
            super()._worker()
        except _StopWorker:
            self._queue.task_done()

    def stopped(self) -> bool:
        """Whether the worker thread has ended (after :meth:`stop`)."""
        return not self._worker_thread.is_alive()

    def stop(self) -> None:
        """Let the queued request land, then end the worker thread and join it.

        Orbax's worker never returns on its own, so without this every snapshotter of a
        process that runs many trainings keeps a thread (and itself) alive to the end.
        Idempotent; a later :meth:`save_or_skip` starts a new worker.
        """
        if self.stopped():
            return
        self._queue.put(_StopRequest())
        self._worker_thread.join()

    def _restart(self) -> None:
        self._worker_thread = threading.Thread(target=self._worker, name="elastic-dew-snapshots", daemon=True)
        self._worker_thread.start()
