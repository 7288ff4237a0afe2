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
* small leaves are packed (:mod:`elastic_dew.elastic.state.packing`), by one jitted program on
  the mesh, before Orbax sees them: Orbax moves and splits each leaf in Python, so a state
  of many small leaves cost far more in dispatch than in bytes. The packed groups are held
  once per slice, split over its devices; the packing layout travels in the JSON leaf, and
  ``load`` unpacks straight onto the target shardings;
* the pack and the hand-over to Orbax stay on the loop, between the read of step N and the
  dispatch of step N+2: the snapshot's copies are then queued right behind the step in
  flight, so they land before the next step runs (from a hand-off thread they would queue
  behind step N+2 as well, and a loss two steps later would find no landed snapshot);
* ``Snapshotter.save`` silently skips a request while the previous one is still queued:
  :meth:`Snapshots.save` reports whether Orbax actually took the state and counts both.

Everything that needs the Snapshotter's private members goes through
:class:`~elastic_dew._compat.orbax_snapshotter.HostSnapshotter`, the one module that knows them.

The snapshot keeps device arrays in pinned host memory alive on purpose (that is the
snapshot): ``jax.live_arrays()`` lists them between attempts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elastic_dew._compat.orbax_snapshotter import HostSnapshotter
from elastic_dew.elastic.state import packing
from elastic_dew.elastic.state.meta import meta_json
from elastic_dew.elastic.state.programs import PrecompiledFunction

__all__ = ["Snapshots", "LoadedSnapshot"]

logger = logging.getLogger(__name__)

_STATE = "state"
_META = "meta"
_PACKED = "packed"
_LEAVES = "leaves"


class LoadedSnapshot(NamedTuple):
    """A snapshot loaded onto a mesh: the ``state``, the ``meta`` saved beside it and its
    ``step``. It unpacks as ``state, meta, step``."""

    state: Any
    meta: dict
    step: int


