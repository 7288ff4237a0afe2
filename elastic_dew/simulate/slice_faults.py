"""The in-process simulator's slices under faults, and what a read or a dispatch of an array meets.

:class:`SliceFaults` moves the simulator's slices through the fault state machine both
boundaries share (:mod:`elastic_dew.simulate.slice_states`), marking the arrays a transition
meets, and answers the JAX patches (:mod:`elastic_dew.simulate.patches`) for
:class:`~elastic_dew.simulate.simulator.SimulatedSlices`: a read of an array whose data was
lost raises the slice-down error Pathways raises, a read of a hung slice's result waits
(:meth:`elastic_dew.simulate.slice_states.SliceStates.await_answer`) until the slice is lost,
restored or woken, and a dispatch with an input on a lost slice fails at once. Which arrays
are lost or hung is marked on the arrays themselves (:mod:`elastic_dew.simulate.marks`).

Arrays are never tracked by ``id()`` (Python reuses ids; pathwaysutils' own test mock does,
and misreports healthy slices and fresh arrays). An array fails while any of its devices is
on a lost slice; at ``lose``, ``hang`` and ``restore`` every live array on the slice is
marked, on the array object itself. Arrays created after ``restore`` carry no mark.

Limits (see ``docs/simulator.md``'s fidelity table): CPU computations really run; primitives
applied one by one outside ``jit`` keep JAX's C++ fast path, so their errors surface at the
read rather than the dispatch; NumPy functions that convert a single-device array
internally in C (``np.add(x, 1)``) bypass the read check.
"""

from __future__ import annotations

import logging
from typing import Any

import jax

from elastic_dew.simulate.marks import HUNG, LOST, Marks
from elastic_dew.simulate.patches import registry
from elastic_dew.simulate.schedule import SLICE_DOWN_CODES
from elastic_dew.simulate.slice_states import HUNG_CODE, SliceStates
from elastic_dew.simulate.topology import Topology

__all__ = ["SliceFaults"]

logger = logging.getLogger(__name__)


def _error(code: str, what: str) -> jax.errors.JaxRuntimeError:
    return jax.errors.JaxRuntimeError(f"{code}: simulated slice failure: {what} (elastic_dew.simulate)")


