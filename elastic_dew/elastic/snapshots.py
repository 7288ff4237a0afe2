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
* small leaves are packed, by one jitted program on the mesh, before Orbax sees them: Orbax
  moves and splits each leaf in Python (a ``device_put`` and a per-replica split per leaf),
  so a state of many small leaves cost far more in dispatch than in bytes. Fully replicated
  leaves are concatenated into one flat array per dtype, padded to a multiple of a slice's
  devices and sharded over them (replicated along the replica axis only), so they too are
  held once per slice, not once per device. A leaf sharded along one dimension (``data``
  under FSDP, ``model``) goes, with that dimension moved to the front, into one row per
  shard of a ``(shards, columns)`` array per dtype and mesh axes: each device packs its own
  shards, nothing moves between devices, and the slice still holds one copy. Other leaves
  pass through as they are. The packing layout (paths, shapes, dtypes, where each leaf
  lies) travels in the JSON leaf, and ``load`` unpacks straight onto the target shardings;
* the pack and the hand-over to Orbax stay on the loop, between the read of step N and the
  dispatch of step N+2: the snapshot's copies are then queued right behind the step in
  flight, so they land before the next step runs. (A hand-off thread was tried: it queued
  them behind step N+2 as well, and a loss two steps later found no landed snapshot.)
  On an accelerator the pack's dispatch returns at once; on a CPU backend it waits for the
  step in flight, so there a save's ``seconds`` include that step's remaining time (and
  the next step line is shorter by as much);
* ``Snapshotter.save`` silently skips a request while the previous one is still queued:
  :meth:`Snapshots.save` reports whether Orbax actually took the state and counts both.

Everything that needs the Snapshotter's private members goes through
:class:`~elastic_dew.elastic.orbax_private.HostSnapshotter`, the one module that knows them.

The snapshot keeps device arrays in pinned host memory alive on purpose (that is the
snapshot): ``jax.live_arrays()`` lists them between attempts.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from elastic_dew.elastic.meta import meta_json
from elastic_dew.elastic.orbax_private import HostSnapshotter

__all__ = ["Snapshots"]

logger = logging.getLogger(__name__)

_STATE = "state"
_META = "meta"
_PACKED = "packed"
_LEAVES = "leaves"
_FORMAT = 3


def _path_name(path: tuple) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _is_key(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


#: Leaves up to this size are packed. Packing saves Orbax's per-leaf dispatch, which is
#: what a small leaf costs; a large leaf's cost is its bytes, which packing would copy once
#: more on save and once more on load (the restore-bandwidth benchmark measured 512 MB
#: loading at 0.08 of memcpy packed against 0.21 unpacked).
PACK_MAX_BYTES = 4 * 2**20


@dataclass(frozen=True)
class _Packer:
    """How one state layout is packed: the jitted pack and its JSON description.

    ``layout`` lists every leaf of the state in flattening order: its path, shape and
    dtype, and for a packed leaf the group and where in it the leaf lies. Typed PRNG keys
    are packed as their key data, with the key implementation recorded.
    """

    packed: tuple[bool, ...]
    pack: Callable[..., list[jax.Array]]
    layout_json: str


def _slice_axes(mesh: Mesh, replica_axis_index: int) -> tuple[tuple[str, ...], int]:
    """The mesh axes inside a slice (all but the replica axis) and their device count."""
    axes = tuple(a for i, a in enumerate(mesh.axis_names) if i != replica_axis_index)
    return axes, int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64))


def _group_sharding(mesh: Mesh, replica_axis_index: int, group: dict) -> NamedSharding:
    """A packed group's sharding: its rows split over a slice's devices, replicated across slices.

    A ``flat`` group (replicated leaves, concatenated) is split over every axis inside the
    slice when its padded length divides; a ``rows`` group (sharded leaves) keeps one row
    per shard, on the mesh axes the leaves were sharded over.
    """
    if group["kind"] == "rows":
        return NamedSharding(mesh, PartitionSpec(tuple(group["axes"]), None))
    axes, devices = _slice_axes(mesh, replica_axis_index)
    if not axes or group["padded"] % devices:
        return NamedSharding(mesh, PartitionSpec())
    return NamedSharding(mesh, PartitionSpec(axes))


def _row_axes(leaf: jax.Array) -> tuple[int, tuple[str, ...], int] | None:
    """``(dimension, mesh axes, shards)`` of a leaf sharded along exactly one dimension, else ``None``.

    Such a leaf packs without moving a byte between devices: with that dimension moved to
    the front and the rest flattened, each row is one device's shard.
    """
    sharding = leaf.sharding
    if not isinstance(sharding, NamedSharding) or _is_key(leaf.dtype):
        return None
    split = [(d, (a,) if isinstance(a, str) else tuple(a)) for d, a in enumerate(sharding.spec) if a is not None]
    if len(split) != 1:
        return None
    dim, axes = split[0]
    shards = int(np.prod([sharding.mesh.shape[a] for a in axes], dtype=np.int64))
    if shards < 2 or leaf.shape[dim] % shards:
        return None
    return dim, axes, shards


