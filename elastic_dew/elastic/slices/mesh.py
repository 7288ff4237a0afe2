"""Slices and meshes: the device mesh over the active slices, and the batch that fits it.

On Pathways, ``jax.devices()`` keeps every device of the initial allocation for the life of
the client, lost slices included. Everything here therefore starts from the Manager's
*active* slices. The mesh has three axes:

``replica``
    one entry per active slice (axis 0). Snapshots are replicated along it, so the
    surviving slices hold a whole copy of the state (Orbax ``Snapshotter(replica_axis_index=0)``).
``data``
    data parallelism inside a slice.
``model``
    model parallelism inside a slice (``model_axis`` devices).

Those are the default axes; a :class:`MeshSpec` names your own (``replica`` stays first) and
one slice's shape along them. The batch is sharded over ``("replica", "data")`` (a spec's
``batch_axes``); state is replicated or sharded inside a slice, never over ``replica``.
Whether a batch fits is decided here, once: for one mesh (:func:`check_batch`) and, before
a run, for every slice count it can reach (:func:`check_batch_for_every_slice_count`, :class:`BatchError`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elastic_dew.elastic.slices.manager import SliceManager
from elastic_dew.elastic.config import BATCH_POLICIES, MICROBATCH, ElasticConfig
from elastic_dew.settings import SettingError, mention

__all__ = [
    "AXES",
    "MeshSpec",
    "active_devices",
    "build_mesh",
    "mesh_of",
    "global_batch_for",
    "check_batch",
    "check_batch_for_every_slice_count",
    "check_eval_batch",
    "micro_steps",
    "reachable_shards",
    "BatchError",
    "batch_sharding",
    "replicated",
]

#: Mesh axis names; the replica axis (slices) is index 0.
AXES: tuple[str, str, str] = ("replica", "data", "model")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """The mesh a run builds over its active slices on every attempt: its axes, one slice's
    shape along them, and the axes a batch is split over.

    The default is :data:`AXES` with a slice of ``(devices // model_axis, model_axis)``
    (``ElasticConfig.model_axis``) and the batch over ``("replica", "data")``. Your own
    program's shardings may name other axes: ``MeshSpec(axes=("replica", "fsdp", "tensor"),
    slice_shape=(-1, 2))`` lays each slice out as ``fsdp`` x 2 ``tensor`` devices and splits a
    batch over ``("replica", "fsdp")``. The meshes are built as :func:`build_mesh` builds them.

    Args:
        axes: the mesh's axis names, ``replica`` first (the axis across slices, along which
            snapshots are replicated).
        slice_shape: one slice's devices along ``axes[1:]``, at most one of them ``-1`` (what
            is left of a slice's devices); ``None``: ``(-1, model_axis)`` for three axes,
            ``(-1,)`` for two.
        batch_axes: the axes a batch's leading dimension is split over, ``replica`` first;
            ``None``: the first two axes.

    Raises:
        ValueError: axes that do not start with ``replica`` or name one twice, a
            ``slice_shape`` with another number of dimensions than ``axes[1:]``, or batch
            axes that do not start with ``replica`` or are not among ``axes``.
    """

    axes: tuple[str, ...] = AXES
    slice_shape: tuple[int, ...] | None = None
    batch_axes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        names = tuple(self.axes)
        if not names or names[0] != AXES[0] or len(set(names)) != len(names):
            raise ValueError(f"axes={names} must be distinct names starting with {AXES[0]!r}, the axis "
                             "across slices (snapshots are replicated along it)")
        shape = None if self.slice_shape is None else tuple(int(n) for n in self.slice_shape)
        if shape is not None and len(shape) != len(names) - 1:
            raise ValueError(f"slice_shape={shape} has {len(shape)} dimensions; axes={names} need "
                             f"{len(names) - 1} (one per axis after {names[0]!r})")
        batch = names[:2] if self.batch_axes is None else tuple(self.batch_axes)
        if not batch or batch[0] != AXES[0] or len(set(batch)) != len(batch) or not set(batch) <= set(names):
            raise ValueError(f"batch_axes={batch} must be distinct axes of {names} starting with "
                             f"{AXES[0]!r}: every slice takes its part of a batch")
        object.__setattr__(self, "axes", names)
        object.__setattr__(self, "slice_shape", shape)
        object.__setattr__(self, "batch_axes", batch)


def spec_slice_shape(spec: MeshSpec, per_slice: int, model_axis: int | None = None) -> tuple[int, ...]:
    """One slice's shape along ``spec.axes[1:]`` for slices of ``per_slice`` devices, as
    :func:`build_mesh` lays it out (``ValueError`` when it cannot)."""
    if model_axis is not None and model_axis < 1:
        raise ValueError(f"model_axis={model_axis} must be >= 1, or None for 1")
    if model_axis is not None and spec.slice_shape is not None:
        raise ValueError(f"give model_axis={model_axis} or slice_shape={spec.slice_shape}, not both: "
                         "slice_shape says every axis inside a slice")
    model = 1 if model_axis is None else model_axis
    if per_slice % model:
        raise ValueError(
            f"model_axis={model} does not divide the {per_slice} devices of a slice; "
            f"use a divisor of {per_slice} "
            f"({', '.join(str(d) for d in range(1, per_slice + 1) if per_slice % d == 0)})"
        )
    names, slice_shape = spec.axes, spec.slice_shape
    if slice_shape is None:
        if len(names) not in (2, 3) or (len(names) == 2 and model != 1):
            raise ValueError(f"axes={names} need slice_shape: one slice's devices along {names[1:]}")
        slice_shape = (-1, model) if len(names) == 3 else (-1,)
    return _slice_shape(tuple(int(n) for n in slice_shape), per_slice, names)


def spec_mesh(spec: MeshSpec, devices: Sequence[jax.Device], slices: int, model_axis: int | None = None) -> Mesh:
    """``spec``'s mesh over ``devices``, ordered slice by slice, of ``slices`` equal slices."""
    shape = spec_slice_shape(spec, len(devices) // slices, model_axis)
    return Mesh(np.asarray(devices, dtype=object).reshape(slices, *shape), spec.axes)


def spec_batch_devices(spec: MeshSpec, per_slice: int, model_axis: int | None = None) -> int:
    """The devices of one slice a batch is split over (its batch axes inside a slice)."""
    shape = spec_slice_shape(spec, per_slice, model_axis)
    assert spec.batch_axes is not None  # set by MeshSpec.__post_init__
    return math.prod(shape[spec.axes.index(axis) - 1] for axis in spec.batch_axes[1:])


def active_devices(manager: SliceManager) -> list[jax.Device]:
    """The devices of the Manager's active slices, ordered by ``slice_index``.

    The guide's ``Manager`` has an ``active_devices`` property; the pathwaysutils release on
    the package index does not, so this is the one documented change a user makes to the
    guide's code (``active_devices(manager)`` for ``manager.active_devices``). Where the
    installed Manager has the property, its answer is returned unchanged.

    Args:
        manager: a pathwaysutils ``Manager``.

    Returns:
        The active slices' devices.
    """
    if getattr(type(manager), "active_devices", None) is not None:
        return list(getattr(manager, "active_devices"))  # a release's own, beyond the protocol
    return [
        device
        for index in sorted(manager.active_slice_indices)
        for device in manager.slice_to_devices[index]
    ]


def _devices_per_active_slice(manager: SliceManager) -> int:
    sizes = {
        index: len(manager.slice_to_devices[index]) for index in sorted(manager.active_slice_indices)
    }
    if not sizes:
        raise ValueError("the Manager has no active slices; wait for slices before building a mesh")
    if len(set(sizes.values())) != 1:
        raise ValueError(
            f"active slices have unequal device counts {sizes} (slice: devices); an elastic "
            "mesh needs slices of one shape, so allocate equal slices"
        )
    return next(iter(sizes.values()))


def build_mesh(manager: SliceManager, model_axis: int | None = None, *, axes: Sequence[str] | None = None,
               slice_shape: Sequence[int] | None = None) -> Mesh:
    """A mesh over the active slices only: ``replica`` (one entry per active slice) first,
    then a slice's devices laid out as ``slice_shape`` along the rest of ``axes``.

    By default the axes are :data:`AXES` and a slice is ``(devices // model_axis,
    model_axis)``; ``model_axis=None`` means 1 (pure data parallelism inside a slice). Your
    own axes and shape replace both: ``axes=("replica", "fsdp", "tensor"),
    slice_shape=(-1, 4)`` (one ``-1`` stands for what is left of a slice's devices, as in
    ``numpy.reshape``). The first axis is always ``replica``: snapshots are replicated along
    it (Orbax ``Snapshotter(replica_axis_index=0)``). Build it again on every attempt: the
    active slices change between attempts.

    Args:
        manager: the process's ``Manager`` (pathwaysutils').
        model_axis: devices along ``model`` inside a slice, ``None`` for 1 (the default axes only).
        axes: the mesh's axis names, ``replica`` first (default :data:`AXES`).
        slice_shape: one slice's devices along ``axes[1:]`` (default ``(-1, model_axis)``
            for three axes, ``(-1,)`` for two).

    Returns:
        The mesh.

    Raises:
        ValueError: ``model_axis`` below 1 or given with ``slice_shape``, axes that do not
            start with ``replica`` or do not match ``slice_shape``, or a shape that does
            not lay out a slice's devices.
    """
    names = tuple(AXES if axes is None else axes)
    spec = MeshSpec(names, None if slice_shape is None else tuple(slice_shape), names[:1])
    shape = spec_slice_shape(spec, _devices_per_active_slice(manager), model_axis)
    devices = np.asarray(active_devices(manager), dtype=object)
    return Mesh(devices.reshape(manager.active_slice_count, *shape), names)


def _slice_shape(shape: tuple[int, ...], per_slice: int, names: tuple[str, ...]) -> tuple[int, ...]:
    """``shape`` (as many dimensions as ``names[1:]``, :class:`MeshSpec` checks) with its ``-1``
    resolved, checked against a slice's ``per_slice`` devices."""
    known = math.prod(n for n in shape if n != -1)
    if shape.count(-1) > 1 or any(n < 1 and n != -1 for n in shape) or known == 0 or per_slice % known:
        divisors = ", ".join(str(d) for d in range(1, per_slice + 1) if per_slice % d == 0)
        raise ValueError(f"slice_shape={shape} does not lay out the {per_slice} devices of a slice; use sizes whose product "
                         f"is {per_slice} (each a divisor: {divisors}), at most one of them -1")
    resolved = tuple(per_slice // known if n == -1 else n for n in shape)
    if math.prod(resolved) != per_slice:
        raise ValueError(f"slice_shape={shape} lays out {math.prod(resolved)} devices; a slice has {per_slice}")
    return resolved


def mesh_of(devices: Sequence[jax.Device], slices: int, model_axis: int = 1) -> Mesh:
    """The mesh :func:`build_mesh` makes with its default axes, over ``devices`` ordered slice by slice."""
    return spec_mesh(MeshSpec(), devices, slices, model_axis)


def global_batch_for(global_batch: int, policy: str, active_slices: int, total_slices: int) -> int:
    """The global batch of an attempt on ``active_slices`` of ``total_slices``.

    ``constant`` keeps ``global_batch`` (each slice takes more when slices are lost);
    ``scale_by_active_slices`` scales it by ``active_slices / total_slices``, exactly.

    Args:
        global_batch: the batch with every slice active.
        policy: a batch policy (:data:`BATCH_POLICIES`).
        active_slices: the attempt's active slices.
        total_slices: the allocation's slices.

    Returns:
        The attempt's global batch.

    Raises:
        ValueError: an unknown policy, a batch below 1, an active count outside
            ``1 .. total_slices``, or a scaled batch that is not whole (saying what to use).
    """
    if policy not in BATCH_POLICIES:
        raise ValueError(f"batch policy {policy!r} must be one of {', '.join(BATCH_POLICIES)}")
    if global_batch < 1:
        raise ValueError(f"global_batch={global_batch} must be >= 1")
    if not 1 <= active_slices <= total_slices:
        raise ValueError(
            f"active_slices={active_slices} must be between 1 and total_slices={total_slices}"
        )
    if policy == "constant":
        return global_batch
    scaled, remainder = divmod(global_batch * active_slices, total_slices)
    if remainder:
        step = total_slices // math.gcd(active_slices, total_slices)
        raise ValueError(
            f"global_batch={global_batch} cannot be scaled to {active_slices} of {total_slices} "
            f"slices: {global_batch} * {active_slices} / {total_slices} is not a whole number. "
            f"Use a global_batch that is a multiple of {total_slices} (exact for every active "
            f"slice count; a multiple of {step} suffices for {active_slices}), or "
            "batch_policy='constant'"
        )
    return scaled


def check_batch(global_batch: int, mesh: Mesh, axes: Sequence[str] | None = None) -> None:
    """Refuse a global batch the mesh's batch-parallel devices (replica x data) cannot divide.

    Args:
        global_batch: the attempt's global batch.
        mesh: its mesh.
        axes: the axes the batch is split over (default ``("replica", "data")``).

    Raises:
        ValueError: the batch does not divide (saying which batches would).
    """
    names = AXES[:2] if axes is None else tuple(axes)
    shards = math.prod(mesh.shape[name] for name in names)
    if global_batch < 1 or global_batch % shards:
        lower = (global_batch // shards) * shards
        upper = lower + shards
        nearest = f"{upper}" if lower < 1 else f"{lower} or {upper}"
        layout = " x ".join(f"{name}={mesh.shape[name]}" for name in names)
        raise ValueError(
            f"global_batch={global_batch} does not divide over the {shards} batch-parallel "
            f"devices of the mesh ({layout}); use a multiple of "
            f"{shards}, e.g. {nearest}, or {'a larger model_axis' if names == AXES[:2] else 'another slice_shape'}"
        )


def check_eval_batch(size: int, config: ElasticConfig, total_slices: int, devices_per_slice: int,
                     spec: MeshSpec | None = None) -> None:
    """Refuse (``ValueError``), before anything runs, an evaluation batch of ``size`` examples
    that the data-parallel devices of some reachable slice count cannot divide (an evaluation
    batch is fixed: it does not follow the batch policy); ``spec`` the run's mesh (default axes)."""
    shard_counts = reachable_shards(config, total_slices, devices_per_slice, spec)
    lowest = min(shard_counts)
    for active, shards in shard_counts.items():
        if size % shards:
            raise ValueError(
                f"the evaluation batch of {size} examples cannot be split over the {shards} "
                f"data-parallel devices of {active} active slices; give an eval batch size "
                f"divisible by the data-parallel devices of every slice count from {lowest} "
                f"to {total_slices}"
            )


def micro_steps(global_batch: int, mesh: Mesh, microbatch: int) -> tuple[int, int]:
    """``(micro-steps, data-parallel devices)`` of ``global_batch`` on ``mesh`` in micro-batches
    of ``microbatch`` examples per device.

    Raises :class:`BatchError` when ``microbatch`` does not divide the per-device batch: the
    rule :func:`check_batch_for_every_slice_count` applies to every reachable slice count
    before a run, here on the one mesh a caller compiles a step for directly.
    """
    shards = mesh.shape[AXES[0]] * mesh.shape[AXES[1]]
    per_device = global_batch // shards
    if not _divides(microbatch, per_device):
        raise BatchError(
            f"microbatch={microbatch} does not divide the per-device batch of {per_device} "
            f"(global batch {global_batch} over {shards} data-parallel devices)",
            field="microbatch", value=microbatch,
        )
    return per_device // microbatch, shards


def _divides(microbatch: int, per_device: int) -> bool:
    """The microbatch rule: a per-device batch is a whole number of micro-batches."""
    return per_device % microbatch == 0


def batch_sharding(mesh: Mesh, axes: Sequence[str] | None = None) -> NamedSharding:
    """The batch's sharding: leading dimension split over ``axes`` (default ``("replica", "data")``).

    Args:
        mesh: the attempt's mesh.
        axes: the mesh axes the batch is split over, ``replica`` among them (your own
            mesh's data-parallel axes).

    Returns:
        The ``NamedSharding``.
    """
    return NamedSharding(mesh, PartitionSpec(AXES[:2] if axes is None else tuple(axes)))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated over the mesh (along the replica axis too, as snapshots need).

    Args:
        mesh: the mesh.

    Returns:
        The ``NamedSharding``.
    """
    return NamedSharding(mesh, PartitionSpec())


class BatchError(SettingError):
    """A batch the slices cannot take: a global batch, microbatch, model axis or minimum slice
    count that some reachable slice count cannot divide or meet.

    Raised before anything runs (by :func:`check_batch_for_every_slice_count`, which
    :class:`ElasticRun` calls as it is built), so a caller can tell a bad setting from a
    failure of the run. ``field`` is the setting the refusal is about (``global_batch``,
    ``microbatch``, ``model_axis``, ``minimum_slice_count``); the message names the values
    that work.
    """

    def __init__(self, message: str, *, field: str, value: Any) -> None:
        super().__init__(ElasticConfig, field, value, problem=message)


def reachable_shards(config: ElasticConfig, total_slices: int, devices_per_slice: int,
                     spec: MeshSpec | None = None) -> dict[int, int]:
    """The data-parallel devices (replica x data, or ``spec``'s batch axes) of every active slice
    count a run can reach: ``minimum_slice_count`` (all of them in pause-resume) up to ``total_slices``."""
    if spec is None:
        per_slice = devices_per_slice // (config.model_axis or 1)
    else:
        per_slice = spec_batch_devices(spec, devices_per_slice, config.model_axis)
    lowest = total_slices if config.minimum_slice_count is None else config.minimum_slice_count
    return {active: active * per_slice for active in range(lowest, total_slices + 1)}


def check_batch_for_every_slice_count(
    config: ElasticConfig, total_slices: int, devices_per_slice: int, microbatch: int | None = None,
    spec: MeshSpec | None = None,
) -> None:
    """Refuse, before anything runs, a global batch some reachable slice count cannot divide.

    A run in replica-resize mode may run on any count from ``minimum_slice_count`` to the
    total; pause-resume only ever runs on all of them. Checking every count up front turns
    a failure hours into a run (the first lost slice) into an error at start. With
    ``microbatch`` (examples per data-parallel device per micro-step), every reachable
    per-device batch must also be a multiple of it (and the microbatch within
    :data:`~elastic_dew.elastic.config.MICROBATCH`); the refusal names the values that are.
    Every refusal is a :class:`BatchError`, but for a ``spec`` (the run's mesh; default axes)
    that cannot lay out a slice (``ValueError``, as :func:`build_mesh` says).
    """
    try:
        config.check_slices(total_slices)
    except SettingError as err:
        # the problem as given (its mentions still marked), so each surface names them its way
        raise BatchError(err.marked_problem or str(err), field=err.field, value=err.value) from None
    model = config.model_axis or 1
    if devices_per_slice % model and (spec is None or spec.slice_shape is None):
        raise BatchError(
            f"{mention('model_axis', model)} does not divide the {devices_per_slice} devices of a slice; "
            f"choose a model axis that divides {devices_per_slice}",
            field="model_axis", value=config.model_axis,
        )
    shard_counts = reachable_shards(config, total_slices, devices_per_slice, spec)
    lowest = min(shard_counts)
    per_device: dict[int, int] = {}
    for active, shards in shard_counts.items():
        batch = global_batch_for(config.global_batch, config.batch_policy, active, total_slices)
        if batch % shards:
            raise BatchError(
                f"{mention('global_batch', config.global_batch)} (policy {config.batch_policy!r}) gives a batch "
                f"of {batch} on {active} active slices, which their {shards} data-parallel devices "
                f"cannot divide; choose a global batch divisible by {shards} for every slice count "
                f"from {lowest} to {total_slices}, or raise {mention('minimum_slice_count')}",
                field="global_batch", value=config.global_batch,
            )
        per_device[active] = batch // shards
    if microbatch is None:
        return
    if not MICROBATCH.holds(microbatch):
        raise BatchError(MICROBATCH.refusal(microbatch, name="microbatch"), field="microbatch", value=microbatch)
    for active, examples in per_device.items():
        if not _divides(microbatch, examples):
            common = math.gcd(*per_device.values())
            working = [m for m in range(1, common + 1) if common % m == 0]
            raise BatchError(
                f"{mention('microbatch', microbatch)} does not divide the per-device batch of {examples} on "
                f"{active} active slices (global batch {config.global_batch}, policy "
                f"{config.batch_policy!r}); the per-device batches from {lowest} to {total_slices} "
                f"slices are {', '.join(str(per_device[a]) for a in sorted(per_device))}, which "
                f"microbatch {', '.join(map(str, working))} divide{'s' if len(working) == 1 else ''}",
                field="microbatch", value=microbatch,
            )
