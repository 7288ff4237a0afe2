"""The simulator fails as Pathways does: every slice-down code, at a read and at a dispatch,
derived results, hangs, errors that are not a slice loss, time-keyed faults, unreachable
schedules, and a restore seen at the next step boundary whatever the step time.

TPU slices cannot exist here: :class:`SimulatedSlices` makes the host's CPU devices fail,
and the real pathwaysutils ``Manager``, retry and health check run against it.
"""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import elastic, manager

from elastic_dew import testing as chaos
from elastic_dew.elastic import hooks
from elastic_dew.elastic.slices import health
from elastic_dew.simulate import ScheduledFault, SimulatedSlices, parse_schedule
from elastic_dew.simulate.reachability import unreachable
from elastic_dew.simulate.schedule import SLICE_DOWN_CODES

from faultlib import kinds

pytestmark = pytest.mark.libraries  # the simulator's patches


def _on_slice(sim: SimulatedSlices, index: int) -> jax.Array:
    mesh = Mesh(np.asarray(sim.slice_to_devices[index]), ("d",))
    return jax.device_put(np.arange(4.0), NamedSharding(mesh, PartitionSpec("d")))



def _compiled_for(array: jax.Array):
    shape = jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=array.sharding)
    return jax.jit(lambda x: x * 2).lower(shape).compile()


def test_the_lose_faults_of_a_schedule_take_every_slice_down_code_in_turn():
    schedule = parse_schedule("lose:0@1,lose:1@2,restore:0@3,lose:2@4,lose:3@5,lose:0@6")
    codes = [fault.code for fault in schedule if fault.action == "lose"]
    assert codes == list(SLICE_DOWN_CODES) + ["DATA_LOSS"]


@pytest.mark.parametrize("code", SLICE_DOWN_CODES)
def test_each_code_is_one_pathwaysutils_counts_as_slice_down(code):
    with SimulatedSlices(4, 2) as sim:
        x = _on_slice(sim, 1)
        sim.lose(1, code)
        with pytest.raises(jax.errors.JaxRuntimeError, match=code) as raised:
            np.asarray(x)
    assert elastic.is_error_due_to_slice_down(raised.value)


@pytest.mark.parametrize("code", SLICE_DOWN_CODES)
def test_a_loss_after_dispatch_fails_at_the_read(code):
    with SimulatedSlices(4, 2) as sim:
        x = _on_slice(sim, 2)
        step = _compiled_for(x)
        result = step(x)  # dispatched while healthy
        sim.lose(2, code)
        with pytest.raises(jax.errors.JaxRuntimeError, match=code):
            float(result[0])


@pytest.mark.parametrize("code", SLICE_DOWN_CODES)
def test_a_loss_before_dispatch_fails_the_dispatch(code):
    with SimulatedSlices(4, 2) as sim:
        x = _on_slice(sim, 2)
        step = _compiled_for(x)
        sim.lose(2, code)
        with pytest.raises(jax.errors.JaxRuntimeError, match=code):
            step(x)
        fresh = jax.device_put(np.arange(4.0), x.sharding)  # a fresh array on the lost slice
        with pytest.raises(jax.errors.JaxRuntimeError, match=f"{code}.*dispatched onto lost slice 2"):
            step(fresh)


def test_a_copy_of_a_lost_array_onto_a_healthy_slice_fails_until_replaced():
    with SimulatedSlices(4, 2) as sim:
        x = _on_slice(sim, 3)
        sim.lose(3, "INTERNAL")
        healthy = NamedSharding(Mesh(np.asarray(sim.slice_to_devices[0]), ("d",)), PartitionSpec("d"))
        copy = jax.device_put(x, healthy)
        assert sim.slice_of(next(iter(copy.sharding.device_set))) == 0
        with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
            np.asarray(copy)
        replaced = jax.device_put(np.arange(4.0), healthy)
        assert np.asarray(replaced).tolist() == [0.0, 1.0, 2.0, 3.0]


