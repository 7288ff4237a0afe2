"""A slice health check that compiles once per slice and dispatches every slice before waiting.

pathwaysutils 0.1.13 checks slices with ``DefaultSliceHealthChecker``, which builds a new
``jax.pmap`` of a new bound method for every slice at every poll: each poll compiles one
program per slice, one slice after another, and the compiled programs pile up in JAX's
caches. A controller waiting for a slice therefore grows its memory poll after poll, and
the wait after a loss grows linearly with the slice count.

:class:`ReusableSliceHealthChecker` implements pathwaysutils' own ``SliceHealthChecker``
interface (``dispatch`` starts the probes, ``validate`` waits for them and returns the
healthy slice indices) with the same probe and the same verdicts: a slice whose probe fails
with an error pathwaysutils counts as slice-down is down, any other error is raised. What
differs is the cost. Each slice's probe (``x + 1`` over the slice's devices) is compiled
ahead of time once, the first time that slice is checked, and kept in :class:`SliceProbes`
for the life of the process; a poll only copies a few numbers to each slice and runs the
compiled programs, all of them dispatched before any is awaited. A slice that stays down
fails its probe at every poll; pathwaysutils' verdict on its error is asked once per outage
and error code (:meth:`SliceProbes.is_down`), since pathwaysutils logs a WARNING at each call
for the codes that "may or may not" mean a slice loss (``INTERNAL`` among them).

The seam. pathwaysutils 0.1.13 accepts a ``checker`` in
``pathwaysutils.elastic.elastic.get_active_slice_indices`` and ``wait_for_slices``, but its
``Manager`` never passes one: ``Manager.__init__``, the monitor thread
(``Manager._check_inactive_slices``) and ``elastic_retry``'s wait all end in
``get_active_slice_indices(slice_to_devices, None)``, which constructs
``elastic.DefaultSliceHealthChecker(slice_to_devices)`` by its module-level name.
:func:`install` binds that one name (the seam's ``pw_private.DEFAULT_CHECKER``) to :class:`ReusableSliceHealthChecker` (same
constructor, same interface), which reaches all three paths without copying any of
pathwaysutils' code; :func:`uninstall` restores it. ``make_manager`` installs it. Once a
pathwaysutils ``Manager`` takes a checker, pass one instead of installing.

A slice that stops answering without an error (a hang) would make ``validate`` wait on its
probe for ever, as pathwaysutils' own checker does, and with it the wait for slices, whose
``timeout`` is only looked at between polls. Each probe's read is therefore bounded, with
the step deadline's reader (:func:`elastic_dew.elastic.deadline.read_each`): a probe that
has not answered within :data:`PROBE_TIMEOUT` seconds counts its slice down, with a log
line, and the poll goes on with the other slices.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence, Set
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import elastic as pw_elastic

from elastic_dew._compat import pathwaysutils as pw_private
from elastic_dew.elastic.deadline import read_each

__all__ = [
    "PROBES",
    "PROBE_TIMEOUT",
    "ReusableSliceHealthChecker",
    "SliceProbes",
    "install",
    "installed",
    "uninstall",
]

logger = logging.getLogger(__name__)

#: The probe's input value; a healthy slice answers ``_VALUE + 1`` on every device, as
#: pathwaysutils' own probe does (``_SIMPLE_EXECUTION_TEST_VALUE``).
_VALUE = 99.0
_EXPECTED = _VALUE + 1
_AXIS = "slice"

#: Seconds a slice's probe may take to answer before the slice counts as down (it stopped
#: answering). A healthy probe (``x + 1`` on a few numbers, compiled beforehand) answers in
#: well under a second; the bound only has to be far above that and below the wait's
#: ``timeout``.
PROBE_TIMEOUT = 30.0


def _plus_one(x: jax.Array) -> jax.Array:
    return x + 1


class SliceProbes:
    """Compiled probes, one per slice, compiled at the first check of that slice and kept.

    A slice is keyed by its devices' ids, so the cache holds one entry per slice of the
    allocation whatever the number of polls: the controller's memory stays flat while it
    waits. ``compilations`` counts the probes compiled (the cache's misses). It also keeps,
    per slice, the error codes pathwaysutils accepted as slice-down during the slice's
    current outage (:meth:`is_down`). Safe to use from the Manager's monitor thread and the
    main thread at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compiled: dict[tuple[int, ...], tuple[Any, NamedSharding]] = {}
        self._down: dict[tuple[int, ...], set[str]] = {}
        self.compilations = 0

    def __len__(self) -> int:
        return len(self._compiled)

    def _probe(self, devices: Sequence[jax.Device]) -> tuple[Any, NamedSharding]:
        key = tuple(device.id for device in devices)
        with self._lock:
            found = self._compiled.get(key)
            if found is not None:
                return found
            sharding = NamedSharding(Mesh(np.asarray(devices, dtype=object), (_AXIS,)), PartitionSpec(_AXIS))
            shape = jax.ShapeDtypeStruct((len(devices),), jnp.float32, sharding=sharding)
            # A failed compile (a slice down at its first check) is not cached: the next
            # poll compiles again.
            compiled = jax.jit(_plus_one).lower(shape).compile()
            self._compiled[key] = (compiled, sharding)
            self.compilations += 1
            logger.debug("compiled the health probe of devices %s", key)
            return compiled, sharding

    def start(self, devices: Sequence[jax.Device]) -> jax.Array:
        """Dispatch the probe on ``devices`` without waiting for its result.

        Args:
            devices: one slice's devices.

        Returns:
            The probe's result, still on its way (``x + 1`` on each device).

        Raises:
            ValueError: no devices.
        """
        if not devices:
            raise ValueError("a slice with no devices cannot be checked; every slice needs a device")
        compiled, sharding = self._probe(devices)
        value = jax.device_put(np.full(len(devices), _VALUE, dtype=np.float32), sharding)
        return compiled(value)

    def is_down(self, devices: Sequence[jax.Device], error: Exception) -> bool:
        """Whether ``error``, met by the probe of the slice on ``devices``, means the slice is down.

        The verdict is pathwaysutils' (``is_error_due_to_slice_down``), asked once per slice,
        outage and error code: that function logs a WARNING at every call for the codes that
        "may or may not" mean a slice loss (``INTERNAL``, ``NOT_FOUND``, ``DEADLINE_EXCEEDED``),
        and a slice that stays down fails its probe at every poll of the wait and of the
        Manager's monitor thread. While the slice stays down (until :meth:`answered`), a later
        error with a code pathwaysutils already accepted for it is down without asking again;
        an error with another code, or none, is asked about.

        Args:
            devices: the slice's devices.
            error: the error its probe raised.

        Returns:
            True when pathwaysutils counts the error as slice-down.
        """
        key, code = tuple(device.id for device in devices), _code(error)
        with self._lock:
            if code is not None and code in self._down.get(key, ()):
                return True
        if not pw_elastic.is_error_due_to_slice_down(error, log_traceback=False):
            return False
        if code is not None:
            with self._lock:
                self._down.setdefault(key, set()).add(code)
        return True

    def answered(self, devices: Sequence[jax.Device]) -> None:
        """The slice on ``devices`` answered its probe: its outage is over (the next error is asked about)."""
        key = tuple(device.id for device in devices)
        with self._lock:
            self._down.pop(key, None)

    def clear(self) -> None:
        """Forget every compiled probe (the next check of each slice compiles again) and every outage."""
        with self._lock:
            self._compiled.clear()
            self._down.clear()


#: The process's probes: one per slice, shared by every checker pathwaysutils constructs.
PROBES = SliceProbes()


def _code(error: Exception) -> str | None:
    """The status code that starts a runtime error's message (``INTERNAL: ...``), else None."""
    code = str(error).split(":", 1)[0].strip()
    return code if code and code.replace("_", "").isalpha() and code.isupper() else None


def _down_or_raise(probes: SliceProbes, slice_index: int, devices: Sequence[jax.Device], error: Exception) -> None:
    """Return for an error pathwaysutils counts as slice-down; raise any other."""
    if not probes.is_down(devices, error):
        raise error
    logger.debug("slice %d is down: %s", slice_index, error)


class ReusableSliceHealthChecker(pw_elastic.SliceHealthChecker):
    """pathwaysutils' ``SliceHealthChecker`` with probes compiled once and run all at once.

    ``dispatch`` starts every slice's probe (compiling it only at that slice's first check);
    ``validate`` then waits on each and returns the slices whose probe answered correctly.
    A slice-down error (pathwaysutils' ``is_error_due_to_slice_down``) at dispatch or at the
    read marks that slice down; any other error is raised, as pathwaysutils' checker does.
    A probe that does not answer within ``probe_timeout`` seconds (the one :func:`install`
    was given, else :data:`PROBE_TIMEOUT`) marks its slice down too.

    Args:
        slice_to_devices: each slice's devices, as pathwaysutils gives them.
        probes: the compiled probes to use (default: the process's, :data:`PROBES`).
        probe_timeout: seconds a probe may go unanswered before its slice counts as down.

    Raises:
        ValueError: ``probe_timeout`` is not above 0.
    """

    def __init__(
        self,
        slice_to_devices: Mapping[int, Sequence[jax.Device]],
        probes: SliceProbes | None = None,
        probe_timeout: float | None = None,
    ) -> None:
        super().__init__(slice_to_devices)
        if probe_timeout is not None and not probe_timeout > 0:
            raise ValueError(f"probe_timeout={probe_timeout} must be > 0 seconds, or None for PROBE_TIMEOUT")
        self.probes = PROBES if probes is None else probes
        self.probe_timeout = probe_timeout
        self.results: dict[int, jax.Array] = {}

    def dispatch(self) -> None:
        results = {}
        for slice_index, devices in self.slice_to_devices.items():
            try:
                results[slice_index] = self.probes.start(devices)
            except jax.errors.JaxRuntimeError as error:
                _down_or_raise(self.probes, slice_index, devices, error)
        self.results = results

    def validate(self) -> Set[int]:
        """Wait for the probes :meth:`dispatch` started, each within the probe timeout.

        Returns:
            The slices whose probe answered correctly.

        Raises:
            ValueError: a probe answered a wrong value (the slice computes wrongly).
            jax.errors.JaxRuntimeError: an error pathwaysutils does not count as slice-down.
        """
        bound = self.probe_timeout or _installed_probe_timeout or PROBE_TIMEOUT
        reads = {
            slice_index: (lambda result=result: np.asarray(jax.block_until_ready(result)))
            for slice_index, result in self.results.items()
        }
        self.results = {}  # the probes' arrays are not kept between polls
        answered, late = read_each(reads, bound)
        del reads
        for slice_index in late:
            logger.warning(
                "slice %d's health probe did not answer within %.3g s: counting the slice down "
                "(it stopped answering)", slice_index, bound,
            )
        healthy = set()
        for slice_index, future in answered.items():
            try:
                answer = future.result()
            except jax.errors.JaxRuntimeError as error:
                _down_or_raise(self.probes, slice_index, self.slice_to_devices[slice_index], error)
                continue
            if not np.allclose(answer, _EXPECTED):
                raise ValueError(
                    f"the health probe of slice {slice_index} answered {answer!r}, expected "
                    f"{_EXPECTED} on each of its {len(answer)} devices: the slice computes wrongly"
                )
            self.probes.answered(self.slice_to_devices[slice_index])
            healthy.add(slice_index)
        return frozenset(healthy)


_install_lock = threading.Lock()
_original: type | None = None
_installed_probe_timeout: float | None = None


def install(probe_timeout: float | None = None) -> None:
    """Make pathwaysutils construct :class:`ReusableSliceHealthChecker` where it builds its default.

    Idempotent; process-wide (the Manager's health checks are process-wide too).

    Args:
        probe_timeout: seconds a slice's probe may take before the slice counts as down, for
            the checkers pathwaysutils builds (``None``: :data:`PROBE_TIMEOUT`).

    Raises:
        ValueError: ``probe_timeout`` is not above 0.
    """
    global _original, _installed_probe_timeout
    if probe_timeout is not None and not probe_timeout > 0:
        raise ValueError(f"probe_timeout={probe_timeout} must be > 0 seconds, or None for {PROBE_TIMEOUT}")
    _installed_probe_timeout = probe_timeout
    with _install_lock:
        if _original is not None:
            return
        _original = pw_private.DEFAULT_CHECKER.get()
        pw_private.DEFAULT_CHECKER.set(ReusableSliceHealthChecker)
    logger.info("slice health checks compile each slice's probe once (elastic_dew.elastic.slices.health)")


def uninstall() -> None:
    """Give pathwaysutils back its own ``DefaultSliceHealthChecker``."""
    global _original
    with _install_lock:
        if _original is None:
            return
        pw_private.DEFAULT_CHECKER.set(_original)
        _original = None


def installed() -> bool:
    """Whether pathwaysutils' health checks go through :class:`ReusableSliceHealthChecker`."""
    return pw_private.DEFAULT_CHECKER.get() is ReusableSliceHealthChecker
