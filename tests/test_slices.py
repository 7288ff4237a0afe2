"""Meshes over the active slices, the batch policy, and the retry policy around pathwaysutils.

Slices are simulated on the 8 CPU devices of the test process (TPU slices cannot exist
here); the real pathwaysutils Manager and ``elastic_retry`` run on top.
"""

from __future__ import annotations

import types

import jax
import pytest
from jax.sharding import PartitionSpec
from pathwaysutils.elastic import manager as pw_manager

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.slices.mesh import (
    AXES,
    active_devices,
    batch_sharding,
    build_mesh,
    check_batch,
    check_batch_for_every_slice_count,
    global_batch_for,
    replicated,
)
from elastic_dew.elastic.slices.retry import SliceLossRetryLimit, elastic_retry, make_manager
from elastic_dew.simulate import SimulatedSlices

pytestmark = pytest.mark.libraries  # pathwaysutils' Manager and retry policy

FAST = dict(poll_interval=0.05, timeout=30)


@pytest.fixture
def sim():
    with SimulatedSlices(4, 2) as simulated:
        yield simulated


def _slice_down() -> jax.errors.JaxRuntimeError:
    return jax.errors.JaxRuntimeError("DATA_LOSS: slice went away")


# ------------------------------------------------------------------ meshes


@pytest.mark.parametrize(("model_axis", "shape"), [(None, (4, 2, 1)), (1, (4, 2, 1)), (2, (4, 1, 2))])
def test_the_mesh_has_a_replica_axis_over_slices_and_the_rest_inside_a_slice(sim, model_axis, shape):
    mesh = build_mesh(make_manager(), model_axis)
    assert mesh.axis_names == AXES
    assert mesh.devices.shape == shape
    for index in range(4):
        assert list(mesh.devices[index].flat) == sim.slice_to_devices[index]


def test_the_mesh_uses_only_the_active_slices_in_slice_order(sim):
    manager = make_manager()
    manager.active_slice_indices = {3, 0}
    mesh = build_mesh(manager)
    assert mesh.devices.shape == (2, 2, 1)
    assert list(mesh.devices.flat) == sim.slice_to_devices[0] + sim.slice_to_devices[3]
    assert active_devices(manager) == sim.slice_to_devices[0] + sim.slice_to_devices[3]


def test_a_model_axis_that_does_not_divide_a_slice_is_refused_with_the_divisors(sim):
    with pytest.raises(ValueError, match=r"model_axis=3 does not divide the 2 devices of a slice; use a divisor of 2 \(1, 2\)"):
        build_mesh(make_manager(), 3)


def test_slices_of_unequal_size_are_refused():
    """A fake Manager: the simulator only makes equal slices, as TPU allocations are."""
    devices = jax.devices()
    fake = types.SimpleNamespace(
        slice_to_devices={0: devices[:2], 1: devices[2:5]},
        active_slice_indices=frozenset({0, 1}),
        active_slice_count=2,
    )
    with pytest.raises(ValueError, match=r"unequal device counts \{0: 2, 1: 3\}"):
        build_mesh(fake)


def test_a_manager_with_its_own_active_devices_is_asked_for_them(sim):
    class GuideManager(pw_manager.Manager):
        @property
        def active_devices(self):
            return list(reversed(sim.devices))

    assert active_devices(GuideManager()) == list(reversed(sim.devices))


def test_a_batch_is_split_over_replica_and_data_and_the_replicated_sharding_splits_nothing(sim):
    mesh = build_mesh(make_manager())
    assert batch_sharding(mesh).spec == PartitionSpec(("replica", "data"))
    assert replicated(mesh).spec == PartitionSpec()
    assert batch_sharding(mesh).mesh == mesh


# ------------------------------------------------------------------ batch policy


@pytest.mark.parametrize(
    ("policy", "active", "expected"),
    [("constant", 4, 32), ("constant", 1, 32), ("scale_by_active_slices", 4, 32), ("scale_by_active_slices", 3, 24), ("scale_by_active_slices", 1, 8)],
)
def test_the_global_batch_follows_the_policy(policy, active, expected):
    assert global_batch_for(32, policy, active, 4) == expected


