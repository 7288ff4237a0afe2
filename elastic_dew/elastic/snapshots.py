"""Tier 1: in-memory snapshots in pinned host memory, over Orbax's ``Snapshotter``.

Orbax's :class:`Snapshotter` copies the state from accelerator memory to pinned host memory
on every slice, asynchronously, split into one tree per replica along the replica axis. When
a slice is lost, ``load`` keeps the replicas that can still be read and puts the state onto
the new (smaller or larger) mesh without touching storage. This module adds what a training
loop needs around it:

* the state's non-array companions (step, data position, ...) travel with the arrays as one
  JSON string leaf, so a snapshot is always self-consistent and nothing is pickled;
* single-device arrays, and arrays placed on another mesh, are first replicated onto the
  training mesh, as the Pathways guide requires; an array *partitioned* along the replica
  axis is refused, because the surviving slices would not hold a whole copy of it;
* ``Snapshotter.save`` silently skips a request while the previous one is still queued:
  :meth:`Snapshots.save` reports whether Orbax actually took the state and counts both.

The snapshot keeps device arrays in pinned host memory alive on purpose (that is the
snapshot): ``jax.live_arrays()`` lists them between attempts.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter

from elastic_dew.elastic.meta import meta_json

__all__ = ["Snapshots"]

logger = logging.getLogger(__name__)

_STATE = "state"
_META = "meta"


class _TakingSnapshotter(Snapshotter):
    """Orbax's Snapshotter, telling whether its last ``save`` took the state.

    ``Snapshotter.save`` returns ``None`` whether it queued the state or skipped it
    because a transfer was still queued; it converts the state to per-replica host trees
    only when it takes it, so that conversion is the signal.
    """

    took = False

    def _to_snapshot_state(self, state: Any) -> list[Any]:
        self.took = True
        return super()._to_snapshot_state(state)


def _path_name(path: tuple) -> str:
    return jax.tree_util.keystr(path) or "<root>"


class Snapshots:
    """In-memory snapshots of a replicated training state (tier 1).

    ``replica_axis_index`` is the mesh axis that runs over slices; every array of the
    state must be replicated along it (the elastic layer's state is), so that the slices
    that survive a loss hold the whole state between them.
    """

    def __init__(self, *, replica_axis_index: int = 0) -> None:
        if replica_axis_index < 0:
            raise ValueError(f"replica_axis_index={replica_axis_index} must be >= 0")
        self.replica_axis_index = replica_axis_index
        self._snapshotter = _TakingSnapshotter(replica_axis_index=replica_axis_index)
        self._lock = threading.Lock()
        self.requested = 0
        self.taken = 0

    def _on_mesh(self, state: Any, mesh: Mesh) -> Any:
        """Check every leaf, then replicate the ones that are not on ``mesh`` yet.

        Everything is checked before any array moves, so bad input touches nothing.
        """
        if self.replica_axis_index >= len(mesh.axis_names):
            raise ValueError(
                f"replica_axis_index={self.replica_axis_index} is outside the mesh axes "
                f"{mesh.axis_names}; build the mesh with the replica axis at that index"
            )
        replica_axis = mesh.axis_names[self.replica_axis_index]
        leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
        moves = []
        for path, leaf in leaves:
            if not isinstance(leaf, jax.Array):
                raise ValueError(
                    f"state leaf {_path_name(path)} is a {type(leaf).__name__}, not a jax.Array; "
                    "put it on the mesh, or carry it in meta"
                )
            sharding = leaf.sharding
            if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
                named = [a for dim in sharding.spec if dim is not None
                         for a in ((dim,) if isinstance(dim, str) else dim)]
                if replica_axis in named:
                    raise ValueError(
                        f"state leaf {_path_name(path)} is partitioned along the replica axis "
                        f"{replica_axis!r} (spec {sharding.spec}); a snapshot needs it replicated "
                        "along that axis so the surviving slices hold a whole copy"
                    )
                moves.append(False)
            else:
                moves.append(True)
        replicated = NamedSharding(mesh, PartitionSpec())
        placed = [
            jax.device_put(leaf, replicated) if move else leaf
            for (_, leaf), move in zip(leaves, moves)
        ]
        return jax.tree_util.tree_unflatten(treedef, placed)

    def save(self, step: int, state: Any, meta: dict, mesh: Mesh) -> bool:
        """Start an asynchronous snapshot of ``state`` after ``step`` updates.

        Returns whether Orbax took it: ``False`` when the previous snapshot was still
        queued (Orbax skips rather than stall the training loop). ``meta`` must be a
        JSON-able dict; it is restored with the arrays by :meth:`load`.
        """
        if step < 1:
            raise ValueError(f"snapshot step={step} must be >= 1 (the state after `step` updates)")
        encoded = meta_json(meta, "snapshot")
        placed = self._on_mesh(state, mesh)
        with self._lock:
            self.requested += 1
            self._snapshotter.took = False
            self._snapshotter.save(step, {_STATE: placed, _META: encoded})
            took = self._snapshotter.took
            if took:
                self.taken += 1
        if not took:
            logger.info("snapshot of step %d skipped: the previous one is still in flight", step)
        return took

    def join(self) -> None:
        """Block until every snapshot Orbax took has landed in host memory (or failed)."""
        self._snapshotter.join()

    def latest_step(self) -> int | None:
        """The step of the newest complete snapshot, or ``None``; joins first."""
        self.join()
        latest = self._snapshotter.latest
        return None if latest is None else int(latest.step)

    def close(self) -> None:
        """Wait for queued saves, then release the snapshot's pinned host memory.

        Orbax's worker thread keeps its ``Snapshotter`` alive for the life of the process,
        so a finished run drops the snapshot explicitly rather than waiting for garbage
        collection that never comes.
        """
        with self._lock:
            self.join()
            self._snapshotter._latest_snapshot = None

    def load(self, abstract_state: Any) -> tuple[Any, dict, int]:
        """Return ``(state, meta, step)`` of the newest snapshot on ``abstract_state``'s shardings.

        Joins first. Replicas on lost slices are skipped; ``RuntimeError`` when there is no
        snapshot or no replica survived. The snapshot is then re-split on the new mesh, so
        the next loss is survivable too.
        """
        with self._lock:
            self.join()
            latest = self._snapshotter.latest
            if latest is None:
                raise RuntimeError("no snapshot has completed yet; nothing to load")
            try:
                restored = self._snapshotter.load({_STATE: abstract_state, _META: ""})
            except BaseException:
                # pathwaysutils' concatenate_by_mesh_axis always donates the replicas it
                # joins, so a load that fails after joining them (a slice lost while the
                # state is placed on the new mesh) has consumed the snapshot. Drop it, so
                # the next attempt falls back to the persistent tier instead of reading
                # donated buffers (which crashes the process on CPU).
                self._snapshotter._latest_snapshot = None
                logger.warning(
                    "the load of snapshot %d failed after Orbax consumed its replicas; "
                    "the snapshot is dropped and the next attempt uses the persistent tier",
                    latest.step,
                )
                raise
            step = int(latest.step)
        return restored[_STATE], json.loads(restored[_META]), step
