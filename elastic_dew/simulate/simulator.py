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

Reads are intercepted where JAX funnels them (``jax/_src/array.py``, ``jax/_src/api.py``):
``ArrayImpl._value`` (``float``, ``int``, ``bool``, ``tolist``, ``repr``, ...),
``block_until_ready`` (the method and ``jax.block_until_ready``'s batched path),
``__array__`` (``jax.device_get``), ``__getitem__``, ``__iter__``, ``item`` and
``__dlpack__``; and ``numpy.asarray``/``array``/``asanyarray``/``ascontiguousarray``, because
NumPy reads a single-device CPU array through the buffer protocol without calling any
Python method. Every patch is undone when the context exits.

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

import dataclasses
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax._src import array as _jax_array
from jax._src.lib import xla_client as _xla_client
from pathwaysutils.elastic import elastic as _pw_elastic

from elastic_dew.elastic import hooks

__all__ = [
    "ACTIONS",
    "PHASES",
    "Fault",
    "Schedule",
    "SimulatedSlices",
    "parse_schedule",
]

logger = logging.getLogger(__name__)

#: What a fault does: ``lose``/``restore`` a slice, ``preempt`` (SIGTERM to this process),
#: ``kill`` (SIGKILL to this process).
ACTIONS: tuple[str, ...] = ("lose", "restore", "preempt", "kill")
_SLICE_ACTIONS = ("lose", "restore")
#: When a fault fires: the phases the elastic layer announces (:data:`hooks.PHASES`).
PHASES: tuple[str, ...] = hooks.PHASES

_ArrayImpl = _jax_array.ArrayImpl
_MARK = "_elastic_dew_simulated_loss"


# --------------------------------------------------------------------------- schedule


@dataclasses.dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``action`` (on ``slice``) at the first ``phase`` of step >= ``step``."""

    action: str
    slice: int | None
    step: int
    phase: str = "step"

    def __str__(self) -> str:
        where = f":{self.slice}" if self.slice is not None else ""
        return f"{self.action}{where}@{self.step}/{self.phase}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Faults in the order they were written (faults due together fire in this order)."""

    faults: tuple[Fault, ...] = ()

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)

    def __len__(self) -> int:
        return len(self.faults)

    def __str__(self) -> str:
        return ",".join(str(fault) for fault in self.faults)


_TOKEN = re.compile(r"^(?P<action>[^:@/]*)(?::(?P<slice>[^@/]*))?@(?P<step>[^/]*)(?:/(?P<phase>.*))?$")
_GRAMMAR = "ACTION[:SLICE]@STEP[/PHASE], comma-separated"