def _plan(paths: list[str], leaves: list[jax.Array], packed: tuple[bool, ...], devices: int = 1) -> dict:
    """The JSON-able packing layout of ``leaves``.

    Fully replicated leaves go into one ``flat`` group per dtype, padded to a multiple of
    ``devices`` (a slice's); a leaf sharded along one dimension goes into the ``rows``
    group of its dtype and mesh axes, as columns of a ``(shards, columns)`` array.
    """
    groups: list[dict] = []
    index: dict[tuple, int] = {}
    entries = []
    for path, leaf, is_packed in zip(paths, leaves, packed):
        entry: dict[str, Any] = {"path": path, "shape": list(leaf.shape), "dtype": str(leaf.dtype)}
        if is_packed:
            if _is_key(leaf.dtype):
                entry["key_impl"] = str(jax.random.key_impl(leaf))
                data = jax.eval_shape(jax.random.key_data, leaf)
            else:
                data = leaf
            size = int(np.prod(data.shape, dtype=np.int64))
            rows = None if leaf.sharding.is_fully_replicated else _row_axes(leaf)
            if rows is None:
                key: tuple = ("flat", str(data.dtype))
            else:
                dim, axes, shards = rows
                key = ("rows", str(data.dtype), axes)
            if key not in index:
                index[key] = len(groups)
                group = {"kind": key[0], "dtype": key[1], "size": 0}
                if rows is not None:
                    group.update(axes=list(axes), rows=shards)
                groups.append(group)
            group = groups[index[key]]
            entry.update(group=index[key], offset=group["size"], data_shape=list(data.shape))
            if rows is None:
                entry["size"] = size
                group["size"] += size
            else:
                entry.update(size=size // shards, dim=dim)
                group["size"] += size // shards  # columns
        entries.append(entry)
    for group in groups:
        if group["kind"] == "flat":
            group["padded"] = -(-group["size"] // devices) * devices
    return {"format": _FORMAT, "groups": groups, "leaves": entries}


def _abstract_group(group: dict, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    shape = (group["rows"], group["size"]) if group["kind"] == "rows" else (group["padded"],)
    return jax.ShapeDtypeStruct(shape, jnp.dtype(group["dtype"]), sharding=sharding)


def _pack_fn(layout: dict, mesh: Mesh, replica_axis_index: int) -> Callable[..., list[jax.Array]]:
    """A jitted pack of the packed leaves into their groups, on each group's sharding.

    A flat group is the leaves raveled and concatenated (and padded); a rows group is each
    leaf with its sharded dimension moved to the front, reshaped to one row per shard, and
    the leaves concatenated along the columns: every device packs its own shards.
    """
    packed_entries = [e for e in layout["leaves"] if "group" in e]
    groups = layout["groups"]

    def pack(*leaves):
        parts: list[list[jax.Array]] = [[] for _ in groups]
        for entry, leaf in zip(packed_entries, leaves):
            data = jax.random.key_data(leaf) if "key_impl" in entry else leaf
            group = groups[entry["group"]]
            if group["kind"] == "rows":
                parts[entry["group"]].append(jnp.moveaxis(data, entry["dim"], 0).reshape(group["rows"], -1))
            else:
                parts[entry["group"]].append(jnp.ravel(data))
        out = []
        for group, part in zip(groups, parts):
            if group["kind"] == "rows":
                out.append(jnp.concatenate(part, axis=1) if len(part) > 1 else part[0])
                continue
            if group["padded"] > group["size"]:
                part.append(jnp.zeros(group["padded"] - group["size"], jnp.dtype(group["dtype"])))
            out.append(jnp.concatenate(part) if len(part) > 1 else part[0])
        return out

    return jax.jit(pack, out_shardings=[_group_sharding(mesh, replica_axis_index, g) for g in groups])


def _unpack_fn(layout: dict, shardings: tuple) -> Callable[..., list[jax.Array]]:
    """A jitted split + reshape of the groups straight onto the packed leaves' shardings."""
    packed_entries = [e for e in layout["leaves"] if "group" in e]
    kinds = [g["kind"] for g in layout["groups"]]

    def unpack(*groups):
        out = []
        for entry in packed_entries:
            group, start, size = groups[entry["group"]], entry["offset"], entry["size"]
            shape = entry["data_shape"]
            if kinds[entry["group"]] == "rows":
                dim = entry["dim"]
                moved = [shape[dim]] + [n for d, n in enumerate(shape) if d != dim]
                data = jnp.moveaxis(group[:, start:start + size].reshape(moved), 0, dim)
            else:
                data = jax.lax.slice(group, (start,), (start + size,)).reshape(shape)
            out.append(jax.random.wrap_key_data(data, impl=entry["key_impl"]) if "key_impl" in entry else data)
        return out

    return jax.jit(unpack, out_shardings=list(shardings))


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
        self._snapshotter = HostSnapshotter(replica_axis_index=replica_axis_index)
        self._lock = threading.Lock()
        self._packers: dict[tuple, _Packer] = {}
        self._unpackers: dict[tuple, Callable[..., list[jax.Array]]] = {}
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
        return [path for path, _ in leaves], treedef, placed

    def _packer(self, paths: list[tuple], treedef: Any, leaves: list[jax.Array], mesh: Mesh) -> _Packer:
        """The cached packer for this tree structure, these shapes and dtypes, on ``mesh``."""
        key = (treedef, tuple((leaf.shape, leaf.dtype, leaf.sharding) for leaf in leaves), mesh)
        packer = self._packers.get(key)
        if packer is None:
            packed = tuple(
                leaf.nbytes <= PACK_MAX_BYTES and (leaf.sharding.is_fully_replicated or _row_axes(leaf) is not None)
                for leaf in leaves
            )
            if sum(packed) < 2:  # packing one leaf saves no dispatch and costs a copy each way
                packed = (False,) * len(leaves)
            _, devices = _slice_axes(mesh, self.replica_axis_index)
            layout = _plan([_path_name(p) for p in paths], leaves, packed, devices)
            packer = _Packer(packed, _pack_fn(layout, mesh, self.replica_axis_index), json.dumps(layout, sort_keys=True))
            self._packers[key] = packer
        return packer

    def save(self, step: int, state: Any, meta: dict, mesh: Mesh) -> bool:
        """Start an asynchronous snapshot of ``state`` after ``step`` updates.

        Returns whether Orbax took it: ``False`` when the previous snapshot was still
        queued (Orbax skips rather than stall the training loop). ``meta`` must be a
        JSON-able dict; it is restored with the arrays by :meth:`load`.
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
                took = self._snapshotter.offer(step, snapshot)
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
            self.host_bytes_per_device_max()
            self._snapshotter.drop()

    def host_bytes_per_device_max(self) -> int:
        """The newest snapshot's pinned-host bytes on the device holding the most (0 if none).

        Measured on the snapshot's own arrays: every shard of every replica tree counts
        on the device it lives on. The value is also kept in ``host_bytes_per_device``.
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
                if _is_key(leaf.dtype):
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

    @staticmethod
    def _check_layout(layout: dict, paths: list[str], abstract: list[Any]) -> None:
        """Refuse an abstract state that is not the state the snapshot was packed from."""
        entries = layout["leaves"]
        if layout.get("format") != _FORMAT or len(entries) != len(abstract):
            raise ValueError(
                f"the snapshot holds a state of {len(entries)} leaves, the abstract state has "
                f"{len(abstract)}; load it with the abstract state of the program that saved it"
            )
        for entry, path, leaf in zip(entries, paths, abstract):
            got = (path, list(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", type(leaf).__name__)))
            want = (entry["path"], entry["shape"], entry["dtype"])
            if got != want:
                raise ValueError(
                    f"the snapshot's leaf {want[0]} has shape {tuple(want[1])} and dtype {want[2]}, "
                    f"but the abstract state has {got[0]} with shape {tuple(got[1])} and dtype {got[2]}; "
                    "load it with the abstract state of the program that saved it"
                )
            if "group" in entry and not isinstance(getattr(leaf, "sharding", None), NamedSharding):
                raise ValueError(
                    f"abstract leaf {path} has no NamedSharding ({getattr(leaf, 'sharding', None)}); "
                    "give every leaf of the abstract state a NamedSharding on the new mesh"
                )

    def load(self, abstract_state: Any) -> tuple[Any, dict, int]:
        """Return ``(state, meta, step)`` of the newest snapshot on ``abstract_state``'s shardings.

        Joins first. Replicas on lost slices are skipped; ``RuntimeError`` when there is no
        snapshot or no replica survived; ``ValueError``, before anything is touched, when
        ``abstract_state`` is not the layout the snapshot was packed from. The snapshot is
        then re-split on the new mesh, so the next loss is survivable too.
        """
        with self._lock:
            self.join()
            meta, layout, step = self._stored_meta()
            flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
            paths = [_path_name(p) for p, _ in flat]
            abstract = [leaf for _, leaf in flat]
            self._check_layout(layout, paths, abstract)
            packed = [("group" in e) for e in layout["leaves"]]
            targets = tuple(leaf.sharding for leaf, p in zip(abstract, packed) if p)
            if targets:
                mesh = targets[0].mesh
                if any(t.mesh != mesh for t in targets):
                    raise ValueError(
                        "the abstract state's replicated leaves are on more than one mesh; "
                        "put every leaf of the abstract state on the new mesh"
                    )
                abstract_groups = [
                    _abstract_group(g, _group_sharding(mesh, self.replica_axis_index, g))
                    for g in layout["groups"]
                ]
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
                # donated buffers (which crashes the process on CPU).
                self._snapshotter.drop()
                logger.warning(
                    "the load of snapshot %d failed after Orbax consumed its replicas; "
                    "the snapshot is dropped and the next attempt uses the persistent tier",
                    step,
                )
                raise
        return jax.tree_util.tree_unflatten(treedef, leaves), meta, step

    def _unpacker(self, layout: dict, targets: tuple) -> Callable[..., list[jax.Array]]:
        key = (json.dumps(layout, sort_keys=True), targets)
        unpack = self._unpackers.get(key)
        if unpack is None:
            unpack = self._unpackers[key] = _unpack_fn(layout, targets)
        return unpack
