"""How the training state is laid out inside a slice: replicated, FSDP, or a user's rule.

The mesh (:mod:`elastic_dew.elastic.slices.mesh`) has three axes. ``replica`` runs over slices:
the state is always *replicated* along it, so that the slices surviving a loss still hold a
whole copy between them. Inside a slice the state may be split over ``data`` (FSDP: each
data-parallel device keeps a share of each large leaf) and ``model`` (tensor parallelism).
This module is the one place that decides those shardings; the trainer compiles its step
with them, the protocol restores and scales up onto them, and the snapshots keep what they
give (one copy per slice, split over its devices).

A sharding policy is one of:

``"replicated"``
    every leaf whole on every device (the state must fit on one device);
``"fsdp"``
    each leaf of at least :data:`FSDP_MIN_BYTES` sharded over ``data`` along its largest
    dimension the ``data`` axis divides; smaller or indivisible leaves stay replicated;
a callable ``(path, leaf, mesh) -> PartitionSpec``
    ``path`` is the leaf's key path inside the parameters, ``leaf`` a
    ``jax.ShapeDtypeStruct``; the spec may name ``data`` and ``model``, never ``replica``.

Only parameters take the policy. Optimizer-state subtrees that mirror the parameters (Optax
moments: the parameters' tree structure and shapes) follow the parameters' shardings; every
other leaf (step counts, the PRNG key) is replicated.

Leaves that are not floating point (typed PRNG keys, integer counters such as Flax NNX's
``RngCount``, booleans) are replicated under ``replicated`` and ``fsdp`` whatever their size:
splitting a counter or a key saves nothing and every use would gather it. A callable is
consulted for integer and boolean leaves (a large integer buffer may be worth splitting),
never for typed PRNG keys, which are always replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Union

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elastic_dew.elastic.config import SHARDINGS
from elastic_dew.elastic.slices.mesh import AXES
from elastic_dew.elastic.state.packing import is_key

__all__ = [
    "SHARDINGS",
    "FSDP_MIN_BYTES",
    "Policy",
    "check_policy",
    "fsdp_spec",
    "with_model_rule",
    "param_specs",
    "state_shardings",
    "state_bytes",
    "bytes_per_device_max",
]

#: The named policies.

#: Leaves below this many bytes stay replicated under ``fsdp``: sharding a norm scale or a
#: bias saves at most a few KiB per device and costs a collective each time it is used (a
#: 4096-wide float32 bias is 16 KiB, a 1024 x 1024 float32 matrix 4 MiB).
FSDP_MIN_BYTES = 16 * 2**10

#: A policy: one of :data:`SHARDINGS`, or ``(path, leaf, mesh) -> PartitionSpec``.
Policy = Union[str, Callable[[tuple, jax.ShapeDtypeStruct, Mesh], PartitionSpec]]

_REPLICA, _DATA, _MODEL = AXES


def check_policy(policy: Any) -> None:
    """Refuse a policy that is neither a named one nor a callable (before anything runs)."""
    if isinstance(policy, str):
        if policy not in SHARDINGS:
            raise ValueError(
                f"sharding={policy!r} must be one of {', '.join(SHARDINGS)}, or a callable "
                "(path, leaf, mesh) -> PartitionSpec over the axes 'data' and 'model'"
            )
    elif not callable(policy):
        raise TypeError(
            f"sharding must be one of {', '.join(SHARDINGS)} or a callable "
            f"(path, leaf, mesh) -> PartitionSpec, not {type(policy).__name__}"
        )


def _named(spec: PartitionSpec) -> list[str]:
    return [a for dim in spec if dim is not None for a in ((dim,) if isinstance(dim, str) else dim)]


def fsdp_spec(path: tuple, leaf: Any, mesh: Mesh, *, base: PartitionSpec = PartitionSpec(),
              min_bytes: int = FSDP_MIN_BYTES) -> PartitionSpec:
    """``base`` with ``data`` added on ``leaf``'s largest free dimension that ``data`` divides.

    A leaf under ``min_bytes``, a ``data`` axis of one device, or no free divisible
    dimension leaves ``base`` as it is.
    """
    del path
    if not _splittable(leaf):
        return base
    size = mesh.shape[_DATA]
    nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
    dims = list(base) + [None] * (len(leaf.shape) - len(base))
    if size == 1 or nbytes < min_bytes or _DATA in _named(base):
        return base
    free = [i for i, d in enumerate(leaf.shape) if dims[i] is None and d % size == 0]
    if not free:
        return base
    largest = max(free, key=lambda i: (leaf.shape[i], -i))
    dims[largest] = _DATA
    while dims and dims[-1] is None:
        dims.pop()
    return PartitionSpec(*dims)


def _splittable(leaf: Any) -> bool:
    """Whether a named policy may split ``leaf``: floating point (or complex) leaves only."""
    return not is_key(leaf.dtype) and jax.dtypes.issubdtype(leaf.dtype, np.inexact)


def with_model_rule(mode: str, rule: Callable[[tuple, Any, Mesh], PartitionSpec] | None) -> Policy:
    """The policy ``mode`` (a named one) on top of a model's own ``model``-axis ``rule``.

    A recipe that knows its tensor-parallel split (the ``lm`` recipe: attention and MLP
    weights column-split in, row-split out) gives it as ``rule``; ``fsdp`` then adds ``data``
    on the largest dimension ``rule`` left free. Without a rule this is ``mode`` itself.
    """
    check_policy(mode)
    if rule is None:
        return mode

    def policy(path: tuple, leaf: Any, mesh: Mesh) -> PartitionSpec:
        base = rule(path, leaf, mesh) if mesh.shape[_MODEL] > 1 else PartitionSpec()
        return fsdp_spec(path, leaf, mesh, base=base) if mode == "fsdp" else base

    return policy


def _checked(spec: Any, path: tuple, leaf: Any, mesh: Mesh) -> PartitionSpec:
    """A user's spec, refused with the reason when the state could not be laid out by it."""
    name = jax.tree_util.keystr(path) or "<root>"
    if not isinstance(spec, PartitionSpec):
        raise TypeError(
            f"the sharding callable returned {spec!r} for parameter {name}; return a "
            "jax.sharding.PartitionSpec over the axes 'data' and 'model'"
        )
    named = _named(spec)
    if _REPLICA in named:
        raise ValueError(
            f"the sharding callable splits parameter {name} over {_REPLICA!r} (spec {spec}); "
            f"the state must be replicated across slices so the survivors of a loss hold a "
            f"whole copy: name only 'data' and 'model' in the spec"
        )
    unknown = [a for a in named if a not in (_DATA, _MODEL)]
    if unknown or len(named) != len(set(named)):
        raise ValueError(
            f"the sharding callable's spec {spec} for parameter {name} names "
            f"{', '.join(map(repr, unknown)) or 'an axis twice'}; name each of 'data' and "
            "'model' at most once"
        )
    if len(spec) > len(leaf.shape):
        raise ValueError(
            f"the sharding callable's spec {spec} for parameter {name} has {len(spec)} entries, "
            f"but the parameter has shape {tuple(leaf.shape)}; give at most {len(leaf.shape)}"
        )
    for dim, entry in zip(leaf.shape, spec):
        axes = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
        devices = int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64))
        if dim % devices:
            raise ValueError(
                f"the sharding callable splits parameter {name} of shape {tuple(leaf.shape)} "
                f"over {axes} ({devices} devices), which does not divide its dimension {dim}; "
                "split a dimension those devices divide, or leave it whole (None)"
            )
    return spec


