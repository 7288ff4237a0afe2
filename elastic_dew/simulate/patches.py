"""The read guards and the one pathwaysutils seam, installed for the active simulator.

JAX funnels reads of an array through a few places (``jax/_src/array.py``,
``jax/_src/api.py``): ``ArrayImpl._value`` (``float``, ``int``, ``bool``, ``tolist``,
``repr``, ...), ``block_until_ready`` (the method and ``jax.block_until_ready``'s batched
path), ``__array__`` (``jax.device_get``), ``__getitem__``, ``__iter__``, ``item`` and
``__dlpack__``. NumPy reads a single-device CPU array through the buffer protocol without
calling any Python method, so ``numpy.asarray``/``array``/``asanyarray``/``ascontiguousarray``
are guarded too. ``addressable_data``/``addressable_shards`` hand an array's lost mark on to
its shards. ``pathwaysutils.elastic.elastic.get_slice_to_devices`` answers from the active
simulator's topology.

:data:`registry` holds the one active simulator: :meth:`Registry.install` patches
everything and makes a simulator active, :meth:`Registry.uninstall` undoes every patch. The
guards ask the registry, so with no simulator active they only pass through.

A simulator registered here provides ``check_readable(array)`` (raise when the array's data
is lost), ``inherit_mark(parent, child)`` (a shard of a lost array is lost) and
``group(devices)`` (the slices of ``devices``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from jax._src import array as _jax_array
from jax._src.lib import xla_client as _xla_client
from pathwaysutils.elastic import elastic as _pw_elastic

__all__ = ["Simulator", "Registry", "registry"]

logger = logging.getLogger(__name__)

_ArrayImpl = _jax_array.ArrayImpl


class Simulator(Protocol):
    """What the patches ask of the active simulator."""

    def check_readable(self, array: Any) -> None: ...

    def inherit_mark(self, parent: Any, child: Any) -> None: ...

    def group(self, devices: Sequence[jax.Device]) -> Mapping[int, Sequence[jax.Device]]: ...


class Registry:
    """The active simulator (at most one) and the patches installed for it."""

    _ARRAY_METHODS = ("block_until_ready", "__getitem__", "__iter__", "__array__", "__dlpack__", "item")
    _ARRAY_PROPERTIES = ("_value",)
    _NUMPY = ("asarray", "array", "asanyarray", "ascontiguousarray")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: Simulator | None = None
        self._undo: list[Callable[[], None]] = []
        self._original_get_slice_to_devices: Callable[..., Any] | None = None

    @property
    def active(self) -> Simulator | None:
        """The simulator the guards answer for, or None."""
        return self._active

    def install(self, simulator: Simulator) -> None:
        """Patch JAX, NumPy and pathwaysutils and make ``simulator`` the active one.

        Raises ``RuntimeError`` when another simulator is active (one at a time).
        """
        with self._lock:
            if self._active is not None:
                raise RuntimeError("another SimulatedSlices is already active; one at a time")
            self._patch()
            self._active = simulator

    def uninstall(self, simulator: Simulator) -> None:
        """Undo every patch, if ``simulator`` is the active one (otherwise do nothing)."""
        with self._lock:
            if self._active is not simulator:
                return
            while self._undo:
                self._undo.pop()()
            self._original_get_slice_to_devices = None
            self._active = None

    # ----------------------------------------------------------------- guards

    def check_readable(self, array: Any) -> None:
        simulator = self._active
        if simulator is not None and type(array) is _ArrayImpl:
            simulator.check_readable(array)

    def inherit_mark(self, parent: Any, child: Any) -> None:
        simulator = self._active
        if simulator is not None:
            simulator.inherit_mark(parent, child)

    def get_slice_to_devices(self, devices: Sequence[jax.Device]) -> Mapping[int, Sequence[jax.Device]]:
        simulator = self._active
        if simulator is None:
            original = self._original_get_slice_to_devices or _pw_elastic.get_slice_to_devices
            return original(devices)
        return simulator.group(devices)

    # ----------------------------------------------------------------- patching

    def _replace(self, owner: Any, name: str, replacement: Any) -> None:
        had = name in vars(owner)
        original = vars(owner)[name] if had else getattr(owner, name)
        setattr(owner, name, replacement)

        def undo() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def _patch(self) -> None:
        self._original_get_slice_to_devices = _pw_elastic.get_slice_to_devices
        self._replace(_pw_elastic, "get_slice_to_devices", self.get_slice_to_devices)
        for name in self._ARRAY_METHODS:
            self._replace(_ArrayImpl, name, _guard_method(self, getattr(_ArrayImpl, name)))
        for name in self._ARRAY_PROPERTIES:
            self._replace(_ArrayImpl, name, _guard_property(self, vars(_ArrayImpl)[name]))
        self._replace(_ArrayImpl, "addressable_data", _marking_method(self, _ArrayImpl.addressable_data))
        self._replace(
            _ArrayImpl, "addressable_shards", _marking_property(self, vars(_ArrayImpl)["addressable_shards"])
        )
        self._replace(
            _xla_client, "batched_block_until_ready", _guard_batched(self, _xla_client.batched_block_until_ready)
        )
        for name in self._NUMPY:
            self._replace(np, name, _guard_numpy(self, getattr(np, name)))


#: The process's one registry: the simulator installs itself here.
registry = Registry()


def _guard_method(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self, *args, **kwargs):
        reg.check_readable(self)
        return original(self, *args, **kwargs)

    guarded.__name__ = getattr(original, "__name__", "guarded")
    guarded.__doc__ = getattr(original, "__doc__", None)
    return guarded


def _guard_property(reg: Registry, original: property) -> property:
    def getter(self):
        reg.check_readable(self)
        return original.__get__(self, type(self))

    return property(getter, doc=original.__doc__)


def _marking_method(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    """``addressable_data``: a shard of an array whose data is lost is lost too."""

    def marking(self, *args, **kwargs):
        child = original(self, *args, **kwargs)
        reg.inherit_mark(self, child)
        return child

    return marking


def _marking_property(reg: Registry, original: property) -> property:
    """``addressable_shards``: each shard's data inherits the array's lost mark."""

    def getter(self):
        shards = original.__get__(self, type(self))
        for shard in shards:
            if shard.data is not None:
                reg.inherit_mark(self, shard.data)
        return shards

    return property(getter, doc=original.__doc__)


def _guard_numpy(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(*args, **kwargs):
        for value in args[:1] or kwargs.values():
            reg.check_readable(value)
        return original(*args, **kwargs)

    guarded.__name__ = original.__name__
    guarded.__doc__ = original.__doc__
    guarded.__wrapped__ = original
    return guarded


def _guard_batched(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    def batched_block_until_ready(arrays):
        arrays = list(arrays)
        for array in arrays:
            reg.check_readable(array)
        return original(arrays)

    return batched_block_until_ready