class Snapshots:
    """In-memory snapshots of a replicated training state (tier 1).

    ``replica_axis_index`` is the mesh axis that runs over slices; every array of the
    state must be replicated along it (the elastic layer's state is), so that the slices
    that survive a loss hold the whole state between them.

    Args:
        replica_axis_index: the mesh axis over slices.

    Raises:
        ValueError: ``replica_axis_index`` below 0.
    """

    def __init__(self, *, replica_axis_index: int = 0) -> None:
        if replica_axis_index < 0:
            raise ValueError(f"replica_axis_index={replica_axis_index} must be >= 0")
        self.replica_axis_index = replica_axis_index
        self._snapshotter = HostSnapshotter(replica_axis_index=replica_axis_index)
        self._lock = threading.Lock()
        self._programs = threading.Lock()  # the two caches below, shared with the precompiler
        self._packer_cache: dict[tuple, packing.Packer] = {}
        self._unpacker_cache: dict[tuple, PrecompiledFunction] = {}
        self.requested = 0
        self.taken = 0
        #: The pinned-host bytes of the newest snapshot on its fullest device, measured by
        #: :meth:`host_bytes_per_device_max` and kept by :meth:`close` (0 before any).
        self.host_bytes_per_device = 0

    def _on_mesh(self, state: Any, mesh: Mesh) -> tuple[list[tuple], Any, list[jax.Array]]:
        """Check every leaf, then replicate the ones that are not on ``mesh`` yet.

        Everything is checked before any array moves, so bad input touches nothing.
        Returns the leaves' paths, the tree structure and the placed leaves.
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
                    f"state leaf {packing.path_name(path)} is a {type(leaf).__name__}, not a jax.Array; "
                    "put it on the mesh, or carry it in meta"
                )
            sharding = leaf.sharding
            if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
                named = [a for dim in sharding.spec if dim is not None
                         for a in ((dim,) if isinstance(dim, str) else dim)]
                if replica_axis in named:
                    raise ValueError(
                        f"state leaf {packing.path_name(path)} is partitioned along the replica axis "
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
        return [path for path, _ in leaves], treedef, placed

    def _packer(self, paths: list[tuple], treedef: Any, leaves: list[jax.Array], mesh: Mesh) -> packing.Packer:
        """The cached packer for this tree structure, these shapes and dtypes, on ``mesh``."""
        key = (treedef, tuple((leaf.shape, leaf.dtype, leaf.sharding) for leaf in leaves), mesh)
        with self._programs:
            packer = self._packer_cache.get(key)
            if packer is None:
                made = packing.make_packer(paths, leaves, mesh, self.replica_axis_index)
                packer = self._packer_cache[key] = dataclasses.replace(made, pack=PrecompiledFunction(made.pack, mesh))
        return packer

    def precompile_saves(self, state: Any, mesh: Mesh) -> None:
        """Compile the pack of ``state``'s layout on ``mesh`` now, so the first :meth:`save`
        of that layout compiles nothing.

        The protocol calls this in the resume window (a resume's ``mesh_and_compile``), on
        the state it resumes from, which has the layout of every step's output. The pack is
        compiled, not run, and only when neither the precompiler nor an earlier save
        compiled it already; nothing reaches Orbax or the host.

        Args:
            state: the state the loop will save, on ``mesh``.
            mesh: the mesh it is on.

        Raises:
            ValueError: as :meth:`save` would, for a state it cannot snapshot.
        """
        paths, treedef, placed = self._on_mesh(state, mesh)
        packer = self._packer(paths, treedef, placed, mesh)
        to_pack = [leaf for leaf, p in zip(placed, packer.packed) if p]
        if to_pack:
            pack = packer.pack
            assert isinstance(pack, PrecompiledFunction), "this tier's packers are precompilable (_packer)"
            pack.compile(*to_pack)

    def precompile_resume(self, abstract_state: Any, mesh: Mesh) -> None:
        """Compile, running nothing, the programs a resume onto ``mesh`` would compile: the
        load's unpack of ``abstract_state``'s packing layout onto its shardings, and the
        pack of that layout for the saves after it.

        For the precompiler (:class:`~elastic_dew.elastic.loop.compiler.StepCompiler`), ahead of
        a loss: ``abstract_state`` is the program's state on the mesh a lost slice would
        leave, every leaf a ``jax.ShapeDtypeStruct`` with its ``NamedSharding`` on ``mesh``.
        A snapshot taken on a mesh of the same slice shape has this layout, so its
        :meth:`load` and the first :meth:`save` after it run both programs as compiled
        here (kept as executables, see :class:`~elastic_dew.elastic.state.programs.PrecompiledFunction`); one that starts while this
        compiles its program waits for it.
        Holds no lock of the snapshots themselves: saves and loads go on meanwhile.

        Args:
            abstract_state: the state's leaves as ``jax.ShapeDtypeStruct`` with their
                ``NamedSharding`` on ``mesh``.
            mesh: the mesh a resume may land on.
        """
        flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
        paths, leaves = [p for p, _ in flat], [leaf for _, leaf in flat]
        packer = self._packer(paths, treedef, leaves, mesh)
        to_pack = [leaf for leaf, p in zip(leaves, packer.packed) if p]
        if not to_pack:
            return
        pack = packer.pack
        assert isinstance(pack, PrecompiledFunction), "this tier's packers are precompilable (_packer)"
        pack.compile(*to_pack)
        layout = json.loads(packer.layout_json)
        targets = tuple(leaf.sharding for leaf, p in zip(leaves, packer.packed) if p)
        self._unpacker(layout, targets).compile(*packing.abstract_groups(layout, mesh, self.replica_axis_index))

    def save(self, step: int, state: Any, meta: dict, mesh: Mesh) -> bool:
        """Start an asynchronous snapshot of ``state`` after ``step`` updates.

        Args:
            step: the step whose state this is (>= 1).
            state: the state, replicated along the replica axis.
            meta: its JSON-able meta, restored with the arrays by :meth:`load`.
            mesh: the state's mesh.

        Returns:
            Whether Orbax took it: ``False`` when the previous snapshot was still queued
            (Orbax skips rather than stall the training loop).

        Raises:
            ValueError: a step below 1, or a state it cannot snapshot (a leaf that is not a
                ``jax.Array`` on ``mesh``, a mesh without the replica axis); nothing moved.
        """
        if step < 1:
            raise ValueError(f"snapshot step={step} must be >= 1 (the state after `step` updates)")
        encoded = meta_json(meta, "snapshot")
        paths, treedef, placed = self._on_mesh(state, mesh)
        packer = self._packer(paths, treedef, placed, mesh)
        with self._lock:
            self.requested += 1
            if self._snapshotter.busy():
                # Orbax would skip this one: do not spend a pack on it.
                took = False
            else:
                to_pack = [leaf for leaf, p in zip(placed, packer.packed) if p]
                snapshot = {
                    _STATE: {
                        _PACKED: packer.pack(*to_pack) if to_pack else [],
                        _LEAVES: [leaf for leaf, p in zip(placed, packer.packed) if not p],
                    },
                    # Both parts are canonical JSON already; joining them avoids re-encoding
                    # the (cached) layout on every step.
                    _META: '{"meta": ' + encoded + ', "packing": ' + packer.layout_json + "}",
                }
                took = self._snapshotter.save_or_skip(step, snapshot)
            if took:
                self.taken += 1
        if not took:
            logger.info("snapshot of step %d skipped: the previous one is still in flight", step)
        return took

    def join(self) -> None:
        """Block until every snapshot Orbax took has landed in host memory (or failed)."""
        self._snapshotter.join()

    def latest_step(self) -> int | None:
        """The step of the newest complete snapshot, or ``None``; joins first.

        Returns:
            The step, or ``None``.
        """
        self.join()
        latest = self._snapshotter.latest
        return None if latest is None else int(latest.step)

    def close(self) -> None:
        """Wait for queued saves, release the snapshot's pinned host memory and end
        Orbax's worker thread (a later save starts a new one).

        Orbax's worker thread would keep its ``Snapshotter`` alive for the life of the
        process, so a finished run drops the snapshot explicitly and stops the thread
        rather than waiting for garbage collection that never comes.
        """
        with self._lock:
            self.join()
            self.host_bytes_per_device_max()
            self._snapshotter.drop()
            self._snapshotter.stop()

    def host_bytes_per_device_max(self) -> int:
        """The newest snapshot's pinned-host bytes on the device holding the most (0 if none).

        Measured on the snapshot's own arrays: every shard of every replica tree counts
        on the device it lives on. The value is also kept in ``host_bytes_per_device``.

        Returns:
            The bytes.
        """
        latest = self._snapshotter.newest()
        if latest is None:
            return self.host_bytes_per_device
        per_device: dict[Any, int] = {}
        for tree in latest[0]:
            for leaf in jax.tree.leaves(tree):
                if not isinstance(leaf, jax.Array):
                    continue
                # From the shardings, not the buffers: a lost slice's replica is not read.
                shard = jax.ShapeDtypeStruct(leaf.sharding.shard_shape(leaf.shape), leaf.dtype)
                if packing.is_key(leaf.dtype):
                    shard = jax.eval_shape(jax.random.key_data, shard)
                shard_bytes = int(np.prod(shard.shape, dtype=np.int64)) * np.dtype(shard.dtype).itemsize
                for device in leaf.sharding.device_set:
                    per_device[device] = per_device.get(device, 0) + shard_bytes
        self.host_bytes_per_device = max(per_device.values(), default=0)
        return self.host_bytes_per_device

    def _stored_meta(self) -> tuple[dict, dict, int]:
        """The newest snapshot's ``(meta, packing layout, step)``, read from its JSON leaf.

        Orbax keeps non-array leaves as they are in every replica tree, so the first one
        has it; reading it needs no array and so cannot fail on a lost slice.
        """
        latest = self._snapshotter.newest()
        if latest is None:
            raise RuntimeError("no snapshot has completed yet; nothing to load")
        replica_trees, step = latest
        stored = json.loads(replica_trees[0][_META])
        return stored["meta"], stored["packing"], int(step)

    def load(self, abstract_state: Any) -> LoadedSnapshot:
        """Return the :class:`LoadedSnapshot` ``(state, meta, step)`` of the newest snapshot on ``abstract_state``'s shardings.

        Joins first. Replicas on lost slices are skipped. The snapshot is then re-split on
        the new mesh, so the next loss is survivable too.

        Args:
            abstract_state: the state's shapes and target shardings on the new mesh.

        Returns:
            The state, its meta and its step.

        Raises:
            RuntimeError: there is no snapshot, or no replica survived.
            ValueError: ``abstract_state`` is not the layout the snapshot was packed from;
                nothing was touched.
        """
        with self._lock:
            self.join()
            meta, layout, step = self._stored_meta()
            flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
            paths = [packing.path_name(p) for p, _ in flat]
            abstract = [leaf for _, leaf in flat]
            packing.check_layout(layout, paths, abstract)
            packed = [("group" in e) for e in layout["leaves"]]
            targets = tuple(leaf.sharding for leaf, p in zip(abstract, packed) if p)
            if targets:
                mesh = targets[0].mesh
                if any(t.mesh != mesh for t in targets):
                    raise ValueError(
                        "the abstract state's replicated leaves are on more than one mesh; "
                        "put every leaf of the abstract state on the new mesh"
                    )
                abstract_groups = packing.abstract_groups(layout, mesh, self.replica_axis_index)
            else:
                abstract_groups = []
            abstract_snapshot = {
                _STATE: {_PACKED: abstract_groups, _LEAVES: [a for a, p in zip(abstract, packed) if not p]},
                _META: "",
            }
            try:
                restored = self._snapshotter.load(abstract_snapshot)
                groups = restored[_STATE][_PACKED]
                unpacked = iter(self._unpacker(layout, targets)(*groups) if groups else [])
                passed = iter(restored[_STATE][_LEAVES])
                leaves = [next(unpacked) if p else next(passed) for p in packed]
                jax.block_until_ready(leaves)
            except BaseException:
                # pathwaysutils' concatenate_by_mesh_axis always donates the replicas it
                # joins, so a load that fails after joining them (a slice lost while the
                # state is placed on the new mesh) has consumed the snapshot. Drop it, so
                # the next attempt falls back to the persistent tier instead of reading
                # donated (deleted) replicas.
                self._snapshotter.drop()
                logger.warning(
                    "the load of snapshot %d failed after Orbax consumed its replicas; "
                    "the snapshot is dropped and the next attempt uses the persistent tier",
                    step,
                )
                raise
        return LoadedSnapshot(jax.tree_util.tree_unflatten(treedef, leaves), meta, step)

    def _unpacker(self, layout: dict, targets: tuple) -> PrecompiledFunction:
        key = (json.dumps(layout, sort_keys=True), targets)
        with self._programs:
            unpack = self._unpacker_cache.get(key)
            if unpack is None:
                unpack = self._unpacker_cache[key] = PrecompiledFunction(packing.unpack_fn(layout, targets), targets[0].mesh)
        return unpack
