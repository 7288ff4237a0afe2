"""The simulator's patches of pathwaysutils and Orbax: Pathways as a simulator stands in for it.

While a simulator is active: the Pathways backend tests answer ``True``
(:func:`pathways_backend`); pathwaysutils' mesh-axis operations that donate their inputs
(``pathwaysutils.jax``'s ``concatenate_by_mesh_axis`` and ``split_by_mesh_axis``, which
Orbax's Snapshotter calls) leave a donated input deleted, as on Pathways, instead of broken,
copy nothing, and give their results a hung input's wait (:func:`donating_views`), and the
simulator's walks of every live array never meet such an operation midway (:func:`live_arrays`);
pathwaysutils' wait for slices is counted
(:func:`counting_waits`) and its pauses end when slice health changes (:class:`SimulatedSleep`);
every ``Manager`` is remembered (:func:`remembering`) and its check of its inactive slices
runs under the simulator's lock (:func:`under_lock`). Each wrapper is installed, and undone,
by :class:`elastic_dew.simulate.patches.Registry`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import jax

__all__ = [
    "DONATED", "Waits", "SimulatedSleep", "counting_waits", "deleted_error", "deleted_if_donated",
    "donated", "donating_views", "live_arrays", "pathways_backend", "remembering", "under_lock",
]

#: Held while a donating operation's views exist (:func:`donating_views`): from their making
#: until they are freed. :func:`live_arrays` takes it.
_VIEWS_EXIST = threading.RLock()


class Waits(Protocol):
    """What these wrappers ask of the registry: its active simulator, and to remember a Manager."""

    @property
    def active(self) -> Any: ...

    def remember(self, manager: Any) -> None: ...


def pathways_backend() -> bool:
    """The Pathways backend tests' answer while a simulator stands in for Pathways."""
    return True


#: The attribute that marks an input a donating mesh-axis operation took (see
#: :func:`donating_views`): it reads as deleted, as a donated array does on Pathways.
DONATED = "_elastic_dew_donated"


def deleted_error(array: Any) -> RuntimeError:
    """JAX's own error for reading a deleted array."""
    return RuntimeError(f"Array has been deleted with shape={array.aval.str_short()}.")


def live_arrays() -> list[Any]:
    """``jax.live_arrays()``, never while a donating operation's views exist.

    The operation takes the views' buffers with the GIL released, and asking a view it broke
    anything (``jax.live_arrays()`` asks every live array) kills the process with SIGSEGV: a
    walk on another thread (the fault clock's ``lose`` or ``restore`` marking a slice's
    arrays) waits here until the operation has ended and its views are freed. The arrays
    returned are never views (they exist only while the lock is held elsewhere).

    Returns:
        Every live array, as ``jax.live_arrays()`` lists them.
    """
    with _VIEWS_EXIST:
        return jax.live_arrays()


def donated(array: Any) -> bool:
    return getattr(array, DONATED, False) is True


def _view(array: Any) -> Any:
    """A new ``jax.Array`` over ``array``'s own device buffers (no bytes copied)."""
    return jax.make_array_from_single_device_arrays(
        array.shape, array.sharding, [shard.data for shard in array.addressable_shards]
    )


def donating_views(reg: Waits, original: Callable[..., Any]) -> Callable[..., Any]:
    """A pathwaysutils mesh-axis operation whose donated inputs end deleted, as on Pathways,
    without copying a byte, and whose results wait on what its inputs wait on.

    Its results are pieces of its inputs: while an input waits on a hung (or suspended)
    slice's computation, so do they (the active simulator's ``derive``), as a snapshot's
    replicas split from a step result still in flight wait for that step on Pathways.

    On the CPU client jaxlib's ``_pathways`` operations take a donated input's buffers and
    leave the array neither deleted nor whole: asking it anything (``is_deleted()``, and
    ``jax.live_arrays()``, which asks every live array) dereferences a null buffer and
    kills the process with SIGSEGV. With ``donate=True`` this hands the operation views of
    the inputs (new arrays over the same buffers, freed at once: the broken ones; the
    operation breaks them midway, with the GIL released, so they are made and freed under
    the lock :func:`live_arrays` takes, and no walk on another thread meets one), so the
    outputs own the inputs' buffers as on Pathways, and marks the inputs themselves
    donated: they stay whole underneath (``jax.live_arrays()`` may ask them anything) but
    read as deleted (``is_deleted()``; a read, a dispatch or a ``device_put`` of one raises
    JAX's "Array has been deleted"), what a donated array is on Pathways. A copy of every
    input instead would move the whole snapshot twice per load on CPU.
    """

    def donating(*args, **kwargs):
        arrays = kwargs.get("arrays")  # pathwaysutils passes it, and donate, by name
        if not kwargs.get("donate") or arrays is None:
            result = original(*args, **kwargs)
        else:
            with _VIEWS_EXIST:
                kwargs["arrays"] = jax.tree_util.tree_map(_view, arrays)
                try:
                    result = original(*args, **kwargs)
                finally:
                    del kwargs["arrays"]  # the views, left broken by the donation: freeing them is safe
            for array in jax.tree_util.tree_leaves(arrays):
                setattr(array, DONATED, True)
        simulator = reg.active
        if simulator is not None and arrays is not None:
            simulator.derive(jax.tree_util.tree_leaves(arrays), jax.tree_util.tree_leaves(result))
        return result

    donating.__name__ = getattr(original, "__name__", "donating")
    donating.__doc__ = getattr(original, "__doc__", None)
    return donating


def deleted_if_donated(original: Callable[..., Any]) -> Callable[..., Any]:
    """``jax.Array.is_deleted``: an input a donating operation took is deleted."""

    def is_deleted(self):
        return donated(self) or original(self)

    is_deleted.__doc__ = getattr(original, "__doc__", None)
    return is_deleted


def counting_waits(reg: Waits, original: Callable[..., Any]) -> Callable[..., Any]:
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


class SimulatedSleep:
    """``pathwaysutils.elastic.elastic``'s ``time`` module, whose ``sleep`` (the pause of
    ``wait_for_slices`` between its checks of the slices) ends early when a slice's health
    changes in the active simulator, so a wait learns of a returned slice as soon as the
    schedule returns it, whatever ``poll_interval`` it was given. Everything else is the
    real ``time``."""

    def __init__(self, reg: Waits, real: Any) -> None:
        self._reg, self._real = reg, real

    def sleep(self, seconds: float) -> None:
        simulator = self._reg.active
        if simulator is None:
            self._real.sleep(seconds)
        else:
            simulator.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def remembering(reg: Waits, original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        reg.remember(self)

    return __init__


def under_lock(reg: Waits, original: Callable[..., Any]) -> Callable[..., Any]:
    def _check_inactive_slices(self):
        simulator = reg.active
        if simulator is None:
            return original(self)
        with simulator.lock:
            return original(self)

    return _check_inactive_slices
