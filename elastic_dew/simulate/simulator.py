"""Simulated TPU slices on the host's CPU devices: lose, restore, preempt and kill, on CPU.

:class:`SimulatedSlices` groups the host's CPU devices into slices and makes them fail the
way Pathways slices fail, so the real pathwaysutils ``Manager``, ``elastic_retry`` and
health check, Orbax's ``Snapshotter`` and a user's own loop run unchanged:

* ``Manager()`` with no arguments sees the devices grouped into slices. CPU devices have no
  ``slice_index``; the one seam that reads it,
  ``pathwaysutils.elastic.elastic.get_slice_to_devices``, is patched, nothing else of
  pathwaysutils.
* :meth:`SimulatedSlices.lose` makes a slice fail as on Pathways: dispatching work still
  succeeds, and the error surfaces when a result is read or awaited. Reading an array with a
  shard on a lost slice (or computed there) raises ``jax.errors.JaxRuntimeError`` with a
  ``DATA_LOSS`` message, which pathwaysutils classifies as a slice down. The health check's
  read of its probe on that slice fails the same way, so it reports the slice down; pinned
  host snapshot replicas on the slice become unreadable while the survivors stay readable.
* :meth:`SimulatedSlices.restore` makes the slice healthy again: new arrays on it are
  readable and the Manager's monitor thread reports it in ``available_inactive_slices``.
  Arrays that lived on it while it was lost stay unreadable: their data is gone.

Reads are intercepted where JAX funnels them (:mod:`elastic_dew.simulate.patches`); every
patch is undone when the context exits. Which devices form which slice is
:mod:`elastic_dew.simulate.topology`; the schedule and its fault log are
:mod:`elastic_dew.simulate.schedule`.

Arrays are never tracked by ``id()`` (Python reuses ids; pathwaysutils' own test mock does,
and misreports healthy slices and fresh arrays). An array fails while any of its devices is
on a lost slice; at ``lose`` and at ``restore`` every live array on the slice is marked, on
the array object itself, as having lost its data. Arrays created after ``restore`` carry no
mark and are readable.

A schedule (``lose:1@20,restore:1@40,preempt@60,kill@80``) fires faults at the phases the
elastic layer announces through :mod:`elastic_dew.elastic.hooks`; each fault fires once, is
recorded durably in ``fault_log`` before it fires, and is not fired again by a process
restarted with the same schedule and log.

Limits: CPU computations really run, so a device-to-device copy made while a slice is lost
(``jax.device_put`` from an array on it) succeeds here, where Pathways would fail it; NumPy
functions that convert a single-device array internally in C (``np.add(x, 1)``) bypass the
read check. Read through ``np.asarray``, ``jax.device_get``, a method, or block first.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import jax

from elastic_dew.rundir import FaultLog
from elastic_dew.simulate.patches import registry
from elastic_dew.simulate.schedule import Fault, Schedule, ScheduleRunner, action_of, as_schedule
from elastic_dew.simulate.topology import Topology

__all__ = ["SimulatedSlices"]

logger = logging.getLogger(__name__)

_MARK = "_elastic_dew_simulated_loss"


class SimulatedSlices:
    """``num_slices`` slices of ``devices_per_slice`` host CPU devices each, as a context manager.

    The host must have ``num_slices * devices_per_slice`` CPU devices, set before JAX starts
    (``XLA_FLAGS=--xla_force_host_platform_device_count=N``). Slice ``k`` is devices
    ``k*D .. k*D+D-1`` of ``jax.devices()`` ordered by id. One simulator is active at a time.

    ``schedule`` (text or :class:`Schedule`) fires faults at the elastic layer's phase
    announcements; ``fault_log`` (a JSON-lines file, :class:`elastic_dew.rundir.FaultLog`)
    records each fault, flushed and fsynced, before it fires, so a process restarted with the
    same schedule and log does not fire it again. Without ``fault_log`` a restarted process
    fires every fault again.
    """

    def __init__(
        self,
        num_slices: int,
        devices_per_slice: int,
        *,
        schedule: str | Schedule | None = None,
        fault_log: str | os.PathLike[str] | None = None,
    ) -> None:
        Topology.check_shape(num_slices, devices_per_slice)
        schedule = as_schedule(schedule)
        for fault in schedule:
            if fault.slice is not None and fault.slice >= num_slices:
                raise ValueError(
                    f"fault {fault} names slice {fault.slice}, but there are {num_slices} slices "
                    f"(0..{num_slices - 1}); fix the schedule or use more slices"
                )
        self.num_slices = num_slices
        self.devices_per_slice = devices_per_slice
        self.schedule = schedule
        self.fault_log = Path(fault_log) if fault_log is not None else None
        self._runner = ScheduleRunner(
            schedule, self, FaultLog(self.fault_log) if self.fault_log is not None else None
        )
        if self.fault_log is None and any(action_of(f).ends_process for f in schedule):
            logger.warning(
                "schedule %s ends this process but has no fault_log: a restarted process fires "
                "its faults again; pass fault_log= to fire each once per run",
                schedule,
            )
        self._lock = threading.RLock()
        self._token = object()
        self._lost: frozenset[int] = frozenset()
        self._lost_device_ids: frozenset[int] = frozenset()
        self._topology: Topology | None = None
        self._skipped_logged = False

    # ----------------------------------------------------------------- context

    def __enter__(self) -> SimulatedSlices:
        topology = Topology.from_host(self.num_slices, self.devices_per_slice)
        registry.install(self)
        self._topology = topology
        self._lost = frozenset()
        self._lost_device_ids = frozenset()
        self._runner.__enter__()
        logger.info(
            "simulating %d slices of %d CPU devices; schedule %s",
            self.num_slices,
            self.devices_per_slice,
            self.schedule or "none",
        )
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._runner.__exit__(*exc_info)
        registry.uninstall(self)
        self._lost = frozenset()
        self._lost_device_ids = frozenset()

    # ----------------------------------------------------------------- slices

    @property
    def topology(self) -> Topology:
        """Which devices form which slice (set on entering the context)."""
        if self._topology is None:
            raise RuntimeError("SimulatedSlices has no devices until it is entered (use it in a with block)")
        return self._topology

    @property
    def devices(self) -> list[jax.Device]:
        """Every simulated device, in slice order (empty before the context is entered)."""
        return self._topology.devices if self._topology is not None else []

    @property
    def slice_to_devices(self) -> dict[int, list[jax.Device]]:
        """Slice index -> its devices (empty before the context is entered)."""
        return self._topology.slice_to_devices if self._topology is not None else {}

    @property
    def lost(self) -> frozenset[int]:
        """The slices lost now."""
        return self._lost

    @property
    def fired(self) -> frozenset[Fault]:
        """Scheduled faults fired so far in this run (this process or an earlier one)."""
        return self._runner.fired

    def slice_of(self, device: jax.Device) -> int | None:
        """The simulated slice a device belongs to, or None for a device outside every slice."""
        return self._topology.slice_of(device) if self._topology is not None else None

    def _check_index(self, index: int) -> None:
        if not isinstance(index, int) or not 0 <= index < self.num_slices:
            raise ValueError(f"slice {index!r} does not exist; slices are 0..{self.num_slices - 1}")

    def _set_lost(self, lost: frozenset[int]) -> None:
        self._lost = lost
        self._lost_device_ids = self.topology.device_ids(lost)

    def lose(self, i: int) -> None:
        """Lose slice ``i``: reads of its arrays fail with DATA_LOSS; dispatch still succeeds."""
        self._check_index(i)
        with self._lock:
            if i in self._lost:
                logger.info("slice %d is already lost", i)
                return
            self._set_lost(self._lost | {i})
            marked = self._mark_live_arrays(i)
        logger.warning("simulated loss of slice %d (%d live arrays lose their data)", i, marked)

    def restore(self, i: int) -> None:
        """Slice ``i`` is healthy again; arrays that lived on it while lost stay unreadable."""
        self._check_index(i)
        with self._lock:
            if i not in self._lost:
                logger.info("slice %d is not lost; nothing to restore", i)
                return
            # Mark first, then heal: an array made after the slice is healthy is never marked.
            marked = self._mark_live_arrays(i)
            self._set_lost(self._lost - {i})
        logger.warning("simulated slice %d healthy again (%d arrays stay lost)", i, marked)

    # ----------------------------------------------------------------- what the patches ask

    def _mark(self, array: Any) -> None:
        try:
            setattr(array, _MARK, self._token)
        except AttributeError:  # an array type without a __dict__: the device rule still holds
            logger.debug("cannot mark %s as lost", type(array).__name__)

    def _mark_live_arrays(self, i: int) -> int:
        slice_ids = self.topology.device_ids({i})
        marked = 0
        for array in jax.live_arrays():
            if any(device.id in slice_ids for device in array.sharding.device_set):
                self._mark(array)
                marked += 1
        return marked

    def inherit_mark(self, parent: Any, child: Any) -> None:
        """A shard (``child``) of an array whose data is lost is lost too."""
        if getattr(parent, _MARK, None) is self._token:
            self._mark(child)

    def check_readable(self, array: Any) -> None:
        """Raise the DATA_LOSS error Pathways raises when ``array``'s data is on a lost slice."""
        if getattr(array, _MARK, None) is self._token:
            raise jax.errors.JaxRuntimeError(
                "DATA_LOSS: simulated slice failure: this array's data was on a slice that was "
                "lost (elastic_dew.simulate)"
            )
        lost_ids = self._lost_device_ids
        if lost_ids:
            device_slice = self.topology.device_slice
            touched = {device_slice[device.id] for device in array.sharding.device_set if device.id in lost_ids}
            if touched:
                raise jax.errors.JaxRuntimeError(
                    f"DATA_LOSS: simulated slice failure: slice {', '.join(map(str, sorted(touched)))} "
                    "holding this array is lost (elastic_dew.simulate)"
                )

    def group(self, devices: Any) -> dict[int, list[jax.Device]]:
        """``get_slice_to_devices``: ``devices`` grouped by simulated slice."""
        grouped, outside = self.topology.group(devices)
        if outside and not self._skipped_logged:
            self._skipped_logged = True
            logger.info("%d devices are outside the simulated slices and are left out", outside)
        return grouped