def _read_blocked(array: jax.Array, what: str):
    """Read ``array`` on a thread and assert the read is still blocked 0.3 s later; returns
    a function that waits (10 s at most) for the read to end and gives its error."""
    outcome = {}
    reader = threading.Thread(target=lambda: outcome.update(error=_read_error(array)), daemon=True)
    reader.start()
    reader.join(0.3)
    assert reader.is_alive(), f"the read of {what} returned"

    def error() -> BaseException | None:
        reader.join(10)
        assert not reader.is_alive(), f"the read of {what} still blocks"
        return outcome.get("error")

    return error


def test_a_hung_slice_blocks_the_read_of_its_result_until_it_is_lost():
    with SimulatedSlices(4, 2) as sim:
        x = _on_slice(sim, 1)
        result = _compiled_for(x)(x)
        sim.hang(1)
        error = _read_blocked(result, "a hung slice's result")
        sim.lose(1)
        assert "DATA_LOSS" in str(error())


def test_a_hung_slices_result_is_never_ready_and_asking_does_not_block():
    with SimulatedSlices(4, 2) as sim:
        x = _on_slice(sim, 1)
        result = _compiled_for(x)(x)
        healthy = _compiled_for(_on_slice(sim, 2))(_on_slice(sim, 2))
        jax.block_until_ready((result, healthy))  # both computed before the hang
        assert result.is_ready()
        sim.hang(1)
        assert not result.is_ready()  # returns at once: a waiting loop can bound its wait
        assert healthy.is_ready()
        sim.lose(1)
        assert result.is_ready()  # its error has arrived: the read raises instead of blocking
        assert "DATA_LOSS" in str(_read_error(result))


def test_the_step_deadline_reads_a_ready_result_on_the_calling_thread_and_a_pending_one_on_its_reader():
    from elastic_dew.elastic.deadline import StepDeadline

    deadline = StepDeadline(fixed=5.0)
    readers = []

    def read():
        readers.append(threading.current_thread())
        return 1.0

    try:
        assert deadline.read(read, 1, ready=lambda: True) == 1.0
        assert deadline.read(read, 2, ready=lambda: False) == 1.0
        assert deadline.read(read, 3) == 1.0
    finally:
        deadline.close()
    assert readers[0] is threading.current_thread()
    assert readers[1] is not threading.current_thread() and readers[2] is readers[1]


def test_a_read_of_fresh_work_on_a_hung_slice_blocks_as_on_pathways_until_the_slice_returns():
    """Pathways answers no read from a worker that stopped answering, old work or new: the
    health probe's read must block too, so that only its bound ends it."""
    with SimulatedSlices(4, 2) as sim:
        sim.hang(2)
        error = _read_blocked(_on_slice(sim, 2), "fresh work on a hung slice")
        sim.restore(2)
        assert "DATA_LOSS" in str(error())  # its data never came back
        assert np.asarray(_on_slice(sim, 2)).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_health_check_reports_a_hung_slice_down_once_its_probe_is_past_the_bound(caplog):
    with SimulatedSlices(4, 2) as sim:
        checker = health.ReusableSliceHealthChecker(sim.slice_to_devices, health.SliceProbes(), probe_timeout=0.5)
        sim.hang(2)
        outcome = {}
        check = threading.Thread(
            target=lambda: outcome.update(active=elastic.get_active_slice_indices(sim.slice_to_devices, checker)),
            daemon=True,
        )
        check.start()
        check.join(120)  # only so that a regression fails instead of hanging the suite
        assert not check.is_alive(), "the health check waited on the hung slice's probe"
        assert outcome["active"] == {0, 1, 3}
    assert "slice 2's health probe did not answer within 0.5 s" in caplog.text


def _read_error(array):
    try:
        np.asarray(array)
    except jax.errors.JaxRuntimeError as error:
        return error
    return None


def test_an_error_fault_raises_invalid_argument_which_is_not_a_slice_loss():
    with SimulatedSlices(2, 2, schedule="error@3"):
        hooks.phase("step", 2)
        with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT") as raised:
            hooks.phase("step", 3)
        hooks.phase("step", 4)  # fired once
    assert not elastic.is_error_due_to_slice_down(raised.value)


def test_a_time_keyed_fault_parses_and_prints_back():
    schedule = parse_schedule("lose:3@17,restore:3@+3,preempt@+0.5/wait")
    assert schedule.faults[1] == ScheduledFault("restore", 3, 0, "step", after=3.0)
    assert str(schedule) == "lose:3@17/step,restore:3@+3/step,preempt@+0.5/wait"
    assert parse_schedule(str(schedule)) == schedule
    with pytest.raises(ValueError, match="time '\\+x' is not \\+SECONDS"):
        parse_schedule("restore:3@+x")