def test_a_batch_that_cannot_scale_exactly_names_the_numbers_and_the_fix():
    with pytest.raises(ValueError) as caught:
        global_batch_for(30, "scale_by_active_slices", 3, 4)
    message = str(caught.value)
    assert "global_batch=30 cannot be scaled to 3 of 4 slices" in message
    assert "multiple of 4" in message
    assert "batch_policy='constant'" in message


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="must be one of constant, scale_by_active_slices"):
        global_batch_for(32, "double", 2, 4)


def test_a_global_batch_a_reachable_slice_count_cannot_divide_is_refused_up_front():
    config = ElasticConfig(minimum_slice_count=1, global_batch=32)
    with pytest.raises(ValueError, match=r"global_batch=32.*3 active slices.*6 data-parallel devices"):
        check_batch_for_every_slice_count(config, 4, 2)
    check_batch_for_every_slice_count(ElasticConfig(minimum_slice_count=None, global_batch=32), 4, 2)
    scaled = ElasticConfig(minimum_slice_count=1, global_batch=10, batch_policy="scale_by_active_slices")
    with pytest.raises(ValueError, match="10"):  # 10 * 3 / 4 examples is no whole batch
        check_batch_for_every_slice_count(scaled, 4, 2)


def test_a_batch_the_mesh_cannot_divide_names_the_devices_and_the_fix(sim):
    mesh = build_mesh(make_manager())
    check_batch(32, mesh)
    with pytest.raises(ValueError) as caught:
        check_batch(30, mesh)
    message = str(caught.value)
    assert "global_batch=30 does not divide over the 8 batch-parallel devices" in message
    assert "(replica=4 x data=2)" in message
    assert "use a multiple of 8, e.g. 24 or 32" in message


# ------------------------------------------------------------------ retry


def test_scale_ups_never_count_against_the_retry_policy(sim):
    manager = make_manager()
    config = ElasticConfig(minimum_slice_count=1, max_attempts=2, **FAST)
    events = []

    @elastic_retry(manager, config)
    def flapping():
        events.append("attempt")
        if len(events) <= 6:
            raise pw_manager.ScaleUpSignalError()  # a slice flapping six times
        if len(events) == 7:
            raise _slice_down()  # one slice loss: the second attempt is allowed
        return "finished"

    assert flapping() == "finished"
    assert len(events) == 8


def test_pathwaysutils_alone_would_count_the_scale_ups(sim):
    """The contrast that motivates SliceLossRetryLimit: ElasticRetryLimit sees every attempt."""
    manager = make_manager()
    attempts = []

    @manager.elastic_retry(minimum_slice_count=1, retry_policy=pw_manager.ElasticRetryLimit(2), **FAST)
    def flapping():
        attempts.append(1)
        raise pw_manager.ScaleUpSignalError()

    with pytest.raises(pw_manager.ElasticRuntimeError):
        flapping()
    assert len(attempts) == 2


def test_slice_losses_beyond_max_attempts_give_up(sim):
    manager = make_manager()
    losses = []

    @elastic_retry(manager, ElasticConfig(minimum_slice_count=1, max_attempts=3, **FAST))
    def unlucky():
        losses.append(1)
        raise _slice_down()

    with pytest.raises(pw_manager.ElasticRuntimeError):
        unlucky()
    assert len(losses) == 3


def test_the_count_starts_again_for_each_call_of_the_decorated_function(sim):
    manager = make_manager()
    calls = []

    @elastic_retry(manager, ElasticConfig(minimum_slice_count=1, max_attempts=2, **FAST))
    def once_unlucky():
        calls.append(1)
        if len(calls) % 2:
            raise _slice_down()
        return len(calls)

    assert [once_unlucky(), once_unlucky(), once_unlucky()] == [2, 4, 6]


def test_the_policy_on_its_own():
    policy = SliceLossRetryLimit(2)
    assert all(policy(attempt, pw_manager.ScaleUpSignalError()) for attempt in range(1, 10))
    assert policy(10, _slice_down()) is True
    assert policy(11, _slice_down()) is False
    unlimited = SliceLossRetryLimit(None)
    assert all(unlimited(attempt, _slice_down()) for attempt in range(1, 50))


