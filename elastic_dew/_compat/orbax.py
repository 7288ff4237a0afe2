"""Orbax's private names elastic_dew uses, each named and checked (the seam's Orbax module).

The tiers need a few things Orbax's public API does not give. Every such use is in this
module (each declared in :data:`PRIVATE` with why and what public API would replace it), so
an Orbax release that renames or reshapes one breaks this module alone, and
``tests/test_compat.py`` and ``tests/test_orbax_adapter.py`` name the member that changed.
Read against orbax-checkpoint 0.12.8 (:data:`ORBAX_VERSION_READ`):

**The experimental Snapshotter** (tier 1): its private members, declared and checked, and the
subclass that reads them are :mod:`elastic_dew._compat.orbax_snapshotter`; ``Snapshotter``,
``HostSnapshotter``, :func:`snapshot_busy`, :func:`snapshot_landing`, and the release read
(:data:`ORBAX_VERSION_READ`) with the one wording of a refusal (:func:`refusal`), which that
module defines since it refuses first, are bound here too.

**Replica-parallel slicing** (tier 2's first-save warm-up,
:meth:`elastic_dew.elastic.state.checkpoints.Checkpoints.precompile_saves`), in
``orbax/checkpoint/_src/serialization/replica_slices.py`` and ``jax_array_handlers.py``:
``get_replica_slices(arr, replica_id, use_replica_parallel,
min_slice_bytes_for_replica_parallel, max_replicas_for_replica_parallel)`` returns a
``ReplicaSlices`` whose ``replica_slices`` each have ``data()``; the settings are the
registered ``jax.Array`` handler's private attributes of the same names
(:data:`HANDLER_SETTINGS`). :func:`slice_replicas` runs them.

**The Pathways backend test** (the multi-tier guard), ``orbax/checkpoint/_src/multihost/
multihost.py``'s ``is_pathways_backend()``, which :func:`is_pathways_backend` asks through its
public binding ``orbax.checkpoint.utils.is_pathways_backend``. Orbax's own callers ask it by
the private module's attribute; :data:`PATHWAYS_BACKEND_BINDINGS` names both bindings, so
the simulator (:mod:`elastic_dew.simulate.patches`) can answer ``True`` at each while it
stands in for Pathways.

**The state item's handler** (tier 2): ``StandardCheckpointHandler`` takes no type-handler
registry, so its inner ``PyTreeCheckpointHandler`` (``_impl``) is replaced by one built
with Orbax's public constructor (:func:`state_item_handler`).

**Multi-tier initialisation's colocated runner**, rebound by the simulator's replicator
stand-in (:data:`MTC_COLOCATED_PYTHON`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

from elastic_dew._compat import Private
from elastic_dew._compat.orbax_snapshotter import (
    ORBAX_VERSION_READ,
    HostSnapshotter,
    Snapshotter,
    class_incompatibilities,
    instance_incompatibilities,
    refusal,
    snapshot_busy,
    snapshot_landing,
)

__all__ = [
    "PRIVATE",
    "MTC_COLOCATED_PYTHON",
    "ORBAX_VERSION_READ",
    "REPLICA_SLICE_PARAMETERS",
    "HANDLER_SETTINGS",
    "HostSnapshotter",
    "Snapshotter",
    "snapshot_busy",
    "snapshot_landing",
    "replica_slicing_incompatibilities",
    "replica_slices_module",
    "pathways_incompatibilities",
    "incompatibilities",
    "REPLICA_PARALLEL_MIN_SLICE_BYTES",
    "replica_parallel_array_handler",
    "state_item_handler",
    "standard_handler_incompatibilities",
    "slice_replicas",
    "is_pathways_backend",
    "PATHWAYS_BACKEND_BINDINGS",
    "pathways_backend_bindings",
    "refusal",
]


#: ``replica_slices.get_replica_slices``'s parameters, in order, as :func:`slice_replicas` passes them.
REPLICA_SLICE_PARAMETERS: tuple[str, ...] = (
    "arr",
    "replica_id",
    "use_replica_parallel",
    "min_slice_bytes_for_replica_parallel",
    "max_replicas_for_replica_parallel",
)

#: The registered ``jax.Array`` handler's private settings, by the parameter each feeds.
HANDLER_SETTINGS: dict[str, str] = {name: f"_{name}" for name in REPLICA_SLICE_PARAMETERS[1:]}


def replica_slices_module() -> Any:
    """Orbax's private module of replica-parallel slicing (``get_replica_slices``,
    ``ReplicaSlices``, ``ReplicaSlice``), imported."""
    from orbax.checkpoint._src.serialization import replica_slices

    return replica_slices


def _array_handler() -> Any:
    import jax
    import orbax.checkpoint as ocp

    return ocp.type_handlers.get_type_handler(jax.Array)


def replica_slicing_incompatibilities(handler: Any = None) -> list[str]:
    """What of Orbax's replica-parallel slicing :func:`slice_replicas` uses is gone or changed.

    ``handler`` is the ``jax.Array`` type handler whose settings are read (default: the one
    registered now).
    """
    try:
        module = replica_slices_module()
    except ImportError as error:
        return [f"orbax.checkpoint._src.serialization.replica_slices cannot be imported ({error})"]
    problems = []
    get = getattr(module, "get_replica_slices", None)
    if not callable(get):
        problems.append("replica_slices.get_replica_slices is gone (this adapter calls it)")
    else:
        names = list(inspect.signature(get).parameters)
        if names[: len(REPLICA_SLICE_PARAMETERS)] != list(REPLICA_SLICE_PARAMETERS):
            problems.append(
                f"replica_slices.get_replica_slices takes ({', '.join(names)}), this adapter "
                f"expects ({', '.join(REPLICA_SLICE_PARAMETERS)}) first"
            )
    slices_type = getattr(module, "ReplicaSlices", None)
    fields = getattr(slices_type, "__dataclass_fields__", {})
    if slices_type is None or "replica_slices" not in fields:
        problems.append("replica_slices.ReplicaSlices.replica_slices is gone (this adapter reads it)")
    slice_type = getattr(module, "ReplicaSlice", None)
    if slice_type is None or not callable(getattr(slice_type, "data", None)):
        problems.append("replica_slices.ReplicaSlice.data is gone (this adapter calls it)")
    handler = _array_handler() if handler is None else handler
    for setting in HANDLER_SETTINGS.values():
        if not hasattr(handler, setting):
            problems.append(
                f"{type(handler).__name__}.{setting} is gone (this adapter reads the jax.Array "
                "handler's replica-parallel settings from it)"
            )
    return problems


#: The modules that bind Orbax's Pathways backend test by the name ``is_pathways_backend``:
#: where it is defined, and ``orbax.checkpoint.utils``, which binds it again at import.
PATHWAYS_BACKEND_BINDINGS: tuple[str, ...] = (
    "orbax.checkpoint._src.multihost.multihost",
    "orbax.checkpoint.utils",
)


def pathways_backend_bindings() -> list[Any]:
    """The modules of :data:`PATHWAYS_BACKEND_BINDINGS`, imported, defining module first."""
    return [importlib.import_module(name) for name in PATHWAYS_BACKEND_BINDINGS]


def pathways_incompatibilities() -> list[str]:
    """Whether ``multihost.is_pathways_backend``, which :func:`is_pathways_backend` calls and
    the simulator answers for, is gone or no longer bound where :data:`PATHWAYS_BACKEND_BINDINGS` says."""
    try:
        modules = pathways_backend_bindings()
    except ImportError as error:
        return [f"a module binding Orbax's is_pathways_backend cannot be imported ({error})"]
    defining = getattr(modules[0], "is_pathways_backend", None)
    if not callable(defining):
        return ["multihost.is_pathways_backend is gone (this adapter calls it)"]
    return [
        f"{module.__name__}.is_pathways_backend is no longer multihost.is_pathways_backend "
        "(the simulator answers at both bindings)"
        for module in modules[1:]
        if getattr(module, "is_pathways_backend", None) is not defining
    ]


def standard_handler_incompatibilities() -> list[str]:
    """Whether ``StandardCheckpointHandler`` still delegates to a ``PyTreeCheckpointHandler``
    ``_impl`` that takes a ``type_handler_registry`` (:func:`state_item_handler` replaces it)."""
    import orbax.checkpoint as ocp

    problems = []
    if not isinstance(getattr(ocp.StandardCheckpointHandler(), "_impl", None), ocp.PyTreeCheckpointHandler):
        problems.append("StandardCheckpointHandler._impl is no longer a PyTreeCheckpointHandler (this adapter replaces it)")
    if "type_handler_registry" not in inspect.signature(ocp.PyTreeCheckpointHandler).parameters:
        problems.append("PyTreeCheckpointHandler no longer takes type_handler_registry (this adapter passes one)")
    return problems


def incompatibilities() -> list[str]:
    """Every private Orbax member this module uses that the installed release lacks or changed."""
    return (
        class_incompatibilities(Snapshotter)
        + instance_incompatibilities(Snapshotter(replica_axis_index=0))
        + replica_slicing_incompatibilities()
        + standard_handler_incompatibilities()
        + pathways_incompatibilities()
    )


@functools.cache
def _check_replica_slicing() -> None:
    """Refuse, once per process and with the members named, slicing this adapter cannot use."""
    problems = replica_slicing_incompatibilities()
    if problems:
        raise refusal("replica-parallel slicing", problems)


#: A leaf is saved replica-parallel only when each replica's slice of it is at least this many
#: bytes (``ArrayHandler(min_slice_bytes_for_replica_parallel=...)``, Orbax's own option).
#: Below it one replica writes the leaf whole, which compiles nothing: a replica-parallel
#: save cuts each replica's slice with a program per device, shard shape and slice, and
#: compiling those for a state of many small leaves makes a process's first checkpoint save
#: many times slower than the next (``docs/performance.md``, *The first checkpoint save of a
#: process*). Splitting a small leaf's transfer over the
#: replicas gains nothing its per-slice dispatch does not cost; a large leaf's bytes still
#: go out in parallel. The bound is the snapshot's packing bound
#: (:data:`elastic_dew.elastic.state.packing.PACK_MAX_BYTES`), for the same reason.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 4 * 2**20

#: Whether tier 2 zstd-compresses its array chunks (``PyTreeCheckpointHandler(use_compression=...)``,
#: on by default in Orbax). Off: a training state's floats compress little, and
#: decompressing is most of a restore's time (``docs/performance.md``, restore bandwidth,
#: has both measured). A checkpoint written compressed is still read: the compressor is in
#: each array's metadata.
USE_COMPRESSION = False


def replica_parallel_array_handler(min_slice_bytes: int | None = None) -> Any:
    """A copy of the registered ``jax.Array`` handler that saves replica-parallel only the
    leaves whose per-replica slice is at least ``min_slice_bytes`` (default
    :data:`REPLICA_PARALLEL_MIN_SLICE_BYTES`, read at the call); every other setting is the
    registered handler's. The registered handler itself is left as it is."""
    import copy

    _check_replica_slicing()
    handler = copy.copy(_array_handler())
    bound = REPLICA_PARALLEL_MIN_SLICE_BYTES if min_slice_bytes is None else int(min_slice_bytes)
    setattr(handler, HANDLER_SETTINGS["min_slice_bytes_for_replica_parallel"], bound)
    return handler


