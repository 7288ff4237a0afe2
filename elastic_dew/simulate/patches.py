"""The simulator's patches of JAX, NumPy, pathwaysutils and Orbax, installed for the active
simulator and undone when it exits.

Three targets, each wrapped in a module of its own: JAX's and NumPy's reads and JAX's
dispatches (:mod:`elastic_dew.simulate.jax_guards`: the read guards, the marks handed to
shards and copies, the dispatch seams of compiled programs and ``jax.jit`` calls, JAX's C++
fast path turned off for ``jax.jit`` functions while a simulator is active, its C++ jit
caches emptied at install and uninstall; the cost per call is in ``docs/performance.md``);
pathwaysutils and Orbax (:mod:`elastic_dew.simulate.pathways_guards`: the Pathways backend
answers, donating mesh-axis operations, the waits for slices, the Managers' checks under the
simulator's lock); and the devices and slices, here: every ``jax.Device`` has a
``slice_index`` attribute, its simulated slice (``None`` for a host device outside every
slice), as every Pathways device has (pathwaysutils' own ``get_slice_to_devices``, Orbax's
Pathways worker grouping, keyed ``(task, slice)`` so each simulated slice is one worker, and
code that groups devices itself read it), and
``pathwaysutils.elastic.elastic.get_slice_to_devices`` answers from the active simulator's
topology, leaving out devices outside every slice. Primitive operations applied one by one
(``x + 1`` outside ``jit``) keep the fast path and are not seen at dispatch. Each dispatch
asks the simulator whether it is a step of the loop (:meth:`Registry.dispatch`) and, if so,
fires what is due at it. Every pathwaysutils ``Manager`` created while a simulator is active
is remembered (weakly, :meth:`Registry.remember`), so :meth:`Registry.refresh_managers` can
make each see a change of slice health at once and no check in flight can overwrite that
with an older answer. Every Orbax ``Snapshotter`` elastic_dew's own loop saves with is
remembered too (weakly), so :meth:`Registry.land_snapshots` can land its copy in flight before
a fault fires, as the program's own are landed (:meth:`elastic_dew.simulate.watch.Watch.land_snapshots`).

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

import functools
import inspect
import logging
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
from elastic_dew.simulate import jax_guards as guards
from elastic_dew.simulate import watch_guards as watching
from elastic_dew.simulate.watch import own_loop_on_stack
from elastic_dew.simulate.pathways_guards import (
    SimulatedSleep, counting_waits, deleted_error, deleted_if_donated, donated, donating_views, pathways_backend,
    remembering, under_lock,
)

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
        self._snapshotters: weakref.WeakSet = weakref.WeakSet()

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
            self._snapshotters = weakref.WeakSet()
            self._active = None

    # ----------------------------------------------------------------- guards

    def check_readable(self, array: Any) -> None:
        simulator = self._active
        if simulator is not None and type(array) is _ArrayImpl:
            if donated(array):
                raise deleted_error(array)
            try:
                simulator.check_readable(array)
            except jax.errors.JaxRuntimeError:
                watching.detected(simulator, "read", inspect.currentframe())
                raise

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
        gone = next((a for a in arrays if donated(a)), None)
        if gone is not None:
            raise deleted_error(gone)
        watch = getattr(simulator, "watch", None)
        api = f"a dispatch of {name or 'a program'}"
        if watch is not None:
            watch.placing(arrays, api, caller)
        try:
            simulator.check_dispatch(arrays)
        except jax.errors.JaxRuntimeError:
            watching.detected(simulator, "dispatch", caller)
            raise
        result = call()
        results = [a for a in jax.tree_util.tree_leaves(outputs(result)) if type(a) is _ArrayImpl]
        simulator.derive(arrays, results)
        if watch is not None:
            if step is not None:
                watch.stepped(arrays, results, step)
            else:
                watch.derived(arrays, results)
            watch.placing(results, api, caller)
        if step is not None:
            simulator.on_dispatch("step", step)
        return result

    def copied(self, source: Any, copy: Any, caller: Any = None) -> None:
        """``jax.device_put`` called from frame ``caller``: each copy inherits its source's
        lost or hung mark and its position, and the watch sees where the copy went."""
        simulator = self._active
        if simulator is None:
            return
        sources, copies = jax.tree_util.tree_leaves(source), jax.tree_util.tree_leaves(copy)
        pairs = [(parent, child) for parent, child in zip(sources, copies)
                 if type(parent) is _ArrayImpl and type(child) is _ArrayImpl] if len(sources) == len(copies) else []
        for parent, child in pairs:
            simulator.inherit_mark(parent, child)
        watch = getattr(simulator, "watch", None)
        if watch is not None:
            for parent, child in pairs:
                watch.derived([parent], [child])
            watch.placing([a for a in copies if type(a) is _ArrayImpl], "jax.device_put", caller)

    def remember(self, manager: Any) -> None:
        """Remember a pathwaysutils ``Manager`` created while a simulator is active (weakly)."""
        self._managers.add(manager)
        watch = getattr(self._active, "watch", None)
        if watch is not None:
            watch.created("Manager")

    def refresh_managers(self) -> None:
        """Make every Manager check its inactive slices now (the monitor thread's check)."""
        if self._active is None:
            return
        for manager in list(self._managers):
            try:
                pw_private.check_inactive_slices(manager)
            except Exception:  # noqa: BLE001 - the monitor thread logs and carries on too
                logger.exception("the Manager's check of its inactive slices failed")

    def land_snapshots(self) -> None:
        """Land the snapshot copies in flight, on the calling thread (the loop's, inside its
        announcement or dispatch), before a fault fires or a phase meets them: each Orbax
        ``Snapshotter`` elastic_dew's own loop saved with while this simulator was active is
        joined (its copy is of a step already read, so the join ends), then the program's own
        are each given the watch's landing time. Never called while a slice hangs (a copy could
        wait on it)."""
        for snapshotter in list(self._snapshotters):
            snapshotter.join()
        watch = getattr(self._active, "watch", None)
        if watch is not None:
            watch.land_snapshots()

    def _remembering_saves(self, save: Callable[..., Any]) -> Callable[..., Any]:
        """``Snapshotter.save``: a save elastic_dew's own loop makes remembers its Snapshotter."""

        @functools.wraps(save)
        def remembered(snapshotter: Any, *args: Any, **kwargs: Any) -> Any:
            if self._active is not None and own_loop_on_stack(inspect.currentframe()):
                self._snapshotters.add(snapshotter)
            return save(snapshotter, *args, **kwargs)

        return remembered

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
            self._replace_private(point, lambda _: pathways_backend)
        for owner in orbax_private.pathways_backend_bindings():
            self._replace(owner, "is_pathways_backend", pathways_backend)
        for name in self._ARRAY_METHODS:
            self._replace(_ArrayImpl, name, guards.guard_method(self, getattr(_ArrayImpl, name)))
        for name in self._ARRAY_PROPERTIES:
            self._replace(_ArrayImpl, name, guards.guard_property(self, vars(_ArrayImpl)[name]))
        self._replace(_ArrayImpl, "is_ready", guards.readiness(self, _ArrayImpl.is_ready))
        self._replace(_ArrayImpl, "is_deleted", deleted_if_donated(_ArrayImpl.is_deleted))
        self._replace(_ArrayImpl, "addressable_data", guards.marking_method(self, _ArrayImpl.addressable_data))
        self._replace(
            _ArrayImpl, "addressable_shards", guards.marking_property(self, vars(_ArrayImpl)["addressable_shards"])
        )
        self._replace_private(jax_private.BATCHED_BLOCK_UNTIL_READY, lambda original: guards.guard_batched(self, original))
        for name in self._NUMPY:
            self._replace(np, name, guards.guard_numpy(self, getattr(np, name)))
        self._replace(jax.stages.Compiled, "__call__", guards.guard_dispatch(self, vars(jax.stages.Compiled)["__call__"]))
        if guards.JIT_SEAM:
            self._replace_private(jax_private.RUN_PYTHON_PJIT, lambda original: guards.jit_dispatch(self, original))
            self._replace_private(jax_private.GET_FASTPATH_DATA, guards.no_jit_fastpath)
            jax_private.clear_jit_caches()
            self._undo.append(jax_private.clear_jit_caches)
        self._replace_private(pw_private.WAIT_FOR_SLICES, lambda original: counting_waits(self, original))
        self._replace_private(pw_private.ELASTIC_TIME, lambda original: SimulatedSleep(self, original))
        for point in pw_private.DONATING_OPS:
            if point.check() is None:
                self._replace_private(point, lambda original: donating_views(self, original))
        self._replace(jax, "device_put", guards.marking_copy(self, jax.device_put))
        self._replace(_pw_manager.Manager, "__init__", remembering(self, vars(_pw_manager.Manager)["__init__"]))
        self._replace_private(pw_private.MANAGER_CHECK, lambda original: under_lock(self, original))
        # What the program does with its state, for the diagnosis (elastic_dew.simulate.watch):
        # public methods of pathwaysutils and Orbax, wrapped (elastic_dew.simulate.watch_guards).
        manager = _pw_manager.Manager
        self._replace(manager, "elastic_retry", watching.tracking_retry(self, vars(manager)["elastic_retry"]))
        self._replace(manager, watching.AVAILABLE, watching.available_property(self))
        self._replace(manager, watching.ACTIVE, watching.active_property(self, vars(manager)[watching.ACTIVE]))
        snapshotter = orbax_private.Snapshotter
        self._replace(snapshotter, "__init__", watching.made(self, "Snapshotter", vars(snapshotter)["__init__"]))
        self._replace(snapshotter, "save",
                      self._remembering_saves(watching.snapshot_save(self, vars(snapshotter)["save"])))
        self._replace(snapshotter, "load", watching.snapshot_load(self, vars(snapshotter)["load"]))
        checkpoints = watching.checkpoint_manager()
        self._replace(checkpoints, "__init__", watching.made(self, "CheckpointManager", vars(checkpoints)["__init__"]))
        self._replace(checkpoints, "save", watching.checkpoint_save(self, vars(checkpoints)["save"]))
        self._replace(checkpoints, "restore", watching.checkpoint_restore(self, vars(checkpoints)["restore"]))
        watching.install_restore_paths(self, self._replace)
        data = watching.elastic_iterator()
        for name, what in (("__init__", "made"), ("set_state", "set_state"), ("__next__", "next")):
            self._replace(data, name, watching.data_call(self, what, vars(data)[name]))


#: The process's one registry: the simulator installs itself here.
registry = Registry()