def param_specs(policy: Policy, params: Any, mesh: Mesh) -> Any:
    """The ``PartitionSpec`` of each leaf of ``params`` (abstract or concrete) on ``mesh``."""
    check_policy(policy)
    if policy == "replicated":
        return jax.tree.map(lambda _: PartitionSpec(), params)
    if policy == "fsdp":
        return jax.tree_util.tree_map_with_path(lambda p, x: fsdp_spec(p, x, mesh), params)
    assert not isinstance(policy, str), "check_policy refuses any other name"
    return jax.tree_util.tree_map_with_path(
        lambda p, x: PartitionSpec() if is_key(x.dtype) else _checked(policy(p, x, mesh), p, x, mesh), params
    )


def state_shardings(policy: Policy, state: Any, mesh: Mesh, *, params_key: str = "params") -> Any:
    """The ``NamedSharding`` of each leaf of a training state ``{params_key: ..., ...}``.

    Parameters take ``policy``; subtrees of the other parts that mirror the parameters (same
    tree structure and leaf shapes: Optax's moments) follow them; all else is replicated.
    """
    params = state[params_key]
    specs = param_specs(policy, params, mesh)
    params_def = jax.tree.structure(params)
    shapes = [tuple(x.shape) for x in jax.tree.leaves(params)]
    replicated = NamedSharding(mesh, PartitionSpec())
    mirrored = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)

    def mirrors(node: Any) -> bool:
        return (
            jax.tree.structure(node) == params_def  # type: ignore[operator]  # jaxlib's PyTreeDef stub lacks __eq__
            and [tuple(getattr(x, "shape", ())) for x in jax.tree.leaves(node)] == shapes
        )

    def place(node: Any) -> Any:
        if mirrors(node):
            return mirrored
        return jax.tree.map(lambda _: replicated, node)

    out = {}
    for key, part in state.items():
        if key == params_key:
            out[key] = mirrored
        else:
            out[key] = jax.tree.map(place, part, is_leaf=mirrors)
    return out


def _leaf_bytes(leaf: Any) -> int:
    dtype = leaf.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, dtype))
        return int(np.prod(data.shape, dtype=np.int64)) * np.dtype(data.dtype).itemsize
    return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def state_bytes(state: Any) -> int:
    """The bytes of one whole copy of ``state`` (arrays or ``ShapeDtypeStruct`` leaves)."""
    return sum(_leaf_bytes(leaf) for leaf in jax.tree.leaves(state))


def bytes_per_device_max(state: Any) -> int:
    """The largest share of ``state`` one device holds, from its leaves' shardings.

    Each leaf contributes its shard's bytes (``sharding.shard_shape``) to every device of
    its sharding; the answer is the device with the most.
    """
    per_device: dict[Any, int] = {}
    for leaf in jax.tree.leaves(state):
        sharding = leaf.sharding
        shard = jax.ShapeDtypeStruct(sharding.shard_shape(leaf.shape), leaf.dtype)
        size = _leaf_bytes(shard)
        for device in sharding.device_set:
            per_device[device] = per_device.get(device, 0) + size
    return max(per_device.values(), default=0)