class _ArrayFirstRegistry:
    """A ``TypeHandlerRegistry`` that answers ``jax.Array`` (by type or typestr) with one
    handler and every other type with Orbax's global registry, as the default would."""

    def __init__(self, array_handler: Any) -> None:
        self._array = array_handler

    def add(self, ty: Any, handler: Any, func: Any = None, override: bool = False, ignore_warnings: bool = False) -> None:
        raise ValueError("elastic_dew's checkpoint state registry is fixed; register types with Orbax's global registry")

    def get(self, ty: Any) -> Any:
        import jax

        if ty == self._array.typestr() or (isinstance(ty, type) and issubclass(ty, jax.Array)):
            return self._array
        import orbax.checkpoint as ocp

        return ocp.type_handlers.get_type_handler(ty)

    def has(self, ty: Any) -> bool:
        try:
            self.get(ty)
            return True
        except ValueError:
            return False


def state_item_handler(array_handler: Any) -> Any:
    """Orbax's ``StandardCheckpointHandler`` (its defaults but :data:`USE_COMPRESSION`;
    ``StandardSave``/``StandardRestore`` and the on-disk layout unchanged) whose ``jax.Array``
    leaves go through ``array_handler``.

    ``StandardCheckpointHandler`` takes no type-handler registry, so its inner
    ``PyTreeCheckpointHandler`` (``_impl``) is replaced by one built with the same defaults
    and a registry that answers ``jax.Array`` with ``array_handler``.
    """
    import orbax.checkpoint as ocp

    problems = standard_handler_incompatibilities()
    if problems:
        raise refusal("StandardCheckpointHandler", problems)
    handler = ocp.StandardCheckpointHandler()
    handler._impl = ocp.PyTreeCheckpointHandler(
        save_concurrent_gb=96,
        restore_concurrent_gb=96,
        use_ocdbt=True,
        use_compression=USE_COMPRESSION,
        type_handler_registry=_ArrayFirstRegistry(array_handler),
    )
    return handler