def _whole(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def parse_schedule(text: str) -> Schedule:
    """Parse ``ACTION[:SLICE]@STEP[/PHASE]`` tokens, comma-separated; empty text is no faults.

    A syntax error is a ``ValueError`` naming the bad token, what is wrong with it and the
    accepted values.
    """
    if not text or not text.strip():
        return Schedule()
    faults = []
    for raw in text.split(","):
        token = raw.strip()

        def bad(problem: str, token: str = token) -> ValueError:
            return ValueError(
                f"bad fault {token!r} in schedule {text!r}: {problem} (grammar: {_GRAMMAR})"
            )

        if not token:
            raise bad("empty token (a stray comma?)")
        match = _TOKEN.match(token)
        if match is None:
            raise bad("expected ACTION[:SLICE]@STEP[/PHASE], e.g. lose:1@20 or preempt@60/checkpoint")
        action, slice_text, step_text, phase = match.group("action", "slice", "step", "phase")
        if action not in ACTIONS:
            raise bad(f"unknown action {action!r}; actions are {', '.join(ACTIONS)}")
        if action in _SLICE_ACTIONS:
            if slice_text is None:
                raise bad(f"{action} needs a slice, e.g. {action}:1@{step_text}")
            slice_index = _whole(slice_text)
            if slice_index is None:
                raise bad(f"slice {slice_text!r} is not a whole number >= 0")
        else:
            if slice_text is not None:
                raise bad(f"{action} acts on the whole process and takes no slice; write {action}@{step_text}")
            slice_index = None
        step = _whole(step_text)
        if step is None:
            raise bad(f"step {step_text!r} is not a whole number >= 0")
        if phase is None:
            phase = "step"
        elif phase not in PHASES:
            raise bad(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        faults.append(Fault(action, slice_index, step, phase))
    return Schedule(tuple(faults))


# --------------------------------------------------------------------------- patches

_active: SimulatedSlices | None = None
_active_lock = threading.Lock()


def _check_readable(array: Any) -> None:
    simulator = _active
    if simulator is not None and type(array) is _ArrayImpl:
        simulator._check_readable(array)


def _guard_method(original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(self, *args, **kwargs):
        _check_readable(self)
        return original(self, *args, **kwargs)

    guarded.__name__ = getattr(original, "__name__", "guarded")
    guarded.__doc__ = getattr(original, "__doc__", None)
    return guarded


def _guard_property(original: property) -> property:
    def getter(self):
        _check_readable(self)
        return original.__get__(self, type(self))

    return property(getter, doc=original.__doc__)


def _inherit_mark(parent: Any, child: Any) -> None:
    simulator = _active
    if simulator is not None and getattr(parent, _MARK, None) is simulator._token:
        simulator._mark(child)


def _marking_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """``addressable_data``: a shard of an array whose data is lost is lost too."""

    def marking(self, *args, **kwargs):
        child = original(self, *args, **kwargs)
        _inherit_mark(self, child)
        return child

    return marking


def _marking_property(original: property) -> property:
    """``addressable_shards``: each shard's data inherits the array's lost mark."""

    def getter(self):
        shards = original.__get__(self, type(self))
        for shard in shards:
            if shard.data is not None:
                _inherit_mark(self, shard.data)
        return shards

    return property(getter, doc=original.__doc__)


def _guard_numpy(original: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(*args, **kwargs):
        for value in args[:1] or kwargs.values():
            _check_readable(value)
        return original(*args, **kwargs)

    guarded.__name__ = original.__name__
    guarded.__doc__ = original.__doc__
    guarded.__wrapped__ = original
    return guarded


def _guard_batched(original: Callable[..., Any]) -> Callable[..., Any]:
    def batched_block_until_ready(arrays):
        arrays = list(arrays)
        for array in arrays:
            _check_readable(array)
        return original(arrays)

    return batched_block_until_ready


def _simulated_get_slice_to_devices(devices: Sequence[jax.Device]) -> Mapping[int, Sequence[jax.Device]]:
    simulator = _active
    if simulator is None:
        return _Patches.originals["get_slice_to_devices"](devices)
    return simulator._group(devices)


class _Patches:
    """Install and undo every patch the simulator makes, in one place."""

    originals: dict[str, Any] = {}
    _undo: list[Callable[[], None]] = []

    _ARRAY_METHODS = ("block_until_ready", "__getitem__", "__iter__", "__array__", "__dlpack__", "item")
    _ARRAY_PROPERTIES = ("_value",)
    _NUMPY = ("asarray", "array", "asanyarray", "ascontiguousarray")

    @classmethod
    def _replace(cls, owner: Any, name: str, replacement: Any) -> None:
        had = name in vars(owner)
        original = vars(owner)[name] if had else getattr(owner, name)
        setattr(owner, name, replacement)

        def undo() -> None:
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)

        cls._undo.append(undo)

    @classmethod
    def install(cls) -> None:
        cls.originals["get_slice_to_devices"] = _pw_elastic.get_slice_to_devices
        cls._replace(_pw_elastic, "get_slice_to_devices", _simulated_get_slice_to_devices)
        for name in cls._ARRAY_METHODS:
            cls._replace(_ArrayImpl, name, _guard_method(getattr(_ArrayImpl, name)))
        for name in cls._ARRAY_PROPERTIES:
            cls._replace(_ArrayImpl, name, _guard_property(vars(_ArrayImpl)[name]))
        cls._replace(_ArrayImpl, "addressable_data", _marking_method(_ArrayImpl.addressable_data))
        cls._replace(_ArrayImpl, "addressable_shards", _marking_property(vars(_ArrayImpl)["addressable_shards"]))
        cls._replace(
            _xla_client, "batched_block_until_ready", _guard_batched(_xla_client.batched_block_until_ready)
        )
        for name in cls._NUMPY:
            cls._replace(np, name, _guard_numpy(getattr(np, name)))

    @classmethod
    def uninstall(cls) -> None:
        while cls._undo:
            cls._undo.pop()()
        cls.originals.clear()


# --------------------------------------------------------------------------- simulator


class SimulatedSlices:
    """``num_slices`` slices of ``devices_per_slice`` host CPU devices each, as a context manager.

    The host must have ``num_slices * devices_per_slice`` CPU devices, set before JAX starts
    (``XLA_FLAGS=--xla_force_host_platform_device_count=N``). Slice ``k`` is devices
    ``k*D .. k*D+D-1`` of ``jax.devices()`` ordered by id. One simulator is active at a time.

    ``schedule`` (text or :class:`Schedule`) fires faults at the elastic layer's phase
    announcements; ``fault_log`` (a JSON-lines file) records each fault, flushed and fsynced,
    before it fires, so a process restarted with the same schedule and log does not fire it
    again. Without ``fault_log`` a restarted process fires every fault again.
    """

    def __init__(
        self,
        num_slices: int,
        devices_per_slice: int,
        *,
        schedule: str | Schedule | None = None,
        fault_log: str | os.PathLike[str] | None = None,
    ) -> None:
        for name, value in (("num_slices", num_slices), ("devices_per_slice", devices_per_slice)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a whole number >= 1")
        if schedule is None:
            schedule = Schedule()
        elif isinstance(schedule, str):
            schedule = parse_schedule(schedule)
        elif not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be text or a Schedule, not {type(schedule).__name__}")
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
        self._fired: set[int] = self._read_fault_log()
        if self.fault_log is None and any(f.action in ("preempt", "kill") for f in schedule):
            logger.warning(
                "schedule %s ends this process but has no fault_log: a restarted process fires "
                "its faults again; pass fault_log= to fire each once per run",
                schedule,
            )
        self._lock = threading.RLock()
        self._token = object()
        self._lost: frozenset[int] = frozenset()
        self._lost_device_ids: frozenset[int] = frozenset()
        self._device_slice: dict[int, int] = {}
        self._skipped_logged = False
        self.devices: list[jax.Device] = []
        self.slice_to_devices: dict[int, list[jax.Device]] = {}
        self._listener = self._on_phase

    # ----------------------------------------------------------------- context

    def __enter__(self) -> SimulatedSlices:
        global _active
        needed = self.num_slices * self.devices_per_slice
        devices = sorted(jax.devices(), key=lambda device: device.id)
        if devices[0].platform != "cpu":
            raise RuntimeError(
                f"SimulatedSlices runs on host CPU devices, but JAX's default backend is "
                f"{devices[0].platform!r}; set JAX_PLATFORMS=cpu before JAX starts"
            )
        if len(devices) < needed:
            raise RuntimeError(
                f"SimulatedSlices({self.num_slices}, {self.devices_per_slice}) needs {needed} host "
                f"devices, but JAX has {len(devices)}. Set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={needed} before JAX starts "
                f"(or elastic_dew.runtime.prepare_process(xla_flags="
                f"'--xla_force_host_platform_device_count={needed}'))"
            )
        with _active_lock:
            if _active is not None:
                raise RuntimeError("another SimulatedSlices is already active; one at a time")
            self.devices = devices[:needed]
            self.slice_to_devices = {
                index: self.devices[index * self.devices_per_slice : (index + 1) * self.devices_per_slice]
                for index in range(self.num_slices)
            }
            self._device_slice = {
                device.id: index for index, slice_devices in self.slice_to_devices.items() for device in slice_devices
            }
            self._lost = frozenset()
            self._lost_device_ids = frozenset()
            _Patches.install()
            _active = self
        hooks.add_listener(self._listener)
        logger.info(
            "simulating %d slices of %d CPU devices; schedule %s",
            self.num_slices,
            self.devices_per_slice,
            self.schedule or "none",
        )
        return self

    def __exit__(self, *exc_info: Any) -> None:
        global _active
        hooks.remove_listener(self._listener)
        with _active_lock:
            if _active is self:
                _Patches.uninstall()
                _active = None
        self._lost = frozenset()
        self._lost_device_ids = frozenset()

    # ----------------------------------------------------------------- slices

    @property
    def lost(self) -> frozenset[int]:
        """The slices lost now."""
        return self._lost

    @property
    def fired(self) -> frozenset[Fault]:
        """Scheduled faults fired so far in this run (this process or an earlier one)."""
        return frozenset(self.schedule.faults[index] for index in self._fired)

    def slice_of(self, device: jax.Device) -> int | None:
        """The simulated slice a device belongs to, or None for a device outside every slice."""
        return self._device_slice.get(device.id)

    def _check_index(self, index: int) -> None:
        if not isinstance(index, int) or not 0 <= index < self.num_slices:
            raise ValueError(f"slice {index!r} does not exist; slices are 0..{self.num_slices - 1}")

    def _set_lost(self, lost: frozenset[int]) -> None:
        self._lost = lost
        self._lost_device_ids = frozenset(
            device.id for index in lost for device in self.slice_to_devices[index]
        )

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

    def _mark(self, array: Any) -> None:
        try:
            setattr(array, _MARK, self._token)
        except AttributeError:  # an array type without a __dict__: the device rule still holds
            logger.debug("cannot mark %s as lost", type(array).__name__)

    def _mark_live_arrays(self, i: int) -> int:
        slice_ids = {device.id for device in self.slice_to_devices[i]}
        marked = 0
        for array in jax.live_arrays():
            if any(device.id in slice_ids for device in array.sharding.device_set):
                self._mark(array)
                marked += 1
        return marked

    def _check_readable(self, array: Any) -> None:
        if getattr(array, _MARK, None) is self._token:
            raise jax.errors.JaxRuntimeError(
                "DATA_LOSS: simulated slice failure: this array's data was on a slice that was "
                "lost (elastic_dew.simulate)"
            )
        lost_ids = self._lost_device_ids
        if lost_ids:
            touched = {
                self._device_slice[device.id]
                for device in array.sharding.device_set
                if device.id in lost_ids
            }
            if touched:
                raise jax.errors.JaxRuntimeError(
                    f"DATA_LOSS: simulated slice failure: slice {', '.join(map(str, sorted(touched)))} "
                    "holding this array is lost (elastic_dew.simulate)"
                )

    def _group(self, devices: Sequence[jax.Device]) -> dict[int, list[jax.Device]]:
        grouped: dict[int, list[jax.Device]] = {}
        outside = 0
        for device in devices:
            index = self._device_slice.get(device.id)
            if index is None or device.platform != "cpu":
                outside += 1
                continue
            grouped.setdefault(index, []).append(device)
        if not grouped:
            raise ValueError(
                f"none of the {len(devices)} devices belongs to a simulated slice; the simulated "
                f"slices are CPU devices {sorted(self._device_slice)}"
            )
        if outside and not self._skipped_logged:
            self._skipped_logged = True
            logger.info("%d devices are outside the simulated slices and are left out", outside)
        return dict(sorted(grouped.items()))

    # ----------------------------------------------------------------- schedule

    def _read_fault_log(self) -> set[int]:
        if self.fault_log is None or not self.fault_log.exists():
            return set()
        fired: set[int] = set()
        lines = self.fault_log.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                index, text = int(entry["index"]), str(entry["fault"])
            except (ValueError, KeyError, TypeError):
                if number == len(lines):  # a write cut short by a kill: the fault did not fire
                    logger.warning("ignoring a torn last line of fault log %s", self.fault_log)
                    continue
                raise ValueError(
                    f"fault log {self.fault_log} line {number} is not a fault record: {line!r}"
                ) from None
            if index >= len(self.schedule) or str(self.schedule.faults[index]) != text:
                raise ValueError(
                    f"fault log {self.fault_log} records fault #{index} {text!r}, which is not in "
                    f"schedule {str(self.schedule)!r}; it belongs to another run: use a fresh "
                    "fault_log for a new schedule"
                )
            fired.add(index)
        return fired

    def _record(self, index: int, fault: Fault, phase: str, step: int) -> None:
        if self.fault_log is None:
            return
        entry = {
            "index": index,
            "fault": str(fault),
            "phase": phase,
            "step": step,
            "pid": os.getpid(),
            "time": time.time(),
        }
        created = not self.fault_log.exists()
        self.fault_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.fault_log, "a", encoding="utf-8") as log:
            log.write(json.dumps(entry) + "\n")
            log.flush()
            os.fsync(log.fileno())
        if created:
            directory = os.open(self.fault_log.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)

    def _on_phase(self, phase: str, step: int) -> None:
        due: list[Fault] = []
        with self._lock:
            for index, fault in enumerate(self.schedule.faults):
                if index in self._fired or fault.phase != phase or step < fault.step:
                    continue
                self._record(index, fault, phase, step)
                self._fired.add(index)
                due.append(fault)
        for fault in due:
            self._fire(fault, phase, step)

    def _fire(self, fault: Fault, phase: str, step: int) -> None:
        logger.warning("firing scheduled fault %s at %s of step %d", fault, phase, step)
        if fault.action in _SLICE_ACTIONS:
            # A slice fault only changes slice health; its error surfaces at the next read,
            # as on Pathways, never inside the announcement.
            try:
                (self.lose if fault.action == "lose" else self.restore)(fault.slice)
            except Exception:  # noqa: BLE001 - the schedule was validated; log, never raise here
                logger.exception("scheduled fault %s could not be applied", fault)
        elif fault.action == "preempt":
            os.kill(os.getpid(), signal.SIGTERM)
        elif fault.action == "kill":
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
