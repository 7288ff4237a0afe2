"""The read guards and the one pathwaysutils seam, installed for the active simulator.

JAX funnels reads of an array through a few places (``jax/_src/array.py``,
``jax/_src/api.py``): ``ArrayImpl._value`` (``float``, ``int``, ``bool``, ``tolist``,
``repr``, ...), ``block_until_ready`` (the method and ``jax.block_until_ready``'s batched
path), ``__array__`` (``jax.device_get``), ``__getitem__``, ``__iter__``, ``item`` and
``__dlpack__``. NumPy reads a single-device CPU array through the buffer protocol without
calling any Python method, so ``numpy.asarray``/``array``/``asanyarray``/``ascontiguousarray``
are guarded too. ``addressable_data``/``addressable_shards`` hand an array's lost mark on to
its shards, and ``jax.device_put`` to its copies. Dispatch is intercepted at
``jax.stages.Compiled.__call__`` (what ``jit(...).lower(...).compile()`` returns: the
protocol's compiled steps and the health check's probes) and at every call of a
``jax.jit`` function: JAX's C++ fast path, which has no Python seam, is turned off for
``jax.jit`` functions while a simulator is active (JAX's ``_run_python_pjit`` runs
each call and ``_get_fastpath_data`` gives the C++ cache no fast path for it; JAX's C++
jit caches are emptied at install and uninstall, so no call takes a fast path cached
outside the simulator and none stays on the slow one after it; the cost per call is in
``docs/performance.md``).
Primitive operations applied one by one (``x + 1`` outside ``jit``) keep the fast path and
are not seen at dispatch. Each dispatch asks the simulator whether it is a step of the
loop (:meth:`Registry.dispatch`) and, if so, fires what is due at it.
Every ``jax.Device`` has a ``slice_index`` attribute, its simulated slice (``None`` for a
host device outside every slice), as every Pathways device has: pathwaysutils' own
``get_slice_to_devices``, Orbax's Pathways worker grouping (keyed ``(task, slice)``, so each
simulated slice is one worker) and code that groups devices itself read it.
``pathwaysutils.elastic.elastic.get_slice_to_devices`` answers from the active simulator's
topology too, leaving out devices outside every slice. The Pathways backend tests answer
``True``: ``pathwaysutils.is_pathways_backend_used`` (at ``pathwaysutils`` and
``pathwaysutils._initialize``) and Orbax's ``multihost.is_pathways_backend`` (at each binding
:data:`elastic_dew._compat.orbax.PATHWAYS_BACKEND_BINDINGS` names). Every
pathwaysutils ``Manager`` created while a simulator is active is remembered
(weakly), and its ``_check_inactive_slices`` (the monitor thread's check) runs under the
simulator's lock, so :meth:`Registry.refresh_managers` can make each see a change of slice
health at once and no check in flight can overwrite that with an older answer.
pathwaysutils' mesh-axis operations that donate their inputs (``pathwaysutils.jax``'s
``concatenate_by_mesh_axis`` and ``split_by_mesh_axis``, which Orbax's Snapshotter calls)
leave a donated input deleted, as on Pathways, instead of broken, and copy nothing
(:func:`_donating_views`).

Every private name these patches replace or read (and each pathwaysutils name whose
module-level look-up they rely on) is declared, with why and what public API would replace
it, in the seam :mod:`elastic_dew._compat` (``jax_private``, ``pw_private``), checked by
``tests/test_compat.py``.

:data:`registry` holds the one active simulator: :meth:`Registry.install` patches
everything and makes a simulator active, :meth:`Registry.uninstall` undoes every patch. The
guards ask the registry, so with no simulator active they only pass through.

A simulator registered here provides ``check_readable(array)`` (raise when the array's data
is lost, block while it is a hung slice's result), ``check_dispatch(arrays)`` (raise when a
program's input is lost), ``derive(inputs, outputs)`` (a program's results wait on hung
inputs), ``inherit_mark(parent, child)`` (a shard or copy of a lost array is lost),
``group(devices)`` (the slices of ``devices``), ``slice_of(device)``, ``step_of(arrays, name,
caller, out_bytes)`` (whether a dispatch is the loop's step, and its number), ``on_dispatch(phase,
step)`` (fire what is due there), ``waiting_for_slices(delta)`` and ``attempted(active)``
(pathwaysutils' waits for slices), ``sleep(seconds)`` (a pause of those waits between
checks, ended early by a change of slice health) and ``lock``.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from pathwaysutils.elastic import manager as _pw_manager

from elastic_dew._compat import Private
from elastic_dew._compat import jax as jax_private
from elastic_dew._compat import pathwaysutils as pw_private
from elastic_dew._compat import orbax as orbax_private

__all__ = ["Simulator", "Registry", "registry"]

logger = logging.getLogger(__name__)

_ArrayImpl = jax_private.ARRAY_IMPL.get()


class Simulator(Protocol):
    """What the patches ask of the active simulator."""

    def check_readable(self, array: Any) -> None: ...

    def inherit_mark(self, parent: Any, child: Any) -> None: ...

    def group(self, devices: Sequence[jax.Device]) -> Mapping[int, Sequence[jax.Device]]: ...

    def check_dispatch(self, arrays: list[Any]) -> None: ...

    def answering(self, array: Any) -> bool: ...

    def derive(self, inputs: list[Any], outputs: list[Any]) -> None: ...

    def slice_of(self, device: jax.Device) -> int | None: ...

    def step_of(self, arrays: list[Any], name: str | None, caller: Any, out_bytes: int) -> int | None: ...

    def on_dispatch(self, phase: str, step: int) -> None: ...

    def waiting_for_slices(self, delta: int) -> None: ...

    def attempted(self, active: Any) -> None: ...

    def sleep(self, seconds: float) -> None: ...

    lock: Any


class Registry:
    """The active simulator (at most one) and the patches installed for it."""

    _ARRAY_METHODS = jax_private.ARRAY_READS
    _ARRAY_PROPERTIES = (jax_private.ARRAY_VALUE.name,)
    _NUMPY = ("asarray", "array", "asanyarray", "ascontiguousarray")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: Simulator | None = None
        self._undo: list[Callable[[], None]] = []
        self._original_get_slice_to_devices: Callable[..., Any] | None = None
        self._managers: weakref.WeakSet = weakref.WeakSet()

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
            self._managers = weakref.WeakSet()
            self._active = None

    # ----------------------------------------------------------------- guards

    def check_readable(self, array: Any) -> None:
        simulator = self._active
        if simulator is not None and type(array) is _ArrayImpl:
            if _donated(array):
                raise _deleted_error(array)
            simulator.check_readable(array)

    def answering(self, array: Any) -> bool:
        simulator = self._active
        return simulator is None or type(array) is not _ArrayImpl or simulator.answering(array)

    def inherit_mark(self, parent: Any, child: Any) -> None:
        simulator = self._active
        if simulator is not None:
            simulator.inherit_mark(parent, child)

    def dispatch(self, inputs: Any, call: Callable[[], Any], name: str | None, caller: Any,
                 outputs: Callable[[Any], Any] = lambda result: result,
                 out_bytes: Callable[[], int] = lambda: 0) -> Any:
        """Run ``call`` (a dispatch of program ``name`` on ``inputs`` by frame ``caller``,
        whose results hold ``out_bytes()`` bytes) as the simulator sees it.

        When the simulator counts it as the ``N``-th step of a loop that announces nothing,
        what is due at ``dispatch`` of step ``N`` fires before (a loss there fails this
        dispatch) and what is due at ``step`` of ``N`` fires after it, with the work in
        flight. A lost input fails the dispatch; results of hung inputs hang.
        """
        simulator = self._active
        if simulator is None:
            return call()
        arrays = [a for a in jax.tree_util.tree_leaves(inputs) if type(a) is _ArrayImpl]
        step = simulator.step_of(arrays, name, caller, out_bytes())
        if step is not None:
            simulator.on_dispatch("dispatch", step)
        donated = next((a for a in arrays if _donated(a)), None)
        if donated is not None:
            raise _deleted_error(donated)
        simulator.check_dispatch(arrays)
        result = call()
        simulator.derive(arrays, [a for a in jax.tree_util.tree_leaves(outputs(result)) if type(a) is _ArrayImpl])
        if step is not None:
            simulator.on_dispatch("step", step)
        return result

    def copied(self, source: Any, copy: Any) -> None:
        """``jax.device_put``: each copy inherits its source's lost or hung mark."""
        simulator = self._active
        if simulator is None:
            return
        sources, copies = jax.tree_util.tree_leaves(source), jax.tree_util.tree_leaves(copy)
        if len(sources) == len(copies):
            for parent, child in zip(sources, copies):
                if type(parent) is _ArrayImpl and type(child) is _ArrayImpl:
                    simulator.inherit_mark(parent, child)

    def refresh_managers(self) -> None:
        """Make every Manager check its inactive slices now (the monitor thread's check)."""
        if self._active is None:
            return
        for manager in list(self._managers):
            try:
                pw_private.check_inactive_slices(manager)
            except Exception:  # noqa: BLE001 - the monitor thread logs and carries on too
                logger.exception("the Manager's check of its inactive slices failed")

    def slice_index(self, device: jax.Device) -> int | None:
        """``device.slice_index``: its simulated slice, ``None`` outside every slice."""
        simulator = self._active
        if simulator is None:
            raise AttributeError("'Device' object has no attribute 'slice_index'")
        return simulator.slice_of(device)

    def get_slice_to_devices(self, devices: Sequence[jax.Device]) -> Mapping[int, Sequence[jax.Device]]:
        simulator = self._active
        if simulator is None:
            original = self._original_get_slice_to_devices or pw_private.GET_SLICE_TO_DEVICES.get()
            return original(devices)
        return simulator.group(devices)

    # ----------------------------------------------------------------- patching

    def _replace(self, owner: Any, name: str, replacement: Any) -> None:
        had = name in vars(owner)
        original = vars(owner)[name] if had else getattr(owner, name, None)
        setattr(owner, name, replacement)

        def undo() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def _replace_private(self, point: Private, wrap: Callable[[Any], Any]) -> None:
        """Replace the seam's ``point`` with ``wrap`` of its own object (a class's own
        descriptor, for a member of a class)."""
        self._replace(point.owner(), point.name, wrap(point.raw()))

    def _patch(self) -> None:
        self._original_get_slice_to_devices = pw_private.GET_SLICE_TO_DEVICES.get()
        self._replace_private(pw_private.GET_SLICE_TO_DEVICES, lambda _: self.get_slice_to_devices)
        self._replace(jax.Device, "slice_index", property(self.slice_index, doc=self.slice_index.__doc__))
        for point in pw_private.BACKEND_TESTS:
            self._replace_private(point, lambda _: _pathways_backend)
        for owner in orbax_private.pathways_backend_bindings():
            self._replace(owner, "is_pathways_backend", _pathways_backend)
        for name in self._ARRAY_METHODS:
            self._replace(_ArrayImpl, name, _guard_method(self, getattr(_ArrayImpl, name)))
        for name in self._ARRAY_PROPERTIES:
            self._replace(_ArrayImpl, name, _guard_property(self, vars(_ArrayImpl)[name]))
        self._replace(_ArrayImpl, "is_ready", _readiness(self, _ArrayImpl.is_ready))
        self._replace(_ArrayImpl, "is_deleted", _deleted_if_donated(_ArrayImpl.is_deleted))
        self._replace(_ArrayImpl, "addressable_data", _marking_method(self, _ArrayImpl.addressable_data))
        self._replace(
            _ArrayImpl, "addressable_shards", _marking_property(self, vars(_ArrayImpl)["addressable_shards"])
        )
        self._replace_private(jax_private.BATCHED_BLOCK_UNTIL_READY, lambda original: _guard_batched(self, original))
        for name in self._NUMPY:
            self._replace(np, name, _guard_numpy(self, getattr(np, name)))
        self._replace(jax.stages.Compiled, "__call__", _guard_dispatch(self, vars(jax.stages.Compiled)["__call__"]))
        if _JIT_SEAM:
            self._replace_private(jax_private.RUN_PYTHON_PJIT, lambda original: _jit_dispatch(self, original))
            self._replace_private(jax_private.GET_FASTPATH_DATA, _no_jit_fastpath)
            jax_private.clear_jit_caches()
            self._undo.append(jax_private.clear_jit_caches)
        self._replace_private(pw_private.WAIT_FOR_SLICES, lambda original: _counting_waits(self, original))
        self._replace_private(pw_private.ELASTIC_TIME, lambda original: _SimulatedSleep(self, original))
        for point in pw_private.DONATING_OPS:
            if point.check() is None:
                self._replace_private(point, _donating_views)
        self._replace(jax, "device_put", _marking_copy(self, jax.device_put))
        self._replace(_pw_manager.Manager, "__init__", _remembering(self, vars(_pw_manager.Manager)["__init__"]))
        self._replace_private(pw_private.MANAGER_CHECK, lambda original: _under_lock(self, original))


