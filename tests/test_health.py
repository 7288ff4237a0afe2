"""The slice health check: compiled once per slice, reused at every poll, same verdicts.

Slices are simulated on the 8 CPU devices of the test process (TPU slices cannot exist
here); the real pathwaysutils ``Manager``, ``get_active_slice_indices`` and
``wait_for_slices`` run on top. Compilations are counted with JAX's own backend-compile
event (``jax.monitoring``), which fires for every program XLA compiles.
"""

from __future__ import annotations

import logging
import threading

import jax
import pytest
from pathwaysutils.elastic import elastic as pw_elastic

from elastic_dew._compat import pathwaysutils as pw_private
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.slices import health
from elastic_dew.elastic.slices.retry import elastic_retry, make_manager
from elastic_dew.simulate import SimulatedSlices

pytestmark = pytest.mark.libraries  # pathwaysutils' slice health check

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


class _Compilations:
    """Counts XLA backend compilations while it is registered."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, event: str, duration: float, **kwargs) -> None:
        if event == _BACKEND_COMPILE:
            with self._lock:
                self.count += 1


@pytest.fixture
def compilations():
    counter = _Compilations()
    jax.monitoring.register_event_duration_secs_listener(counter)
    try:
        yield counter
    finally:
        jax.monitoring.unregister_event_duration_listener(counter)


@pytest.fixture
def sim():
    with SimulatedSlices(4, 2) as simulated:
        yield simulated


@pytest.fixture
def probes():
    return health.SliceProbes()


def _check(sim, probes) -> frozenset[int]:
    return pw_elastic.get_active_slice_indices(
        sim.slice_to_devices, health.ReusableSliceHealthChecker(sim.slice_to_devices, probes)
    )


def test_repeated_polls_compile_each_slice_probe_once_and_then_never_again(sim, probes, compilations):
    jax.clear_caches()  # an earlier test in this process may have compiled the same probes
    assert _check(sim, probes) == {0, 1, 2, 3}
    assert probes.compilations == 4
    first = compilations.count
    assert first >= 4  # the check is seen compiling: the counter can fail
    for _ in range(20):
        assert _check(sim, probes) == {0, 1, 2, 3}
    assert compilations.count == first
    assert probes.compilations == 4 and len(probes) == 4


def test_a_lost_slice_is_reported_down_and_a_restored_one_up_without_compiling(sim, probes, compilations):
    _check(sim, probes)
    before = compilations.count
    sim.lose(2)
    assert _check(sim, probes) == {0, 1, 3}
    sim.lose(0)
    assert _check(sim, probes) == {1, 3}
    sim.restore(2)
    assert _check(sim, probes) == {1, 2, 3}
    sim.restore(0)
    assert _check(sim, probes) == {0, 1, 2, 3}
    assert compilations.count == before


def test_an_error_that_is_not_a_slice_loss_is_raised_not_counted_as_down(sim, probes, monkeypatch):
    def broken(devices):
        raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: not a slice loss")

    monkeypatch.setattr(probes, "start", broken)
    with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT"):
        _check(sim, probes)


def _fail_slice_1_at_dispatch(sim, probes, monkeypatch, message):
    """Slice 1's probe fails at its dispatch with ``message``; the others run."""
    start = probes.start

    def failing_on_slice_1(devices):
        if devices == sim.slice_to_devices[1]:
            raise jax.errors.JaxRuntimeError(message)
        return start(devices)

    monkeypatch.setattr(probes, "start", failing_on_slice_1)


def test_a_slice_down_error_at_dispatch_marks_only_that_slice_down(sim, probes, monkeypatch):
    """Pathways may fail the dispatch itself on a lost slice; the simulator fails at reads,
    so the dispatch failure is injected here."""
    _fail_slice_1_at_dispatch(sim, probes, monkeypatch, "NOT_FOUND: slice 1 is gone")
    assert _check(sim, probes) == {0, 2, 3}


_MAY_OR_MAY_NOT = "may or may not be due to slice down"


def _may_or_may_not(caplog) -> int:
    """pathwaysutils' WARNING for an INTERNAL, NOT_FOUND or DEADLINE_EXCEEDED error, counted."""
    return sum(_MAY_OR_MAY_NOT in r.getMessage() for r in caplog.records if r.name.startswith("pathwaysutils"))


def test_a_slice_lost_with_an_internal_error_is_warned_of_once_per_outage_however_many_polls(sim, probes, caplog):
    caplog.set_level(logging.WARNING, logger="pathwaysutils")
    sim.lose(1, "INTERNAL")
    for _ in range(20):
        assert _check(sim, probes) == {0, 2, 3}
    assert _may_or_may_not(caplog) == 1
    sim.restore(1)
    assert _check(sim, probes) == {0, 1, 2, 3}
    sim.lose(1, "INTERNAL")  # a new outage: pathwaysutils is asked again
    for _ in range(5):
        assert _check(sim, probes) == {0, 2, 3}
    assert _may_or_may_not(caplog) == 2


def test_an_error_of_another_kind_on_a_slice_already_down_is_still_judged_by_pathwaysutils(sim, probes, monkeypatch):
    sim.lose(1, "INTERNAL")
    assert _check(sim, probes) == {0, 2, 3}
    _fail_slice_1_at_dispatch(sim, probes, monkeypatch, "INVALID_ARGUMENT: not a slice loss")
    with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT"):
        _check(sim, probes)


