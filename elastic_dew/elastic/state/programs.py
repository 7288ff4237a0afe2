"""The snapshots' programs: compiled once per layout, loaded onto other devices where that can be.

A slice loss leaves a mesh of the same shape as the loss of any other slice would: the same
program on other devices. A program compiled for one of them is loaded onto the others'
devices (:func:`~elastic_dew._compat.jax_executables.retarget`, on the platforms whose executables do
not depend on their devices) instead of being compiled again: :func:`load_or_compile` keeps,
for the life of the process, one compiled program per lowered text (which names no device).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
from typing import Any

import jax
from jax.sharding import Mesh

from elastic_dew._compat.jax_executables import compiled_here, retarget

__all__ = ["COMPILE_WAIT_S", "KEPT", "PrecompiledFunction", "load_or_compile"]

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
#: Each lowered program's text digest: the program compiled for it and the mesh it was for (the
#: :data:`KEPT` most recently used).
_COMPILED: collections.OrderedDict[str, tuple[Any, Mesh]] = collections.OrderedDict()
#: How many compiled programs the process keeps for other meshes to load.
KEPT = 64
#: The digests being compiled now, each with the event its compile sets when it ends.
_PENDING: dict[str, threading.Event] = {}
#: The most seconds to wait for another thread's compile of the same program.
COMPILE_WAIT_S = 300.0


def load_or_compile(lowered: Any, mesh: Mesh) -> Any:
    """``lowered`` compiled for ``mesh``: loaded from the same program compiled for another
    mesh of this shape when it can be, else compiled.

    While another thread compiles the same program, this waits for it (at most
    :data:`COMPILE_WAIT_S` seconds, then compiles it too) rather than compile it twice.

    Args:
        lowered: a ``jax.stages.Lowered`` whose shardings are on ``mesh``.
        mesh: its mesh.

    Returns:
        The ``jax.stages.Compiled``.
    """
    digest = hashlib.sha256(lowered.as_text().encode()).hexdigest()
    with _LOCK:
        known, pending = _COMPILED.get(digest), _PENDING.get(digest)
        mine = None if known is not None or pending is not None else _PENDING.setdefault(digest, threading.Event())
    if pending is not None and not pending.wait(COMPILE_WAIT_S):
        logger.warning("a compile of the same program took over %.0f s; compiling it here as well", COMPILE_WAIT_S)
    if mine is None:
        with _LOCK:
            known = _COMPILED.get(digest)
            if known is not None:
                _COMPILED.move_to_end(digest)
    if known is not None:
        compiled, other = known
        same_client = other.devices.flat[0].client is mesh.devices.flat[0].client
        if same_client and other.devices.shape == mesh.devices.shape and other.axis_names == mesh.axis_names:
            if list(other.devices.flat) == list(mesh.devices.flat):
                return compiled
            moved = retarget(compiled, dict(zip((d.id for d in other.devices.flat), mesh.devices.flat)))
            if moved is not None:
                return moved
    try:
        compiled, fresh = compiled_here(lowered.compile)
        if fresh:  # compiled, not loaded from JAX's persistent cache
            with _LOCK:
                _COMPILED.setdefault(digest, (compiled, mesh))
                while len(_COMPILED) > KEPT:
                    _COMPILED.popitem(last=False)
    finally:
        if mine is not None:
            with _LOCK:
                _PENDING.pop(digest, None)
            mine.set()
    return compiled


class PrecompiledFunction:
    """A jitted function on ``mesh`` whose compile the precompiler and its first call share.

    :meth:`compile` (the precompiler's, ahead of need) and the first call each keep the
    executable they compile (:func:`load_or_compile`), and calls run it directly: jit's own
    cache would not serve them, since JAX keys it by the calling thread's context and
    pathwaysutils runs each attempt under its own ``jax.default_device``. Both hold the
    function's lock while they compile, so whoever comes second waits for the first instead
    of compiling it again (a load that finds its unpack being precompiled waits for it), and
    a :meth:`compile` after the first call does nothing. Once it has been compiled or
    called, calls take no lock.

    Args:
        jitted: the ``jax.jit`` function.
        mesh: the mesh its arguments' and results' shardings are on.
    """

    def __init__(self, jitted: Any, mesh: Mesh) -> None:
        self.jitted = jitted
        self.mesh = mesh
        self._compiled: Any = None
        self._lock = threading.Lock()
        self._ready = False

    def __call__(self, *args: Any) -> Any:
        if not self._ready:
            self.compile(*args)
        compiled = self._compiled
        if compiled is not None:
            try:
                return compiled(*args)
            except (TypeError, ValueError):
                # Not the types or shardings it was compiled for: jit compiles what these need.
                self._compiled = None
        return self.jitted(*args)

    def compile(self, *abstract: Any) -> None:
        """Compile for ``abstract`` arguments (running nothing), unless compiled already."""
        with self._lock:
            if not self._ready:
                self._compiled = load_or_compile(self.jitted.lower(*abstract), self.mesh)
                self._ready = True