def test_a_time_keyed_fault_fires_at_the_next_boundary_after_its_time_and_is_logged_once(tmp_path):
    log = tmp_path / "faults.jsonl"
    with SimulatedSlices(4, 2, schedule="lose:1@2,restore:1@+0.3", fault_log=log) as sim:
        hooks.phase("step", 2)
        assert sim.lost == {1}
        hooks.phase("step", 3)  # not yet due
        assert sim.lost == {1}
        time.sleep(0.4)
        assert sim.lost == {1}, "a time-keyed fault must wait for a boundary while the run steps"
        hooks.phase("step", 4)
        assert sim.lost == frozenset()
    with SimulatedSlices(4, 2, schedule="lose:1@2,restore:1@+0.3", fault_log=log) as again:
        hooks.phase("step", 5)
        assert again.lost == frozenset()  # a re-run fires neither again
    assert len(log.read_text().splitlines()) == 2


def test_a_time_keyed_fault_fires_during_a_wait_without_any_announcement():
    with SimulatedSlices(4, 2, schedule="lose:1@2,restore:1@+0.2") as sim:
        hooks.phase("step", 2)
        hooks.phase("wait", 1)
        deadline = time.monotonic() + 10
        while sim.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sim.lost == frozenset()


@pytest.mark.parametrize(
    ("schedule", "minimum", "reason"),
    [
        ("lose:3@17,restore:3@35", None, "fault restore:3@35/step can never fire"),
        ("lose:3@17,lose:2@18", None, "fault lose:2@18/step can never fire"),
        ("lose:3@17,lose:2@18,restore:2@30", 3, "fault restore:2@30/step can never fire"),
    ],
)
def test_a_return_keyed_to_a_step_a_paused_run_cannot_reach_is_found(schedule, minimum, reason):
    found = unreachable(parse_schedule(schedule), 4, minimum)
    assert found is not None and reason in found
    assert "restore:" in found and "@+3" in found and "minimum_slice_count=" in found


@pytest.mark.parametrize(
    ("schedule", "minimum"),
    [
        ("lose:3@17,restore:3@+3", None),
        ("lose:3@17,restore:3@+3,lose:1@30,restore:1@+1", None),
        ("lose:3@17,restore:3@35", 3),
        ("lose:3@17,preempt@+2,restore:3@30", None),
        ("lose:3@17,restore:3@17", None),
    ],
)
def test_schedules_that_can_fire_are_accepted(schedule, minimum):
    assert unreachable(parse_schedule(schedule), 4, minimum) is None


def test_a_restore_is_seen_by_the_manager_at_once():
    """No monitor thread runs here: the simulator makes the Manager check when a slice returns."""
    with SimulatedSlices(4, 2) as sim:
        m = manager.Manager()
        sim.lose(3)
        m.active_slice_indices = {0, 1, 2}
        assert m.available_inactive_slices == frozenset()
        sim.restore(3)
        assert m.available_inactive_slices == {3}


def _stops_and_resumes(tmp_path, name, seconds_per_step):
    def slow(phase, step):
        if phase == "step":
            time.sleep(seconds_per_step)

    hooks.add_listener(slow)
    try:
        # The monitor thread polls every 30 s: only the simulator's delivery can show the restore.
        outcome = chaos.run(
            chaos.Scenario(schedule="lose:2@4,restore:2@7", steps=12, poll_interval=30.0, minimum_slice_count=3),
            tmp_path / name,
        )
    finally:
        hooks.remove_listener(slow)
    assert outcome.error is None, outcome.error
    return kinds(outcome)


def test_a_restore_is_seen_at_the_next_step_boundary_with_fast_and_slow_steps(tmp_path):
    fast = _stops_and_resumes(tmp_path, "fast", 0.0)
    slow = _stops_and_resumes(tmp_path, "slow", 0.05)
    assert fast == slow
    assert ("stop", "scale_up", 7) in fast and ("resume", "live", 8) in fast