class SliceFaults:
    """The slices of a simulator under faults: each transition of :attr:`states` (its slices'
    health, the state machine both boundaries share) with its arrays marked as it happens,
    and what a read or a dispatch meets under it."""

    states: SliceStates
    replicator: Any
    _marks: Marks
    _lost_device_ids: frozenset[int]
    _answered: Any

    @property
    def topology(self) -> Topology:
        raise NotImplementedError

    def _check_index(self, index: int) -> None:
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``, or until a slice's health changes (a fault fired).

        A wait for slices inside the simulator sleeps here between its checks (pathwaysutils'
        ``wait_for_slices``, whatever ``poll_interval`` it was given): a returned slice is
        seen at once, as the schedule fires it, and the order of events stays the schedule's.

        Args:
            seconds: the longest sleep.
        """
        self.states.sleep(seconds)

    def lose(self, i: int, code: str = SLICE_DOWN_CODES[0]) -> None:
        """Lose slice ``i``: reads of its arrays, and dispatches onto it, fail with ``code``.

        ``code`` must be one pathwaysutils counts as slice-down (:data:`SLICE_DOWN_CODES`).

        Args:
            i: the slice's index.
            code: the error code reads and dispatches fail with.

        Raises:
            ValueError: ``i`` is not a slice, or ``code`` is not a slice-down code.
        """
        self._check_index(i)
        with self._answered:
            if not self.states.lose(i, code):
                logger.info("slice %d is already lost", i)
                return
            marked = self._marks.lose_live(self.topology.device_ids({i}), code)
        logger.warning("simulated loss of slice %d with %s (%d live arrays lose their data)", i, code, marked)
        registry.refresh_managers()

    def hang(self, i: int) -> None:
        """Slice ``i`` stops answering: reads of its results, old and new, block.

        Args:
            i: the slice's index.
        """
        self._check_index(i)
        with self._answered:
            if not self.states.hang(i):
                logger.info("slice %d is already lost or hung", i)
                return
            marked = self._marks.hang_live(self.topology.device_ids({i}), i)
        logger.warning("simulated hang of slice %d (%d results stop answering)", i, marked)
        registry.refresh_managers()

    def suspend(self, i: int) -> None:
        """Pathways' transparent suspend of slice ``i``: its work stalls (reads of its results,
        old and new, block, as after :meth:`hang`) until :meth:`wake`, which lets every
        pending result complete with no error, as Pathways does when it saves a preempted
        worker's state and resumes it on the rescheduled worker.

        With a multi-tier replicator (``replicator=``: colocated Python is stateful, so
        Pathways cannot suspend the worker transparently) a suspend is a slice loss
        (:meth:`lose`) and its wake a return (:meth:`restore`).

        Args:
          i: the slice, ``0 .. slices - 1``.

        Raises:
          ValueError: ``i`` is not a slice.
        """
        self._check_index(i)
        if self.replicator is not None:
            logger.warning("slice %d suspended under multi-tier checkpointing: no transparent suspend, "
                           "a slice loss", i)
            self.lose(i, SLICE_DOWN_CODES[0])
            return
        with self._answered:
            if not self.states.suspend(i):
                logger.info("slice %d is already lost or hung", i)
                return
            marked = self._marks.hang_live(self.topology.device_ids({i}), i)
        logger.warning("simulated suspension of slice %d (%d results stall)", i, marked)
        registry.refresh_managers()

    def wake(self, i: int) -> None:
        """Slice ``i``'s suspension ends: its pending results arrive with no error.

        A slice that was not suspended (it was lost meanwhile, or lost under multi-tier
        checkpointing) comes back as after :meth:`restore`.

        Args:
          i: the slice, ``0 .. slices - 1``.

        Raises:
          ValueError: ``i`` is not a slice.
        """
        self._check_index(i)
        with self._answered:
            if self.states.is_suspended(i):
                cleared = self._marks.clear_hung(i)
                self.states.wake(i)
            else:
                cleared = None
        if cleared is None:
            self.restore(i)
            return
        logger.warning("simulated slice %d woke from its suspension (%d pending results complete)", i, cleared)
        registry.refresh_managers()

    def restore(self, i: int) -> None:
        """Slice ``i`` is healthy again; arrays that lived on it while lost stay unreadable.

        Args:
            i: the slice's index.
        """
        self._check_index(i)
        with self._answered:
            if i not in self.states.codes:
                logger.info("slice %d is not lost; nothing to restore", i)
                return
            # Mark first, then heal: an array made after the slice is healthy is never marked.
            marked = self._marks.lose_live(self.topology.device_ids({i}), SLICE_DOWN_CODES[0])
            self.states.restore(i)
        logger.warning("simulated slice %d healthy again (%d arrays stay lost)", i, marked)
        registry.refresh_managers()

    def inherit_mark(self, parent: Any, child: Any) -> None:
        """A shard or a copy (``child``) of an array whose data is lost or hung is too.

        Args:
            parent: the original array.
            child: its shard or copy.
        """
        self._marks.inherit(parent, child)

    def _touched(self, array: Any) -> dict[int, str]:
        lost_ids = self._lost_device_ids
        if not lost_ids:
            return {}
        device_slice = self.topology.device_slice
        return {
            device_slice[d.id]: self.states.codes[device_slice[d.id]]
            for d in array.sharding.device_set
            if d.id in lost_ids
        }

    def _hung_slice_of(self, array: Any) -> int | None:
        """A hung slice holding part of ``array`` in device memory, or None."""
        hung = self.states.hung
        if not hung or array.sharding.memory_kind == "pinned_host":
            return None  # host memory has no computation in flight: it fails at once
        device_slice = self.topology.device_slice
        return next((device_slice[d.id] for d in array.sharding.device_set
                     if device_slice.get(d.id) in hung), None)

    def check_readable(self, array: Any) -> None:
        """Block while ``array`` is a hung slice's result or lives on a hung slice; raise the
        slice-down error Pathways raises when its data is lost or it is on a lost slice.

        Args:
            array: the array being read.

        Raises:
            jax.errors.JaxRuntimeError: the slice-down error Pathways raises (its code first).
        """
        hung = self._marks.of(array, HUNG)
        if hung is None:
            hung = self._hung_slice_of(array)
        if hung is not None:
            released, woke, ended = self.states.await_answer(hung)
            if released and woke and self._marks.of(array, HUNG) is None:
                hung = None  # the slice woke from a suspension: the result arrived
        code = self._marks.of(array, LOST)
        if code is not None:
            raise _error(code, "this array's data was on a slice that was lost")
        if hung is not None:
            # The hung slice was lost (with the loss's code) or restored (its results never
            # came), or the simulator exited while this read waited.
            raise _error(ended if released else HUNG_CODE,
                         f"the result waited on slice {hung}, which stopped answering")
        touched = self._touched(array)
        if touched:
            slices = ", ".join(map(str, sorted(touched)))
            raise _error(touched[min(touched)], f"slice {slices} holding this array is lost")

    def answering(self, array: Any) -> bool:
        """Whether ``array``'s result can arrive: not while it waits on a hung slice.

        ``jax.Array.is_ready()`` says ``False`` for such an array, as on Pathways, where a
        result a stopped worker owes never becomes ready.

        Args:
            array: a ``jax.Array``.

        Returns:
            Whether it can become ready.
        """
        hung = self._marks.of(array, HUNG)
        if hung is None:
            hung = self._hung_slice_of(array)
        return hung is None or hung not in self.states.hung

    def check_dispatch(self, arrays: list[Any]) -> None:
        """Raise at dispatch when an input's data is lost or it is on a lost (not hung) slice.

        A hung slice accepts work (its results then block when read), as Pathways queues it.

        Args:
            arrays: the dispatch's input arrays.

        Raises:
            jax.errors.JaxRuntimeError: the slice-down error Pathways raises (its code first).
        """
        for array in arrays:
            code = self._marks.of(array, LOST)
            if code is not None:
                raise _error(code, "a program was dispatched with an input whose data was on a lost slice")
            touched = {s: c for s, c in self._touched(array).items() if s not in self.states.hung}
            if touched:
                slices = ", ".join(map(str, sorted(touched)))
                raise _error(touched[min(touched)], f"a program was dispatched onto lost slice {slices}")

    def derive(self, inputs: list[Any], outputs: list[Any]) -> None:
        """Results computed from a hung slice's results are hung too (they wait on them).

        Args:
            inputs: a dispatch's input arrays.
            outputs: its results.
        """
        self._marks.derive(inputs, outputs)
