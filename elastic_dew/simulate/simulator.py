"""Simulated TPU slices on the host's CPU devices: lose, hang, restore, preempt and kill, on CPU.

:class:`SimulatedSlices` groups the host's CPU devices into slices and makes them fail the
way Pathways slices fail, so the real pathwaysutils ``Manager``, ``elastic_retry`` and
health check, Orbax's ``Snapshotter`` and a user's own loop run unchanged:

* Devices and backend are Pathways-shaped: every simulated device carries its
  ``slice_index`` (host devices outside every slice carry ``None``), ``Manager()`` with no
  arguments sees the devices grouped into slices (``get_slice_to_devices`` is patched to
  leave the outside devices out), Orbax groups its Pathways workers one per slice, and
  ``pathwaysutils.is_pathways_backend_used()`` and Orbax's ``multihost.is_pathways_backend()``
  answer ``True``.
* The slices move through one fault state machine, shared with the local Pathways backend
  (:mod:`elastic_dew.simulate.slice_states`): :meth:`SimulatedSlices.lose` (one of the error
  codes pathwaysutils counts as slice-down; a schedule's ``lose`` faults take ``DATA_LOSS``,
  ``INTERNAL``, ``NOT_FOUND``, ``DEADLINE_EXCEEDED`` in turn), :meth:`~SimulatedSlices.hang`
  (reads of its results block until it is lost, restored or the simulator exits; only a bound
  on the read ends such a wait), :meth:`~SimulatedSlices.suspend` and
  :meth:`~SimulatedSlices.wake` (Pathways' transparent suspend; a loss and a return under a
  multi-tier replicator, whose colocated Python is stateful) and
  :meth:`~SimulatedSlices.restore` (arrays that lived on it while it was down stay
  unreadable). What a read or a dispatch meets under it is :mod:`elastic_dew.simulate.slice_faults`:
  work dispatched before a loss fails when read, a dispatch after it with an input on the lost
  slice fails at once, a copy of a lost array is lost too, and the health check's probe and
  pinned host snapshot replicas on the slice fail the same way.
* The Manager sees a returned slice at once: every change re-runs the Manager's own check of
  its inactive slices (``Manager._check_inactive_slices``), and the monitor thread's checks
  run under the simulator's lock, so a restore fired at a step's announcement is in
  ``available_inactive_slices`` at that step's boundary, whatever the step time.

Reads and dispatches are intercepted where JAX funnels them
(:mod:`elastic_dew.simulate.patches`); every patch is undone when the context exits. Which
devices form which slice is :mod:`elastic_dew.simulate.topology`; the schedule and its fault
log are :mod:`elastic_dew.simulate.schedule`.

Faults fire in any loop: at elastic_dew's phase announcements in its own loop, and at the
dispatches of the step function in a loop that announces nothing (:meth:`SimulatedSlices.step_of`
says which dispatch is a step; ``docs/simulator.md``, "Loops elastic_dew did not write").
A fault that never fired is reported when the context exits normally (a warning,
:attr:`SimulatedSlices.unfired`, a ``never_fired`` line in the fault log). While the context
is active pathwaysutils' health check is elastic_dew's (:mod:`elastic_dew.elastic.slices.health`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from elastic_dew.elastic import events, hooks
from elastic_dew.elastic.slices import health
from elastic_dew.rundir import FaultLog
from elastic_dew.simulate.marks import Marks
from elastic_dew.simulate.patches import registry
from elastic_dew.simulate.slice_faults import SliceFaults
from elastic_dew.simulate.replicator import Replicator
from elastic_dew.simulate.runner import ScheduleRunner
from elastic_dew.simulate.schedule import (
    ScheduledFault,
    Schedule,
    action_of,
    as_schedule,
    check_fault_slices,
)
from elastic_dew.simulate.slice_states import HUNG_CODE, SliceStates
from elastic_dew.simulate.step_count import StepCount
from elastic_dew.simulate.topology import Topology, check_slice_index
from elastic_dew.simulate.watch import Watch

if TYPE_CHECKING:
    from elastic_dew.simulate.diagnosis import Diagnosis

__all__ = ["SimulatedSlices", "HUNG_CODE"]

logger = logging.getLogger(__name__)


class SimulatedSlices(SliceFaults):
    """``slices`` slices of ``devices_per_slice`` host CPU devices each, as a context manager.

    The host must have ``slices * devices_per_slice`` CPU devices, set before JAX starts
    (``XLA_FLAGS=--xla_force_host_platform_device_count=N``). Slice ``k`` is devices
    ``k*D .. k*D+D-1`` of ``jax.devices()`` ordered by id. One simulator is active at a time.

    ``schedule`` (text or :class:`Schedule`) fires faults at the elastic layer's phase
    announcements, or at the step function's dispatches in a loop that announces nothing
    (``step_function`` names that function; by default :meth:`step_of` finds it); ``fault_log`` (a JSON-lines file, :class:`elastic_dew.rundir.FaultLog`)
    records each fault, flushed and fsynced, before it fires, so a process restarted with the
    same schedule and log does not fire it again. Without ``fault_log`` a restarted process
    fires every fault again.

    ``replicator`` (a directory) runs a stand-in for GKE's multi-tier checkpoint replicator
    there while the simulator is active (:class:`elastic_dew.simulate.replicator.Replicator`,
    :attr:`replicator`), so ``checkpoint_kind="multi_tier"`` runs Orbax's real multi-tier
    code with its local directory at ``replicator.local``.

    ``on_attempt(active)`` is called with the active slices of each attempt as it starts
    (each answer of pathwaysutils' wait for slices; :attr:`attempts` lists them too).

    Args:
        slices: how many simulated slices (>= 1).
        devices_per_slice: host CPU devices in each (>= 1).
        schedule: the faults to fire (text in the grammar of :func:`parse_schedule`, or a
            parsed :class:`Schedule`), or ``None`` for none.
        fault_log: the fault log's path (``faults.jsonl``), or ``None`` for none.
        step_function: the name of the loop's step function (the function given to
            ``jax.jit``), or ``None`` to find it by :meth:`step_of`'s rule.
        replicator: the directory of the multi-tier replicator stand-in, or ``None``.
        on_attempt: called with each attempt's active slices as it starts, or ``None``.
        watch_log: a JSON-lines file the watch's records of what the program does are
            appended to (:attr:`watch`; ``elastic-dew simulate`` keeps its processes' there),
            or ``None`` to keep them in memory only.

    Raises:
        ValueError: a shape below one slice or one device, a schedule that does not parse or
            names a slice these slices do not have, or a fault log that belongs to another
            schedule.
        RuntimeError: (on entering) another simulator is active, or the host has too few CPU
            devices (the error says how to set them before JAX starts).
    """

    def __init__(
        self,
        slices: int,
        devices_per_slice: int,
        *,
        schedule: str | Schedule | None = None,
        fault_log: str | os.PathLike[str] | None = None,
        step_function: str | None = None,
        replicator: str | os.PathLike[str] | None = None,
        on_attempt: Callable[[tuple[int, ...]], None] | None = None,
        watch_log: str | os.PathLike[str] | None = None,
    ) -> None:
        Topology.check_shape(slices, devices_per_slice)
        schedule = as_schedule(schedule)
        check_fault_slices(schedule, slices)
        self.slices = slices
        self.devices_per_slice = devices_per_slice
        self.schedule = schedule
        self.fault_log = Path(fault_log) if fault_log is not None else None
        self._on_attempt = on_attempt
        #: What the program does with its state, for :meth:`diagnose`
        #: (:class:`elastic_dew.simulate.watch.Watch`).
        self.watch = Watch(self, watch_log)
        self._faults: list[dict[str, Any]] = []
        #: The multi-tier replicator stand-in, when ``replicator`` names its directory.
        self.replicator = Replicator(replicator) if replicator is not None else None
        self._runner = ScheduleRunner(
            schedule, self, FaultLog(self.fault_log) if self.fault_log is not None else None,
            idle=self._idle, land=registry.land_snapshots,
        )
        self.step_function = step_function
        self._count = StepCount(step_function)
        self._installed_health = False
        #: The active slices of each attempt pathwaysutils' ``elastic_retry`` started (the
        #: answer of each of its waits for slices), in order.
        self.attempts: list[tuple[int, ...]] = []
        #: The scheduled faults that never fired, set when the context exits normally.
        self.unfired: tuple[ScheduledFault, ...] = ()
        if self.fault_log is None and any(action_of(f).ends_process for f in schedule):
            logger.warning(
                "schedule %s ends this process but has no fault_log: a restarted process fires "
                "its faults again; pass fault_log= to fire each once per run",
                schedule,
            )
        #: The slices' health (:class:`~elastic_dew.simulate.slice_states.SliceStates`, the
        #: fault state machine the proxy backend shares).
        self.states = SliceStates(slices, self._health_changed, active=False)
        #: Held while slice health changes and while the Manager checks its inactive slices.
        self.lock = self.states.lock
        self._answered = self.states.answered
        self._marks = Marks()
        self._lost_device_ids: frozenset[int] = frozenset()
        self._topology: Topology | None = None
        self._skipped_logged = False

    # ----------------------------------------------------------------- context

    def __enter__(self) -> SimulatedSlices:
        topology = Topology.from_host(self.slices, self.devices_per_slice)
        registry.install(self)
        self._topology = topology
        self.states.reset()
        self._lost_device_ids = frozenset()
        self._count.reset()
        self.attempts = []
        self.watch.reset()
        self._faults = []
        hooks.add_listener(self.watch.announced)  # before the runner's: a step is seen before its fault
        hooks.add_listener(events=self._fired)  # the faults fired, told on the loop's channel
        if not health.installed():
            health.install()
            self._installed_health = True
        self._runner.__enter__()
        if self.replicator is not None:
            self.replicator.__enter__()
        logger.info(
            "simulating %d slices of %d CPU devices; schedule %s",
            self.slices,
            self.devices_per_slice,
            self.schedule or "none",
        )
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.replicator is not None:
            self.replicator.__exit__(*exc_info)
        self._runner.__exit__(*exc_info)
        hooks.remove_listener(self.watch.announced)
        hooks.remove_listener(events=self._fired)
        if exc_info[0] is None:
            # A process that ends with an error or a preemption leaves its faults to the
            # next process of the run; one that ends normally will never fire them.
            self.unfired = self._runner.report_unfired()
        if self._installed_health:
            health.uninstall()
            self._installed_health = False
        self.states.stop()  # readers blocked on a hung slice give up
        registry.uninstall(self)
        self.states.reset(active=False)
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
        """The slices lost (or hung) now."""
        return self.states.lost

    @property
    def hung(self) -> frozenset[int]:
        """The slices that stopped answering now."""
        return self.states.hung

    @property
    def fired(self) -> frozenset[ScheduledFault]:
        """Scheduled faults fired so far in this run (this process or an earlier one)."""
        return self._runner.fired

    def _fired(self, event: Any) -> None:
        """An event told on the loop's channel: a fault of the schedule fires (its ``fault`` event)."""
        if isinstance(event, events.Fault):
            from elastic_dew.simulate.diagnosis import fault_record

            self._faults.append(fault_record(event))

    def diagnose(self, allow: tuple[str, ...] = ()) -> Diagnosis:
        """What each fault fired in this process cost the program, and the problems it made
        (:func:`elastic_dew.simulate.diagnosis.diagnose` of :attr:`watch`'s records).

        Args:
            allow: problem kinds to accept (reported as allowed).

        Returns:
            The :class:`~elastic_dew.simulate.diagnosis.Diagnosis`.

        Raises:
            ValueError: ``allow`` names a kind that does not exist.
        """
        from elastic_dew.simulate.diagnosis import diagnose

        return diagnose(self._faults, self.watch.records(), allow)

    def await_monitor(self, manager: Any, timeout: float = 5.0) -> None:
        """Wait, up to ``timeout`` seconds, until ``manager``'s monitor thread (pathwaysutils'
        ``Manager.start_monitoring``) has seen every slice that came back: the monitor polls on
        its own thread, so without this wait the step at which a replica-resize run adds a
        returned slice back depends on timing. A slice lost again meanwhile is not waited for.

        Args:
            manager: a pathwaysutils ``Manager`` whose monitor thread runs.
            timeout: the longest wait, in seconds; it ends without error when it passes.
        """
        returned = set(range(self.slices)) - set(self.lost) - set(manager.active_slice_indices)
        deadline = time.monotonic() + timeout
        while returned and not manager.available_inactive_slices and time.monotonic() < deadline:
            time.sleep(0.01)
            returned -= set(self.lost)

    @property
    def steps(self) -> int:
        """How many dispatches of the loop's step function were counted (see :meth:`step_of`)."""
        return self._count.steps

    def step_of(self, arrays: list[Any], name: str | None, caller: Any, out_bytes: int = 0) -> int | None:
        """Whether this dispatch is a step of the loop, and its number, or ``None``
        (:meth:`elastic_dew.simulate.step_count.StepCount.step_of`'s rule).

        Args:
            arrays: the dispatch's input arrays.
            name: the program's name, or ``None`` when it has none.
            caller: the frame that dispatched it.
            out_bytes: the bytes its results hold.

        Returns:
            The step's number, or ``None`` when the dispatch is not a step.
        """
        return self._count.step_of(arrays, name, caller, out_bytes)

    def on_dispatch(self, phase: str, step: int) -> None:
        """Fire what is due at ``phase`` (``dispatch`` or ``step``) of counted step ``step``.

        Args:
            phase: ``dispatch`` or ``step``.
            step: the counted step.
        """
        self._runner.on_dispatch(phase, step)

    def waiting_for_slices(self, delta: int) -> None:
        """pathwaysutils' wait for slices began (``+1``) or ended (``-1``).

        Args:
            delta: ``+1`` as a wait begins, ``-1`` as it ends.
        """
        self.states.waiting_for_slices(delta)

    def attempted(self, active: Any) -> None:
        """pathwaysutils' wait for slices returned ``active``: an ``elastic_retry`` attempt starts.

        Args:
            active: the active slices the wait returned.
        """
        attempt = tuple(sorted(active))
        self.attempts.append(attempt)
        self.watch.attempt_started(attempt)
        if self._on_attempt is not None:
            self._on_attempt(attempt)

    def _idle(self) -> bool:
        """Whether the loop can reach no step boundary now: a read waits on a hung slice, or
        pathwaysutils waits for slices."""
        return self.states.idle()

    def slice_of(self, device: jax.Device) -> int | None:
        """The simulated slice a device belongs to, or None for a device outside every slice.

        Args:
            device: a ``jax.Device``.

        Returns:
            Its slice's index, or ``None``.
        """
        return self._topology.slice_of(device) if self._topology is not None else None

    def _check_index(self, index: int) -> None:
        check_slice_index(index, self.slices)

    def _health_changed(self) -> None:
        self._lost_device_ids = self.topology.device_ids(set(self.states.codes))

    def group(self, devices: Any) -> dict[int, list[jax.Device]]:
        """``get_slice_to_devices``: ``devices`` grouped by simulated slice.

        Args:
            devices: the devices to group.

        Returns:
            Each slice index and its devices (devices outside every slice left out).
        """
        grouped, outside = self.topology.group(devices)
        if outside and not self._skipped_logged:
            self._skipped_logged = True
            logger.info("%d devices are outside the simulated slices and are left out", outside)
        return grouped