def test_the_managers_monitor_and_wait_warn_once_for_a_slice_lost_with_an_internal_error(sim, caplog):
    manager = make_manager()
    health.PROBES.clear()  # no outage remembered from an earlier test of this process
    caplog.set_level(logging.WARNING, logger="pathwaysutils")
    sim.lose(1, "INTERNAL")
    manager.active_slice_indices = pw_elastic.wait_for_slices(3, poll_interval=0.01, timeout=30,
                                                              slice_to_devices=manager.slice_to_devices)
    assert manager.active_slice_indices == {0, 2, 3}
    for _ in range(10):
        pw_private.check_inactive_slices(manager)  # the monitor thread's poll
    assert manager.available_inactive_slices == frozenset()
    with pytest.raises(TimeoutError):
        pw_elastic.wait_for_slices(None, poll_interval=0.01, timeout=0.2, slice_to_devices=manager.slice_to_devices)
    assert _may_or_may_not(caplog) == 1


def test_a_wrong_answer_from_a_slice_is_refused_with_the_slice_named(sim, probes, monkeypatch):
    monkeypatch.setattr(health, "_EXPECTED", 7.0)
    with pytest.raises(ValueError, match="slice 0 answered"):
        _check(sim, probes)


def test_make_manager_routes_the_managers_checks_through_the_reusable_checker(sim, compilations):
    health.uninstall()
    try:
        manager = make_manager()
        assert health.installed()
        assert manager.active_slice_indices == {0, 1, 2, 3}
        compiled = compilations.count
        sim.lose(3)
        waited = pw_elastic.wait_for_slices(3, poll_interval=0.01, timeout=30, slice_to_devices=manager.slice_to_devices)
        assert waited == {0, 1, 2}
        manager.active_slice_indices = waited
        sim.restore(3)
        for _ in range(5):
            pw_private.check_inactive_slices(manager)  # the monitor thread's poll
        assert manager.available_inactive_slices == {3}
        assert compilations.count == compiled
    finally:
        health.uninstall()
    assert pw_elastic.DefaultSliceHealthChecker is not health.ReusableSliceHealthChecker
    health.install()  # as make_manager leaves the process


def test_a_wait_for_a_slice_that_never_returns_ends_with_a_timeout(sim):
    manager = make_manager()
    sim.lose(1)
    with pytest.raises(TimeoutError, match="Timed out waiting for 4 slices"):
        pw_elastic.wait_for_slices(None, poll_interval=0.05, timeout=0.3, slice_to_devices=manager.slice_to_devices)


def test_by_default_a_wait_ends_after_300_seconds_and_the_tenth_slice_loss_ends_the_run(sim, monkeypatch):
    manager = make_manager()
    passed = {}
    monkeypatch.setattr(manager, "elastic_retry", lambda **kwargs: passed.update(kwargs))
    elastic_retry(manager, ElasticConfig())
    assert passed["timeout"] == 300
    policy = passed["retry_policy"]
    slice_down = jax.errors.JaxRuntimeError("DATA_LOSS: slice went away")
    assert [policy(attempt, slice_down) for attempt in range(1, 11)] == [True] * 9 + [False]


def _in_thread(work) -> dict:
    """Run ``work`` in a thread; a regression that blocks fails the test instead of hanging it."""
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "blocked on the hung slice"
    return outcome


def test_a_hung_slice_is_reported_down_and_the_other_slices_up_within_the_probe_bound(sim, probes, caplog):
    sim.hang(1)
    checker = health.ReusableSliceHealthChecker(sim.slice_to_devices, probes, probe_timeout=0.3)
    outcome = _in_thread(lambda: pw_elastic.get_active_slice_indices(sim.slice_to_devices, checker))
    assert outcome["value"] == {0, 2, 3}
    assert "slice 1's health probe did not answer within 0.3 s" in caplog.text
    sim.restore(1)
    assert _check(sim, probes) == {0, 1, 2, 3}


def test_the_timeout_ends_a_wait_for_slices_while_one_of_them_hangs(sim, probes):
    """On Pathways a hung slice's probe read blocks; without the probe's bound the wait
    would never reach its own timeout."""
    sim.hang(3)
    checker = health.ReusableSliceHealthChecker(sim.slice_to_devices, probes, probe_timeout=0.3)
    outcome = _in_thread(lambda: pw_elastic.wait_for_slices(
        None, poll_interval=0.05, timeout=1.0, slice_to_devices=sim.slice_to_devices, checker=checker
    ))
    assert isinstance(outcome.get("error"), TimeoutError), outcome
    assert "Timed out waiting for 4 slices" in str(outcome["error"])


def test_a_probe_bound_that_is_not_positive_is_refused(sim):
    with pytest.raises(ValueError, match="probe_timeout=0 must be > 0"):
        health.ReusableSliceHealthChecker(sim.slice_to_devices, probe_timeout=0)


def test_reads_after_a_hung_one_are_read_in_time_and_only_the_hung_one_is_late():
    """read_each, the reader the step deadline and the probes share: a read that never
    returns (here, one waiting on an event nobody sets) is late; the reads after it are not."""
    from elastic_dew.elastic.deadline import read_each

    never = threading.Event()
    try:
        done, late = read_each({"a": lambda: 1, "hung": never.wait, "b": lambda: 2, "c": lambda: 1 / 0}, 0.2)
        assert late == ["hung"]
        assert done["a"].result() == 1 and done["b"].result() == 2
        with pytest.raises(ZeroDivisionError):
            done["c"].result()
    finally:
        never.set()
