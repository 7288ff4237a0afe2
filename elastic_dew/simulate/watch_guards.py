"""The patches that feed the simulator's watch: what the program does with its state.

Public methods of pathwaysutils and Orbax, wrapped while a simulator is active
(:class:`elastic_dew.simulate.patches.Registry` installs them), each telling the active
simulator's :class:`~elastic_dew.simulate.watch.Watch` what happened: ``Manager.elastic_retry``
(when the retried function runs and how each attempt ended), the ``Manager``'s
``available_inactive_slices`` (a property over the instance's own value: when it became
non-empty, and whether the program, not pathwaysutils, read it), Orbax's ``Snapshotter``
(made, ``save``, ``load``), ``CheckpointManager`` (made, ``save``, ``restore``), Orbax's other
restore paths (v0 ``Checkpointer.restore``, v1 ``load``/``load_pytree``/``load_checkpointables``
of a path) and v1 ``training.Checkpointer`` (made, every save and load form), Grain's
``ElasticIterator`` (made, ``set_state``, a batch taken), and the
slice-down errors the simulator raises at a read or a dispatch the program made. A
``Snapshotter.save`` gives the request before it :data:`LANDING_SECONDS` to be taken up, so
Orbax skips a save only when the previous copy waits on work that has not finished. With no
simulator active every wrapper only passes through.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.simulate.frames import caller as _caller
from elastic_dew.simulate.frames import module_of, own_loop_on_stack
from elastic_dew.simulate.leaves import placed_leaves
from elastic_dew.simulate.watch import LANDING_SECONDS

__all__ = [
    "ACTIVE", "AVAILABLE", "LANDING_SECONDS", "active_property", "available_property", "checkpoint_manager",
    "checkpoint_restore", "checkpoint_save", "checkpointer_load", "checkpointer_save", "data_call", "detected",
    "elastic_iterator", "install_restore_paths", "made", "path_restore", "snapshot_load", "snapshot_save",
    "tracking_retry", "V1_LOADS", "V1_SAVES",
]


def _watch(reg: Any) -> Any:
    """The active simulator's watch (:class:`elastic_dew.simulate.watch.Watch`), or None."""
    simulator = reg.active
    return getattr(simulator, "watch", None) if simulator is not None else None


#: Callers whose slice-down errors are not the program learning of a fault: the libraries
#: that probe slices and replicas on its behalf, and the simulator itself.
_PROBING = ("orbax", "grain", "pathwaysutils.elastic", "pathwaysutils.experimental", "etils", "elastic_dew.simulate",
            "elastic_dew.elastic.slices", "elastic_dew._compat", "threading")


def detected(simulator: Any, how: str, frame: Any) -> None:
    """A slice-down error the simulator raises at a ``read`` or ``dispatch``, made by ``frame``."""
    watch = getattr(simulator, "watch", None)
    if watch is None:
        return
    while frame is not None and module_of(frame).startswith(("jax", "numpy", "elastic_dew.simulate")):
        frame = frame.f_back
    if frame is None or module_of(frame).startswith(_PROBING):
        return
    watch.detected(how)


