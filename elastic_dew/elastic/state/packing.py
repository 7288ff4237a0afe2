"""Leaf packing: many small leaves of a state as a few arrays, and back, by one jitted program each way.

Moving a state leaf by leaf costs a Python dispatch per leaf (a ``device_put``, a split per
replica), so a state of many small leaves costs far more in dispatch than in bytes. This
codec packs the leaves that qualify into groups before anything moves them and unpacks the
groups straight onto the target shardings afterwards:

* fully replicated leaves are raveled and concatenated into one ``flat`` array per dtype,
  padded to a multiple of a slice's devices and sharded over them (replicated along the
  replica axis only), so they are held once per slice, not once per device;
* a leaf sharded along exactly one dimension (``data`` under FSDP, ``model``) goes, with
  that dimension moved to the front, into one row per shard of a ``(shards, columns)``
  ``rows`` array per dtype and mesh axes: each device packs its own shards, nothing moves
  between devices;
* leaves over :data:`PACK_MAX_BYTES`, leaves sharded any other way, and a lone qualifying
  leaf pass through as they are (packing them would only add a copy each way).

The packing layout (every leaf's path, shape, dtype, and for a packed leaf its group and
place in it; typed PRNG keys as their key data with the key implementation) is a JSON
document (:attr:`Packer.layout_json`, format :data:`FORMAT`), so whatever stores the groups
can store the layout beside them and unpack without the packing program. The in-memory
snapshots (:mod:`elastic_dew.elastic.state.snapshots`) are its user.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = [
    "FORMAT",
    "PACK_MAX_BYTES",
    "Packer",
    "make_packer",
    "abstract_groups",
    "check_layout",
    "unpack_fn",
    "path_name",
    "is_key",
    "unwrap_keys",
    "abstract_key_data",
    "rewrap_keys",
]

#: The layout document's format; a layout of another format is refused by :func:`check_layout`.
FORMAT = 3

#: Leaves up to this size are packed. Packing saves per-leaf dispatch, which is what a
#: small leaf costs; a large leaf's cost is its bytes, which packing would copy once more
#: each way (``docs/performance.md`` has the restore bandwidth measured either way).
PACK_MAX_BYTES = 4 * 2**20


def path_name(path: tuple) -> str:
    """A leaf's path as the layout names it (``jax.tree_util.keystr``; ``<root>`` for a bare leaf)."""
    return jax.tree_util.keystr(path) or "<root>"


def is_key(dtype: Any) -> bool:
    """Whether ``dtype`` is a typed PRNG key's (packed as its key data)."""
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _holds_keys(x: Any) -> bool:
    return hasattr(x, "dtype") and is_key(x.dtype)


def unwrap_keys(state: Any) -> Any:
    """``state`` with every typed PRNG key replaced by its key data (Orbax's array handlers,
    which the checkpoints save through, need plain dtypes)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _holds_keys(x) else x, state)


def abstract_key_data(abstract: Any) -> Any:
    """``abstract`` with every typed-key leaf replaced by its key data's shape and dtype."""

    def convert(x: Any) -> Any:
        if not _holds_keys(x):
            return x
        shape = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
        return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=x.sharding)

    return jax.tree.map(convert, abstract)


def rewrap_keys(restored: Any, abstract: Any) -> Any:
    """Typed keys again where ``abstract`` has them (a key's dtype names its implementation)."""
    return jax.tree.map(
        lambda x, a: jax.random.wrap_key_data(x, dtype=a.dtype) if _holds_keys(a) and not _holds_keys(x) else x,
        restored,
        abstract,
    )


@dataclass(frozen=True)
class Packer:
    """How one state layout is packed: which leaves, the jitted pack, its JSON description.

    ``packed[i]`` says whether leaf ``i`` (in flattening order) goes into a group;
    ``pack(*packed_leaves)`` returns the groups in layout order; ``layout_json`` is the
    canonical JSON layout that :func:`unpack_fn` and :func:`abstract_groups` read back.
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


def _key_impl(leaf: Any) -> str:
    """The key implementation's name of a typed PRNG key leaf, a key array or an abstract one."""
    if isinstance(leaf, jax.Array):
        return str(jax.random.key_impl(leaf))
    names: list[str] = []
    jax.eval_shape(lambda key: names.append(str(jax.random.key_impl(key))), leaf)
    return names[0]


def _nbytes(leaf: Any) -> int:
    """A leaf's bytes, a device array's or an abstract one's (``jax.ShapeDtypeStruct``)."""
    if isinstance(leaf, jax.Array):
        return int(leaf.nbytes)
    data = jax.eval_shape(jax.random.key_data, leaf) if is_key(leaf.dtype) else leaf
    return int(np.prod(data.shape, dtype=np.int64)) * np.dtype(data.dtype).itemsize


