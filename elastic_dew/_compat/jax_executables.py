"""Compiled programs loaded onto other devices (read against jax 0.10.2 and 0.12.1).

A slice loss leaves a mesh of the same shape as the loss of any other slice would: the same
program on other devices. :func:`retarget` loads a program compiled for one onto another's
devices through the pickler of ``jax.experimental.serialize_executable``, mapping each device
and giving the executable the new devices' compile options; :func:`compiled_here` tells
whether a compile loaded anything from JAX's persistent cache, which it cannot load
elsewhere. Nothing here imports JAX until a function is called.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from elastic_dew._compat import Private
from elastic_dew._compat.jax import _COMPILED_EXECUTABLE, XLA_DEVICE_LIST, _compiled

__all__ = ["CACHE_HIT_EVENT", "PRIVATE", "RETARGET_PLATFORMS", "cache_hits", "compiled_here", "retarget"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_PJRT_PICKLER = Private(
    "jax",
    "jax.experimental.serialize_executable:_JaxPjrtPickler",
    why="pickles a compiled program's unloaded executable with its devices by id, so that "
    "retarget can load the same program onto other devices of the same mesh shape",
    instead="jax.experimental.serialize_executable with a device mapping and the new "
    "devices' compile options (deserialize_and_load keeps the executable's own devices)",
)
_PJRT_UNPICKLER = Private(
    "jax",
    "jax.experimental.serialize_executable:_JaxPjrtUnpickler",
    why="the loading side of _JaxPjrtPickler; retarget maps each device id on its way back",
    instead="jax.experimental.serialize_executable.deserialize_and_load with a device mapping",
)
_UNLOADED_EXECUTABLE = Private(
    "jax",
    "jax._src.interpreters.pxla:MeshExecutable._unloaded_executable",
    why="the compiled program before it was loaded onto its devices, which retarget loads "
    "again onto others",
    instead="jax.experimental.serialize_executable with a device mapping",
    probe=lambda: getattr(_compiled(), _COMPILED_EXECUTABLE.name),
)
_COMPILED_NO_KWARGS = Private(
    "jax",
    "jax.stages:Compiled._no_kwargs",
    why="whether a compiled program refuses keyword arguments, passed on to the retargeted one",
    instead="jax.experimental.serialize_executable with a device mapping",
    probe=_compiled,
)
_COMPILED_PARAMS = Private(
    "jax",
    "jax.stages:Compiled._params",
    why="the constants a compiled program closes over (const_args): retarget leaves such a "
    "program alone, its constants live on the old devices",
    instead="jax.experimental.serialize_executable with a device mapping",
    probe=_compiled,
)

PRIVATE: tuple[Private, ...] = (
    _PJRT_PICKLER,
    _PJRT_UNPICKLER,
    _UNLOADED_EXECUTABLE,
    _COMPILED_NO_KWARGS,
    _COMPILED_PARAMS,
)

#: The platforms whose executables do not depend on the devices they were compiled for: CPU
#: (tests/test_retarget.py checks it) and GPU (JAX's persistent cache treats GPU executables
#: so; unverified here).
RETARGET_PLATFORMS = ("cpu", "gpu")

#: JAX records this event in the compiling thread when it loads a program from its persistent cache.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_HITS = threading.local()
_LISTENING = threading.Lock()
_listening = False


def _on_event(event: str, **kwargs: Any) -> None:
    if event == CACHE_HIT_EVENT:
        _HITS.count = getattr(_HITS, "count", 0) + 1


def cache_hits() -> int:
    """How many programs the calling thread loaded from JAX's persistent compilation cache
    since its first call here (compare two calls)."""
    global _listening
    import jax

    with _LISTENING:
        if not _listening:
            jax.monitoring.register_event_listener(_on_event)
            _listening = True
    return int(getattr(_HITS, "count", 0))


def compiled_here(compiling: Callable[[], T]) -> tuple[T, bool]:
    """``compiling()``, and whether it compiled everything itself: ``False`` when it loaded a
    program from JAX's persistent compilation cache, which :func:`retarget` cannot load
    elsewhere (jaxlib's CPU client serializes it without the nested computations it was
    compiled with).

    Args:
        compiling: what compiles, in the calling thread.

    Returns:
        Its result, and whether nothing came from the cache.
    """
    before = cache_hits()
    result = compiling()
    return result, cache_hits() == before


#: How many loaded programs :func:`retarget` keeps, the most recently used: a process that
#: runs many trainings loads each program onto each layout once, as JAX's own caches compile.
LOADED_KEPT = 64
_LOADED: collections.OrderedDict[tuple, tuple[Any, Any]] = collections.OrderedDict()
_LOADED_LOCK = threading.Lock()


def retarget(compiled: Any, devices: dict[int, Any]) -> Any | None:
    """``compiled`` loaded onto other devices, without compiling: ``None`` where it cannot be.

    The executable is the same program; its devices (and every sharding's) are mapped by
    ``devices`` (old id to new device) and it is loaded with the new devices' compile options.
    Only where the executable does not depend on its devices (:data:`RETARGET_PLATFORMS`),
    and not for a program with host callbacks or closed-over constants. ``compiled`` must
    have been compiled in this process, not loaded from JAX's persistent cache
    (:func:`compiled_here` tells).

    Args:
        compiled: a ``jax.stages.Compiled``.
        devices: each of its devices' id, to the device that takes its place.

    Returns:
        The retargeted ``jax.stages.Compiled``, or ``None``.
    """
    import io

    import jax
    import jax.extend.backend
    import numpy as np
    from jax.extend.backend import get_compile_options

    try:
        unloaded = getattr(getattr(compiled, _COMPILED_EXECUTABLE.name), _UNLOADED_EXECUTABLE.name)
        old = list(unloaded.device_list)
        if unloaded.host_callbacks or getattr(compiled, _COMPILED_PARAMS.name).const_args:
            return None
    except (AttributeError, TypeError):
        return None
    if any(d.id not in devices for d in old):
        return None
    new = [devices[d.id] for d in old]
    key = (id(unloaded), tuple(d.id for d in new))
    with _LOADED_LOCK:
        if key in _LOADED:
            _LOADED.move_to_end(key)
            return _LOADED[key][1]
    client = old[0].client
    # The backend's own name, not only its platform: an IFRT proxy client (Pathways) says "cpu"
    # or "tpu" as its platform, and compiles each program on the far side.
    names = [name for name, backend in jax.extend.backend.backends().items() if backend is client]
    if client.platform not in RETARGET_PLATFORMS or names != [client.platform]:
        return None
    by_id = {d.id: d for d in client.devices()}

    class Unpickler(_PJRT_UNPICKLER.get()):  # type: ignore[misc]
        def persistent_load(self, pid: Any) -> Any:
            if pid[0] == "exec":
                return client.deserialize_executable(pid[1], device_list, options)
            if pid[0] == "device":
                return devices[pid[1]] if pid[1] in devices else by_id[pid[1]]
            return super().persistent_load(pid)

    try:
        options = get_compile_options(1, len(new), np.array(new).reshape(1, len(new)), backend=client)
        options.executable_build_options.use_spmd_partitioning = True
        device_list = XLA_DEVICE_LIST.get()(tuple(new))
        args_flat, in_tree = jax.tree_util.tree_flatten(compiled.args_info)
        with io.BytesIO() as file:
            _PJRT_PICKLER.get()(file).dump((unloaded, args_flat))
            moved, moved_args = Unpickler(io.BytesIO(file.getvalue()), client, new).load()
        loaded = moved.load()
    except Exception:  # noqa: BLE001 - whatever fails here, the caller compiles instead
        logger.debug("could not load a compiled program onto devices %s", [d.id for d in new], exc_info=True)
        return None
    if [d.id for d in moved.xla_executable.local_devices()] != [d.id for d in new]:
        return None  # the client kept the old devices: not retargetable here
    result = jax.stages.Compiled(
        loaded, [], jax.tree_util.tree_unflatten(in_tree, moved_args), compiled.out_tree,
        no_kwargs=getattr(compiled, _COMPILED_NO_KWARGS.name),
    )
    with _LOADED_LOCK:
        _LOADED[key] = (unloaded, result)  # the source kept alive: its id names no other
        while len(_LOADED) > LOADED_KEPT:
            _LOADED.popitem(last=False)
    return result