def slice_replicas(leaf: Any, handler: Any = None) -> None:
    """Cut ``leaf`` (a ``jax.Array``) into the slices Orbax's replica-parallel save would
    write from this process, and drop them: the slicing programs are compiled and cached,
    the devices copy a fraction of the leaf, and nothing reaches the host. A leaf the
    settings save whole by one replica compiles nothing.

    The settings are ``handler``'s (a ``jax.Array`` type handler; default: the one
    registered at the call), as a save through that handler reads them.
    """
    _check_replica_slicing()
    handler = _array_handler() if handler is None else handler
    settings = {name: getattr(handler, attribute) for name, attribute in HANDLER_SETTINGS.items()}
    for piece in replica_slices_module().get_replica_slices(leaf, **settings).replica_slices:
        piece.data()


def is_pathways_backend() -> bool:
    """Whether JAX runs on a Pathways backend (native or proxy), as Orbax decides it."""
    import orbax.checkpoint as ocp

    return bool(ocp.utils.is_pathways_backend())


MTC_COLOCATED_PYTHON = Private(
    "orbax-checkpoint",
    "orbax.checkpoint.experimental.emergency.multi_tier_checkpointing.initialization:colocated_python",
    why="multi-tier initialisation calls colocated_python.colocated_python(...) through this "
    "module attribute; the simulator's replicator stand-in rebinds it to run the function "
    "once per simulated worker",
    instead="an initialisation that takes the colocated runner as a parameter",
)