def _row_axes(leaf: jax.Array) -> tuple[int, tuple[str, ...], int] | None:
    """``(dimension, mesh axes, shards)`` of a leaf sharded along exactly one dimension, else ``None``.

    Such a leaf packs without moving a byte between devices: with that dimension moved to
    the front and the rest flattened, each row is one device's shard.
    """
    sharding = leaf.sharding
    if not isinstance(sharding, NamedSharding) or is_key(leaf.dtype):
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
            if is_key(leaf.dtype):
                entry["key_impl"] = _key_impl(leaf)
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
    return {"format": FORMAT, "groups": groups, "leaves": entries}


def _pack_fn(layout: dict, mesh: Mesh, replica_axis_index: int) -> Callable[..., list[jax.Array]]:
    """A jitted pack of the packed leaves into their groups, on each group's sharding.

    A flat group is the leaves raveled and concatenated (and padded); a rows group is each
    leaf with its sharded dimension moved to the front, reshaped to one row per shard, and
    the leaves concatenated along the columns: every device packs its own shards.
    """
    packed_entries = [e for e in layout["leaves"] if "group" in e]
    groups = layout["groups"]

    def pack(*leaves: jax.Array) -> list[jax.Array]:
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


def make_packer(paths: list[tuple], leaves: list[Any], mesh: Mesh, replica_axis_index: int) -> Packer:
    """The :class:`Packer` of ``leaves`` (with their tree ``paths``) on ``mesh``.

    ``leaves`` are device arrays or abstract ones (``jax.ShapeDtypeStruct`` with their
    shardings): the layout and the pack depend only on shapes, dtypes and shardings.

    A leaf is packed when it is at most :data:`PACK_MAX_BYTES` and fully replicated or
    sharded along one dimension; when fewer than two qualify nothing is packed (one leaf
    saves no dispatch and costs a copy each way). Building the packer compiles nothing: the
    pack is compiled on its first call.
    """
    packed = tuple(
        _nbytes(leaf) <= PACK_MAX_BYTES and (leaf.sharding.is_fully_replicated or _row_axes(leaf) is not None)
        for leaf in leaves
    )
    if sum(packed) < 2:
        packed = (False,) * len(leaves)
    _, devices = _slice_axes(mesh, replica_axis_index)
    layout = _plan([path_name(p) for p in paths], leaves, packed, devices)
    return Packer(packed, _pack_fn(layout, mesh, replica_axis_index), json.dumps(layout, sort_keys=True))


def abstract_groups(layout: dict, mesh: Mesh, replica_axis_index: int) -> list[jax.ShapeDtypeStruct]:
    """The groups of ``layout`` as abstract arrays on ``mesh`` (what a load asks its store for)."""
    out = []
    for group in layout["groups"]:
        shape = (group["rows"], group["size"]) if group["kind"] == "rows" else (group["padded"],)
        sharding = _group_sharding(mesh, replica_axis_index, group)
        out.append(jax.ShapeDtypeStruct(shape, jnp.dtype(group["dtype"]), sharding=sharding))
    return out


def check_layout(layout: dict, paths: list[str], abstract: list[Any]) -> None:
    """Refuse (``ValueError``) an abstract state that is not the state ``layout`` was packed from."""
    entries = layout["leaves"]
    if layout.get("format") != FORMAT or len(entries) != len(abstract):
        raise ValueError(
            f"the packed state has {len(entries)} leaves, the abstract state has "
            f"{len(abstract)}; load it with the abstract state of the program that saved it"
        )
    for entry, path, leaf in zip(entries, paths, abstract):
        got = (path, list(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", type(leaf).__name__)))
        want = (entry["path"], entry["shape"], entry["dtype"])
        if got != want:
            raise ValueError(
                f"the packed state's leaf {want[0]} has shape {tuple(want[1])} and dtype {want[2]}, "
                f"but the abstract state has {got[0]} with shape {tuple(got[1])} and dtype {got[2]}; "
                "unpack it with the abstract state of the program that packed it"
            )
        if "group" in entry and not isinstance(getattr(leaf, "sharding", None), NamedSharding):
            raise ValueError(
                f"abstract leaf {path} has no NamedSharding ({getattr(leaf, 'sharding', None)}); "
                "give every leaf of the abstract state a NamedSharding on the new mesh"
            )


def unpack_fn(layout: dict, shardings: tuple) -> Callable[..., list[jax.Array]]:
    """A jitted split + reshape of ``layout``'s groups straight onto the packed leaves' ``shardings``."""
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