def tracking_retry(reg: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Manager.elastic_retry``: the watch knows when the retried function runs and how it ended."""

    def elastic_retry(self, *args, **kwargs):
        decorator = original(self, *args, **kwargs)

        def tracking(func):
            @functools.wraps(func)
            def attempt(*a, **k):
                watch = _watch(reg)
                if watch is None:
                    return func(*a, **k)
                watch.retry_entered()
                try:
                    result = func(*a, **k)
                except BaseException as error:
                    watch.retry_left(error)
                    raise
                watch.retry_left(None)
                return result

            return decorator(attempt)

        return tracking

    elastic_retry.__doc__ = original.__doc__
    return elastic_retry


#: The Manager's attribute that holds returned slices; pathwaysutils sets it, the program reads it.
AVAILABLE = "available_inactive_slices"


def available_property(reg: Any) -> property:
    """``Manager.available_inactive_slices`` as a property over the instance's own value: the
    watch sees it become non-empty, and the program (not pathwaysutils) read it."""

    def get(self):
        value = vars(self).get(AVAILABLE, frozenset())
        watch = _watch(reg)
        if watch is not None and value and not module_of(_caller()).startswith(
                ("pathwaysutils", "elastic_dew.simulate")):
            watch.looked(frozenset(value))
        return value

    def set_(self, value):
        vars(self)[AVAILABLE] = value
        watch = _watch(reg)
        if watch is not None and value:
            watch.available(frozenset(value))

    return property(get, set_, doc="the Manager's returned slices not yet in use")


#: The Manager's attribute that holds the slices in use; pathwaysutils sets it at each
#: attempt's start, and a program that scales up in place sets it too.
ACTIVE = "active_slice_indices"


def active_property(reg: Any, original: property) -> property:
    """``Manager.active_slice_indices``, its setter telling the watch when the program (not
    pathwaysutils) changed the active slices inside an attempt."""

    def set_(self, value):
        original.__set__(self, value)
        watch = _watch(reg)
        if watch is not None and not module_of(_caller()).startswith(("pathwaysutils", "elastic_dew.simulate")):
            watch.active_set(frozenset(original.__get__(self, type(self))))

    return property(original.fget, set_, original.fdel, doc=original.__doc__)


def made(reg: Any, what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A class's ``__init__``: the watch sees one made (``Snapshotter``, ``CheckpointManager``),
    but the ``CheckpointManager`` a v1 ``Checkpointer`` makes for itself (the Checkpointer is
    the program's)."""

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        watch = _watch(reg)
        if watch is not None and not _in_v1_checkpointer(_caller()):
            watch.created(what, self)

    return __init__


def snapshot_save(reg: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Snapshotter.save``: the request before it is given :data:`LANDING_SECONDS` to be
    taken up, so a save is skipped only when the previous copy waits on work that has not
    finished, and the watch records the save (or its skip)."""

    @functools.wraps(original)
    def save(self, step, state):
        watch = _watch(reg)
        if watch is None or own_loop_on_stack(_caller()):
            return original(self, step, state)
        deadline = time.monotonic() + LANDING_SECONDS
        while orbax_private.snapshot_busy(self) and time.monotonic() < deadline:
            time.sleep(0.002)
        watch.saved("snapshot", step, state, skipped=orbax_private.snapshot_busy(self))
        return original(self, step, state)

    return save


def snapshot_load(reg: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``Snapshotter.load``: what it returns carries the loaded snapshot's position."""

    @functools.wraps(original)
    def load(self, *args, **kwargs):
        watch = _watch(reg)
        if watch is None or own_loop_on_stack(_caller()):
            return original(self, *args, **kwargs)
        abstract = args[0] if args else kwargs.get("abstract_state")
        watch.placing(placed_leaves(abstract), "Snapshotter.load (the abstract state's shardings)", _caller())
        latest = self.latest
        restored = original(self, *args, **kwargs)
        watch.restored("snapshot", latest.step if latest is not None else None, restored)
        return restored

    return load


def checkpoint_manager() -> type:
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager


def checkpoint_save(reg: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``CheckpointManager.save``: the watch records each save Orbax took (it returns True)."""

    @functools.wraps(original)
    def save(self, step, *args, **kwargs):
        saved = original(self, step, *args, **kwargs)
        watch = _watch(reg)
        caller = _caller()
        if saved and watch is not None and not _in_v1_checkpointer(caller) and not own_loop_on_stack(caller):
            watch.saved("checkpoint", step, (args, kwargs))
        return saved

    return save


def checkpoint_restore(reg: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``CheckpointManager.restore``: what it returns carries the restored step's position."""

    @functools.wraps(original)
    def restore(self, step=None, *args, **kwargs):
        watch = _watch(reg)
        if watch is None or own_loop_on_stack(_caller()):
            return original(self, step, *args, **kwargs)
        watch.placing(placed_leaves((args, kwargs)), "CheckpointManager.restore (the abstract state's shardings)",
                      _caller())
        if step is None:
            step = self.latest_step()
        restored = original(self, step, *args, **kwargs)
        watch.restored("checkpoint", step, restored)
        return restored

    return restore


def _step_in(path: Any) -> int | None:
    """The step a checkpoint's path names: its innermost part that is a number (Orbax's step
    directories, ``.../8`` or ``.../8/state``), or ``None``."""
    for part in reversed(Path(str(path)).parts):
        if part.isdigit():
            return int(part)
    return None


def _in_v1_checkpointer(frame: Any) -> bool:
    """Whether ``frame`` is code of Orbax's v1 ``training.Checkpointer``'s module (its own
    ``CheckpointManager``'s making and saves: the Checkpointer's wrappers record them)."""
    import orbax.checkpoint as ocp

    return module_of(frame) == ocp.v1.training.Checkpointer.__module__


def _by_orbax(frame: Any) -> bool:
    """Whether Orbax itself made the call (a manager's restore reading through a checkpointer)."""
    return module_of(frame).startswith("orbax")


def path_restore(reg: Any, original: Callable[..., Any], method: bool) -> Callable[..., Any]:
    """A restore from a checkpoint's path (``Checkpointer.restore(directory, ...)`` of Orbax's
    v0 checkpointers, ``ocp.v1.load``/``load_pytree(path, ...)``): what it returns carries
    the position saved at the step the path names."""

    def restore(*args, **kwargs):
        watch = _watch(reg)
        caller = _caller()
        if watch is None or _by_orbax(caller) or own_loop_on_stack(caller):
            return original(*args, **kwargs)
        path = (args[1:2] if method else args[:1]) or [kwargs.get("directory", kwargs.get("path"))]
        restored = original(*args, **kwargs)
        watch.restored("checkpoint", _step_in(path[0]), restored)
        return restored

    functools.update_wrapper(restore, original)
    return restore


def checkpointer_load(reg: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """``ocp.v1.training.Checkpointer.load``, ``load_pytree`` or ``load_checkpointables``:
    what it returns carries the restored step's position."""

    @functools.wraps(original)
    def load(self, step=None, *args, **kwargs):
        watch = _watch(reg)
        caller = _caller()
        if watch is None or _by_orbax(caller) or own_loop_on_stack(caller):
            return original(self, step, *args, **kwargs)
        restored = original(self, step, *args, **kwargs)
        number = getattr(step, "step", step)
        if number is None:
            latest = self.latest
            number = latest.step if latest is not None else None
        watch.restored("checkpoint", number, restored)
        return restored

    return load


def checkpointer_save(reg: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """A save of ``ocp.v1.training.Checkpointer`` (``save``, ``save_checkpointables``, their
    ``_async`` forms, ``save_pytree``): each save it took (requested: what landed is read
    at each resume)."""

    @functools.wraps(original)
    def save(self, step, state, *args, **kwargs):
        saved = original(self, step, state, *args, **kwargs)
        watch = _watch(reg)
        caller = _caller()
        taken = saved is not None and saved is not False  # an _async form returns a response, or None
        if taken and watch is not None and not _by_orbax(caller) and not own_loop_on_stack(caller):
            watch.saved("checkpoint", step, state)
        return saved

    return save


#: Orbax v1's loads: of a path (``ocp.v1.load(path, ...)``), and of a ``training.Checkpointer``'s step.
V1_LOADS = ("load", "load_pytree", "load_checkpointables")
#: A v1 ``training.Checkpointer``'s saves (each form calls the next; Orbax's own call is passed over).
V1_SAVES = ("save", "save_pytree", "save_async", "save_pytree_async", "save_checkpointables",
            "save_checkpointables_async")


def install_restore_paths(reg: Any, replace: Callable[[Any, str, Any], None]) -> None:
    """Wrap Orbax's other ways to save and restore a checkpoint than ``CheckpointManager``:
    v0 ``Checkpointer.restore``, v1 :data:`V1_LOADS` of a path, and v1
    ``training.Checkpointer`` (made, :data:`V1_SAVES`, :data:`V1_LOADS`), with
    ``replace(owner, name, new)``."""
    import orbax.checkpoint as ocp

    replace(ocp.Checkpointer, "restore", path_restore(reg, vars(ocp.Checkpointer)["restore"], method=True))
    for name in V1_LOADS:  # the public names: a program calls ocp.v1.load(...)
        if name in vars(ocp.v1):
            replace(ocp.v1, name, path_restore(reg, vars(ocp.v1)[name], method=False))
    checkpointer = ocp.v1.training.Checkpointer
    replace(checkpointer, "__init__", made(reg, "Checkpointer", vars(checkpointer)["__init__"]))
    for name in V1_LOADS:  # load calls load_checkpointables: Orbax's own call is passed over
        if name in vars(checkpointer):
            replace(checkpointer, name, checkpointer_load(reg, vars(checkpointer)[name]))
    for name in V1_SAVES:
        if name in vars(checkpointer):
            replace(checkpointer, name, checkpointer_save(reg, vars(checkpointer)[name]))


def elastic_iterator() -> type:
    """Grain's ``ElasticIterator`` (its public name, ``grain.experimental``)."""
    import grain.experimental

    return grain.experimental.ElasticIterator


def data_call(reg: Any, what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """An ``ElasticIterator`` method: ``__init__`` (``made``), ``set_state`` or ``__next__``
    (``next``), as the watch sees the data's position follow the state."""

    @functools.wraps(original)
    def call(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        watch = _watch(reg)
        if watch is not None and not own_loop_on_stack(_caller()):
            if what == "next":
                watch.data_taken()
            else:
                watch.data_positioned(what)
        return result

    return call