def _array_handler_probe() -> Any:
    import orbax.checkpoint as ocp

    return ocp.type_handlers.ArrayHandler()


def _standard_handler_probe() -> Any:
    import orbax.checkpoint as ocp

    return ocp.StandardCheckpointHandler()


_REPLICA_SLICES = "orbax.checkpoint._src.serialization.replica_slices"
PRIVATE: tuple[Private, ...] = (
    Private(
        "orbax-checkpoint",
        f"{_REPLICA_SLICES}:get_replica_slices",
        why="cuts a leaf into the slices a replica-parallel save writes from this process: "
        "tier 2's warm-up compiles those slicing programs before the first save",
        instead="a public warm-up of the replica-parallel save (or of ArrayHandler.serialize "
        "without writing)",
        params=REPLICA_SLICE_PARAMETERS,
    ),
    Private(
        "orbax-checkpoint",
        f"{_REPLICA_SLICES}:ReplicaSlice.data",
        why="each slice's data, computed (and so compiled) and dropped by the warm-up",
        instead="as get_replica_slices",
    ),
    *(
        Private(
            "orbax-checkpoint",
            f"orbax.checkpoint.type_handlers:ArrayHandler.{attribute}",
            why=f"the registered jax.Array handler's {name} (set by its constructor), read so "
            "the warm-up slices as that handler's save will"
            + ("; set on a copy of it for tier 2's bound" if name.startswith("min_slice") else ""),
            instead="public read-only properties of ArrayHandler's settings; its constructor "
            "(public) would build the handler but drop what a user registered "
            "(array_metadata_store, dispatcher, ...), which a copy keeps",
            probe=_array_handler_probe,
        )
        for name, attribute in HANDLER_SETTINGS.items()
    ),
    Private(
        "orbax-checkpoint",
        "orbax.checkpoint:StandardCheckpointHandler._impl",
        why="StandardCheckpointHandler takes no type_handler_registry: its inner "
        "PyTreeCheckpointHandler is replaced by one built with the public constructor "
        "(PyTreeCheckpointHandler(type_handler_registry=...)), keeping StandardSave/"
        "StandardRestore and the on-disk layout",
        instead="StandardCheckpointHandler(type_handler_registry=...), or PyTreeCheckpointHandler "
        "with PyTreeSave/PyTreeRestore as the state item's handler (a change of the item's "
        "recorded handler type)",
        probe=_standard_handler_probe,
    ),
    Private(
        "orbax-checkpoint",
        "orbax.checkpoint._src.multihost.multihost:is_pathways_backend",
        why="Orbax's own callers ask the Pathways backend test at this private module's "
        "binding; the simulator answers True there (and at orbax.checkpoint.utils')",
        instead="none: the backend test has no override",
    ),
    MTC_COLOCATED_PYTHON,
)
