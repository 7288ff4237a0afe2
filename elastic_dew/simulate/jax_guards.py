"""The simulator's patches of JAX and NumPy: the read guards and the dispatch seams.

JAX funnels reads of an array through a few places (``jax/_src/array.py``,
``jax/_src/api.py``): ``ArrayImpl._value`` (``float``, ``int``, ``bool``, ``tolist``,
``repr``, ...), ``block_until_ready`` (the method and ``jax.block_until_ready``'s batched
path), ``__array__`` (``jax.device_get``), ``__getitem__``, ``__iter__``, ``item`` and
``__dlpack__``; each is wrapped to ask the registry first (:func:`guard_method`,
:func:`guard_property`, :func:`guard_batched`), and NumPy's conversions too
(:func:`guard_numpy`: NumPy reads a single-device CPU array through the buffer protocol
without calling any Python method). ``addressable_data``/``addressable_shards`` hand an
array's marks on to its shards (:func:`marking_method`, :func:`marking_property`), and
``jax.device_put`` to its copies (:func:`marking_copy`). A dispatch is seen at
``jax.stages.Compiled.__call__`` (:func:`guard_dispatch`) and at every call of a ``jax.jit``
function outside a trace (:func:`jit_dispatch`, with :func:`no_jit_fastpath` keeping such a
call off JAX's C++ fast path). Each wrapper is installed, and undone, by
:class:`elastic_dew.simulate.patches.Registry`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np

from elastic_dew._compat import jax as jax_private
from elastic_dew.simulate.frames import caller as _caller
from elastic_dew.simulate.frames import module_of
from elastic_dew.simulate.pathways_guards import deleted_error, donated

__all__ = [
    "JIT_SEAM", "Guarded", "guard_batched", "guard_dispatch", "guard_method", "guard_numpy", "guard_property",
    "jit_dispatch", "marking_copy", "marking_method", "marking_property", "no_jit_fastpath", "readiness",
]

_ArrayImpl = jax_private.ARRAY_IMPL.get()


class Guarded(Protocol):
    """What the guards ask of the registry (:class:`elastic_dew.simulate.patches.Registry`)."""

    @property
    def active(self) -> Any: ...

    def check_readable(self, array: Any) -> None: ...

    def answering(self, array: Any) -> bool: ...

    def inherit_mark(self, parent: Any, child: Any) -> None: ...

    def dispatch(self, inputs: Any, call: Callable[[], Any], name: str | None, caller: Any,
                 outputs: Callable[[Any], Any] = ..., out_bytes: Callable[[], int] = ...) -> Any: ...

    def copied(self, source: Any, copy: Any, caller: Any = None) -> None: ...


def guard_method(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self, *args, **kwargs):
        reg.check_readable(self)
        return original(self, *args, **kwargs)

    guarded.__name__ = getattr(original, "__name__", "guarded")
    guarded.__doc__ = getattr(original, "__doc__", None)
    return guarded


def readiness(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    """``is_ready``: a result owed by a hung slice is never ready (it does not block)."""

    def is_ready(self):
        return reg.answering(self) and original(self)

    is_ready.__doc__ = getattr(original, "__doc__", None)
    return is_ready


def guard_property(reg: Guarded, original: property) -> property:
    def getter(self):
        reg.check_readable(self)
        return original.__get__(self, type(self))

    return property(getter, doc=original.__doc__)


def marking_method(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    """``addressable_data``: a shard of an array whose data is lost is lost too."""

    def marking(self, *args, **kwargs):
        child = original(self, *args, **kwargs)
        reg.inherit_mark(self, child)
        return child

    return marking


def marking_property(reg: Guarded, original: property) -> property:
    """``addressable_shards``: each shard's data inherits the array's lost mark."""

    def getter(self):
        shards = original.__get__(self, type(self))
        for shard in shards:
            if shard.data is not None:
                reg.inherit_mark(self, shard.data)
        return shards

    return property(getter, doc=original.__doc__)


def guard_numpy(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(*args, **kwargs):
        for value in args[:1] or kwargs.values():
            reg.check_readable(value)
        return original(*args, **kwargs)

    guarded.__name__ = original.__name__
    guarded.__doc__ = original.__doc__
    setattr(guarded, "__wrapped__", original)  # what functools.wraps would set, and only that
    return guarded


def guard_batched(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    def batched_block_until_ready(arrays):
        arrays = list(arrays)
        for array in arrays:
            reg.check_readable(array)
        return original(arrays)

    return batched_block_until_ready


def guard_dispatch(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Compiled.__call__``: a dispatch (:meth:`elastic_dew.simulate.patches.Registry.dispatch`)."""

    def __call__(self, *args, **kwargs):
        return reg.dispatch((args, kwargs), lambda: original(self, *args, **kwargs), _compiled_name(self),
                            _caller(), out_bytes=lambda: _compiled_out_bytes(self))

    return __call__