#: The process's one registry: the simulator installs itself here.
registry = Registry()


def _pathways_backend() -> bool:
    """The Pathways backend tests' answer while a simulator stands in for Pathways."""
    return True


def _guard_method(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self, *args, **kwargs):
        reg.check_readable(self)
        return original(self, *args, **kwargs)

    guarded.__name__ = getattr(original, "__name__", "guarded")
    guarded.__doc__ = getattr(original, "__doc__", None)
    return guarded


def _readiness(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    """``is_ready``: a result owed by a hung slice is never ready (it does not block)."""

    def is_ready(self):
        return reg.answering(self) and original(self)

    is_ready.__doc__ = getattr(original, "__doc__", None)
    return is_ready


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


def _guard_dispatch(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Compiled.__call__``: a dispatch (:meth:`Registry.dispatch`)."""

    def __call__(self, *args, **kwargs):
        return reg.dispatch((args, kwargs), lambda: original(self, *args, **kwargs), _compiled_name(self),
                            sys._getframe(1), out_bytes=lambda: _compiled_out_bytes(self))

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
_JIT_SEAM = jax_private.jit_seam()
_no_fastpath = threading.local()


def _jit_dispatch(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    """``_run_python_pjit``: a ``jax.jit`` call outside any trace is a dispatch."""

    def _run_python_pjit(p, args_flat, fun, args, kwargs):
        caller = _jit_caller(sys._getframe(1))
        if (reg.active is None or not jax_private.trace_state_clean() or caller is None
                or _module(caller).startswith(("jax.", "jaxlib."))):
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


def _module(frame: Any) -> str:
    return frame.f_globals.get("__name__", "")


def _jit_caller(frame: Any) -> Any:
    """The frame that called the ``jax.jit`` function whose cache miss is ``frame``'s."""
    while frame is not None and _module(frame) in jax_private.JIT_FRAME_MODULES:
        frame = frame.f_back
    return frame


def _no_jit_fastpath(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_get_fastpath_data``: none for a ``jax.jit`` call just run by :func:`_jit_dispatch`."""

    def _get_fastpath_data(*args, **kwargs):
        if getattr(_no_fastpath, "jit", False):
            _no_fastpath.jit = False
            return None
        return original(*args, **kwargs)

    return _get_fastpath_data


#: The attribute that marks an input a donating mesh-axis operation took (see
#: :func:`_donating_views`): it reads as deleted, as a donated array does on Pathways.
_DONATED = "_elastic_dew_donated"


def _deleted_error(array: Any) -> RuntimeError:
    """JAX's own error for reading a deleted array."""
    return RuntimeError(f"Array has been deleted with shape={array.aval.str_short()}.")


def _donated(array: Any) -> bool:
    return getattr(array, _DONATED, False) is True


def _view(array: Any) -> Any:
    """A new ``jax.Array`` over ``array``'s own device buffers (no bytes copied)."""
    return jax.make_array_from_single_device_arrays(
        array.shape, array.sharding, [shard.data for shard in array.addressable_shards]
    )


def _donating_views(original: Callable[..., Any]) -> Callable[..., Any]:
    """A pathwaysutils mesh-axis operation whose donated inputs end deleted, as on Pathways,
    without copying a byte.

    On the CPU client jaxlib's ``_pathways`` operations take a donated input's buffers and
    leave the array neither deleted nor whole: asking it anything (``is_deleted()``, and
    ``jax.live_arrays()``, which asks every live array) dereferences a null buffer and
    kills the process with SIGSEGV. With ``donate=True`` this hands the operation views of
    the inputs (new arrays over the same buffers, freed at once: the broken ones), so the
    outputs own the inputs' buffers as on Pathways, and marks the inputs themselves
    donated: they stay whole underneath (``jax.live_arrays()`` may ask them anything) but
    read as deleted (``is_deleted()``; a read, a dispatch or a ``device_put`` of one raises
    JAX's "Array has been deleted"), what a donated array is on Pathways. A copy of every
    input instead would move the whole snapshot twice per load on CPU.
    """

    def donating(*args, **kwargs):
        if not kwargs.get("donate") or "arrays" not in kwargs:  # pathwaysutils passes both by name
            return original(*args, **kwargs)
        arrays = kwargs["arrays"]
        kwargs["arrays"] = jax.tree_util.tree_map(_view, arrays)
        result = original(*args, **kwargs)
        del kwargs["arrays"]  # the views, left broken by the donation: freeing them is safe
        for array in jax.tree_util.tree_leaves(arrays):
            setattr(array, _DONATED, True)
        return result

    donating.__name__ = getattr(original, "__name__", "donating")
    donating.__doc__ = getattr(original, "__doc__", None)
    return donating


def _deleted_if_donated(original: Callable[..., Any]) -> Callable[..., Any]:
    """``jax.Array.is_deleted``: an input a donating operation took is deleted."""

    def is_deleted(self):
        return _donated(self) or original(self)

    is_deleted.__doc__ = getattr(original, "__doc__", None)
    return is_deleted


def _counting_waits(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    """``pathwaysutils.elastic.elastic.wait_for_slices``: the simulator knows a loop waits."""

    def wait_for_slices(*args, **kwargs):
        simulator = reg.active
        if simulator is None:
            return original(*args, **kwargs)
        simulator.waiting_for_slices(1)
        try:
            active = original(*args, **kwargs)
        finally:
            simulator.waiting_for_slices(-1)
        simulator.attempted(active)
        return active

    wait_for_slices.__doc__ = original.__doc__
    return wait_for_slices


class _SimulatedSleep:
    """``pathwaysutils.elastic.elastic``'s ``time`` module, whose ``sleep`` (the pause of
    ``wait_for_slices`` between its checks of the slices) ends early when a slice's health
    changes in the active simulator, so a wait learns of a returned slice as soon as the
    schedule returns it, whatever ``poll_interval`` it was given. Everything else is the
    real ``time``."""

    def __init__(self, reg: Registry, real: Any) -> None:
        self._reg, self._real = reg, real

    def sleep(self, seconds: float) -> None:
        simulator = self._reg.active
        if simulator is None:
            self._real.sleep(seconds)
        else:
            simulator.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _marking_copy(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    def device_put(x, *args, **kwargs):
        for leaf in jax.tree_util.tree_leaves(x):
            if type(leaf) is _ArrayImpl and _donated(leaf):
                raise _deleted_error(leaf)
        copy = original(x, *args, **kwargs)
        reg.copied(x, copy)
        return copy

    device_put.__name__ = original.__name__
    device_put.__doc__ = original.__doc__
    device_put.__wrapped__ = original
    return device_put


def _remembering(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        reg._managers.add(self)

    return __init__


def _under_lock(reg: Registry, original: Callable[..., Any]) -> Callable[..., Any]:
    def _check_inactive_slices(self):
        simulator = reg.active
        if simulator is None:
            return original(self)
        with simulator.lock:
            return original(self)

    return _check_inactive_slices
