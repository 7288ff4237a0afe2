"""The one place that touches the private members of Orbax's experimental ``Snapshotter``.

Tier 1 (:mod:`elastic_dew.elastic.snapshots`) needs three things Orbax's public API does not
give: whether a ``save`` took the state or skipped it (``save`` returns ``None`` either way),
whether a request is still queued (so a skipped save costs no packing), and the stored
replica trees themselves (to read the JSON leaf without touching arrays, and to drop a
snapshot whose buffers a failed load donated). Every such use is a method of
:class:`HostSnapshotter` below, so an Orbax release that renames or reshapes them breaks
this module alone, and ``tests/test_orbax_adapter.py`` names the member that changed.

Read against orbax-checkpoint 0.12.8
(``orbax/checkpoint/experimental/v1/_src/training/pathways/snapshotter.py``), where:

* ``_to_snapshot_state(self, state)`` converts a state to per-replica host trees, and is
  called by ``save`` only when it queues the state;
* ``_queue`` is a ``queue.Queue(maxsize=1)`` of requests the worker thread has not finished;
* ``_lock`` is the ``threading.Lock`` guarding ``_latest_snapshot``;
* ``_latest_snapshot`` is ``None`` or ``(replica_trees, step)``, set by the worker thread
  once a snapshot has landed in pinned host memory and by ``load``.
"""

from __future__ import annotations

import inspect
import queue
import threading
from typing import Any

from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter

__all__ = ["HostSnapshotter", "ORBAX_VERSION_READ", "class_incompatibilities", "instance_incompatibilities"]

#: The orbax-checkpoint release whose Snapshotter this adapter was written against.
ORBAX_VERSION_READ = "0.12.8"

#: Methods used, with the parameter names (after ``self``) this module relies on.
METHODS: dict[str, tuple[str, ...]] = {
    "_to_snapshot_state": ("state",),
    "save": ("step", "state"),
    "load": (),  # called with the abstract state as its first argument
    "join": (),
}

#: Instance attributes used, with the type each must have right after construction.
ATTRIBUTES: dict[str, tuple[type, ...]] = {
    "_queue": (queue.Queue,),
    "_lock": (type(threading.Lock()),),
    "_latest_snapshot": (type(None),),
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


class HostSnapshotter(Snapshotter):
    """Orbax's Snapshotter with the few private reads tier 1 needs, as methods.

    Construction refuses, with the members named, an installed Orbax whose Snapshotter no
    longer has what these methods use, rather than failing later inside a training step.
    """

    took = False

    def __init__(self, *, replica_axis_index: int = 0) -> None:
        problems = class_incompatibilities(Snapshotter)
        super().__init__(replica_axis_index=replica_axis_index)
        problems += instance_incompatibilities(self)
        if problems:
            raise RuntimeError(
                f"the installed orbax-checkpoint's Snapshotter differs from the one "
                f"elastic_dew.elastic.orbax_snapshotter was written against "
                f"({ORBAX_VERSION_READ}): {'; '.join(problems)}; install orbax-checkpoint "
                f"{ORBAX_VERSION_READ} or update the adapter"
            )

    def _to_snapshot_state(self, state: Any) -> list[Any]:
        # ``save`` converts the state only when it takes it: that conversion is the signal.
        self.took = True
        return super()._to_snapshot_state(state)

    def busy(self) -> bool:
        """Whether a request is still queued, so that a ``save`` now would be skipped."""
        return self._queue.full()

    def offer(self, step: int, tree: Any) -> bool:
        """``save(step, tree)``, returning whether Orbax took the tree or skipped it."""
        self.took = False
        self.save(step, tree)
        return self.took

    def newest(self) -> tuple[list[Any], int] | None:
        """The newest landed snapshot as ``(replica_trees, step)``, or ``None``."""
        with self._lock:
            return self._latest_snapshot

    def drop(self) -> None:
        """Forget the newest snapshot, releasing its pinned host memory."""
        with self._lock:
            self._latest_snapshot = None