def _compiled_name(compiled: Any) -> str | None:
    """The name of the function a compiled program was lowered from (``train_step`` for
    ``jit(train_step).lower(...).compile()``), kept on the object after the first ask."""
    name = vars(compiled).get("_elastic_dew_name")
    if name is None:
        name = jax_private.compiled_name(compiled)
        if name is None:
            return None
        if name.startswith("jit(") and name.endswith(")"):
            name = name[4:-1]
        compiled._elastic_dew_name = name
    return name


def _avals_bytes(avals: Any) -> int:
    """The bytes arrays of these shapes and dtypes hold (0 for a dtype without a size)."""
    total = 0
    for aval in jax.tree_util.tree_leaves(avals):
        try:
            total += int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
        except (TypeError, AttributeError):
            continue  # an extended dtype (a PRNG key): no plain size
    return total


def _compiled_out_bytes(compiled: Any) -> int:
    """The bytes a compiled program's results hold, kept on the object after the first ask."""
    size = vars(compiled).get("_elastic_dew_out_bytes")
    if size is None:
        try:
            size = _avals_bytes(compiled.out_info)
        except Exception:  # noqa: BLE001 - a program whose outputs cannot be described counts none
            size = 0
        compiled._elastic_dew_out_bytes = size
    return size


#: Whether this JAX has the jit internals the jit seam replaces (the seam's
#: ``jax_private.jit_seam``); without them a ``jax.jit`` call is not seen at dispatch.
JIT_SEAM = jax_private.jit_seam()
_no_fastpath = threading.local()


def jit_dispatch(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    """``_run_python_pjit``: a ``jax.jit`` call outside any trace is a dispatch."""

    def _run_python_pjit(p, args_flat, fun, args, kwargs):
        caller = _jit_caller(_caller())
        if (reg.active is None or not jax_private.trace_state_clean() or caller is None
                or module_of(caller).startswith(("jax.", "jaxlib."))):
            # JAX's own calls (a primitive applied outside jit, jax.numpy's helpers) keep
            # the fast path: they are not a loop's dispatches.
            return original(p, args_flat, fun, args, kwargs)
        result = reg.dispatch(
            args_flat, lambda: original(p, args_flat, fun, args, kwargs), p.params.get("name"), caller,
            outputs=lambda result: result[1],
            out_bytes=lambda: _avals_bytes(p.params["jaxpr"].out_avals),
        )
        _no_fastpath.jit = True  # the C++ cache must call back here next time
        return result

    return _run_python_pjit


def _jit_caller(frame: Any) -> Any:
    """The frame that called the ``jax.jit`` function whose cache miss is ``frame``'s."""
    while frame is not None and module_of(frame) in jax_private.JIT_FRAME_MODULES:
        frame = frame.f_back
    return frame


def no_jit_fastpath(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_get_fastpath_data``: none for a ``jax.jit`` call just run by :func:`jit_dispatch`."""

    def _get_fastpath_data(*args, **kwargs):
        if getattr(_no_fastpath, "jit", False):
            _no_fastpath.jit = False
            return None
        return original(*args, **kwargs)

    return _get_fastpath_data


def marking_copy(reg: Guarded, original: Callable[..., Any]) -> Callable[..., Any]:
    def device_put(x, *args, **kwargs):
        for leaf in jax.tree_util.tree_leaves(x):
            if type(leaf) is _ArrayImpl and donated(leaf):
                raise deleted_error(leaf)
        copy = original(x, *args, **kwargs)
        reg.copied(x, copy, _caller())
        return copy

    device_put.__name__ = original.__name__
    device_put.__doc__ = original.__doc__
    setattr(device_put, "__wrapped__", original)  # what functools.wraps would set, and only that
    return device_put