def test_the_count_starts_again_after_the_reset_stretch_of_progress_but_a_crash_loop_still_ends():
    """``retry_reset_steps``: losses come 40 steps of progress apart (a slice that fails
    every few hours of a long run): with ``max_attempts=2`` and a stretch of 30 steps each
    one starts a new count, so a hundred of them are all survived. A crash loop (no step
    beyond the furthest one) ends at the second loss, as ``ElasticRetryLimit(2)`` would."""
    furthest = [0]
    sparse = SliceLossRetryLimit(2, reset_steps=30, progress=lambda: furthest[0])
    allowed = []
    for attempt in range(1, 101):
        furthest[0] += 40
        allowed.append(sparse(attempt, _slice_down()))
    assert all(allowed) and sparse.slice_losses == 1 and sparse.total_slice_losses == 100

    stuck = SliceLossRetryLimit(2, reset_steps=30, progress=lambda: 500)
    assert [stuck(1, _slice_down()), stuck(2, _slice_down())] == [True, False]
    assert "slice losses reached max_attempts=2 (2 within retry_reset_steps=30 steps of progress)" in stuck.describe()


def test_losses_within_the_stretch_add_up_from_the_first_loss_counted():
    """Progress is measured from where the run was at the first loss of the count, not the
    previous one: losses 12 steps apart with a 30-step stretch give up at the third
    (24 steps past the first), while the fourth would have been a new count."""
    furthest = [100]
    policy = SliceLossRetryLimit(3, reset_steps=30, progress=lambda: furthest[0])
    decisions = []
    for attempt in range(1, 4):
        decisions.append(policy(attempt, _slice_down()))
        furthest[0] += 12
    assert decisions == [True, True, False]
    assert policy(4, _slice_down()) is True  # 36 steps past the first loss: a new count


def test_a_reset_stretch_of_zero_counts_over_the_whole_run_as_elastic_retry_limit_does():
    total = SliceLossRetryLimit(3, reset_steps=0, progress=lambda: 10**6)
    reference = pw_manager.ElasticRetryLimit(3)
    assert [total(n, _slice_down()) for n in range(1, 5)] == [reference(n, None) for n in range(1, 5)]
    with pytest.raises(ValueError, match="reset_steps=-1 must be >= 0"):
        SliceLossRetryLimit(3, reset_steps=-1)


def test_configured_callbacks_run_before_the_given_ones(sim):
    manager = make_manager()
    order = []
    config = ElasticConfig(
        minimum_slice_count=1,
        pre_callback=lambda: order.append("config pre"),
        on_elastic_event_callback=lambda: order.append("config event"),
        **FAST,
    )

    @elastic_retry(
        manager,
        config,
        pre_callback=lambda: order.append("pre"),
        on_elastic_event_callback=lambda: order.append("event"),
    )
    def lose_once():
        order.append("run")
        if order.count("run") == 1:
            raise _slice_down()

    lose_once()
    assert order == ["config pre", "pre", "run", "config event", "event", "config pre", "pre", "run"]


def test_a_minimum_above_the_allocation_is_refused_before_anything_runs(sim):
    ran = []
    with pytest.raises(ValueError, match="minimum_slice_count=5 is above the 4 slices"):
        elastic_retry(make_manager(), ElasticConfig(minimum_slice_count=5))(lambda: ran.append(1))
    assert ran == []


def test_replica_resize_carries_on_with_the_slices_left(sim):
    manager = make_manager()
    seen = []

    @elastic_retry(manager, ElasticConfig(minimum_slice_count=2, **FAST))
    def resize():
        seen.append(manager.active_slice_indices)
        if len(seen) == 1:
            sim.lose(1)
            sim.lose(3)
            raise _slice_down()
        return manager.active_slice_count

    assert resize() == 2
    assert seen == [{0, 1, 2, 3}, {0, 2}]


def test_pause_resume_waits_until_the_lost_slice_returns_and_carries_on_with_every_slice():
    """Slice 2 returns 0.3 s into the simulation (the schedule's time-keyed form), while
    pathwaysutils waits for it."""
    with SimulatedSlices(4, 2, schedule="restore:2@+0.3") as sim:
        manager = make_manager()
        seen = []

        @elastic_retry(manager, ElasticConfig(minimum_slice_count=None, **FAST))
        def pause_resume():
            seen.append(manager.active_slice_indices)
            if len(seen) == 1:
                sim.lose(2)
                raise _slice_down()
            return manager.active_slice_count

        assert pause_resume() == 4
        assert seen == [{0, 1, 2, 3}, {0, 1, 2, 3}]
