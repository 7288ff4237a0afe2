"""Faults in loops elastic_dew did not write: no announcements, only the program's own work.

The loops here import nothing of elastic_dew: a ``jax.jit`` step or a compiled step driven
by pathwaysutils' real ``Manager.elastic_retry``. TPU slices cannot exist here;
:class:`SimulatedSlices` stands in for them on the test process's 8 CPU devices (conftest).
"""

from __future__ import annotations

import json
import logging
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import elastic as pw_elastic
from pathwaysutils.elastic import manager

from elastic_dew.elastic.slices import health
from elastic_dew.simulate import SimulatedSlices

from userloop import replica_setup

pytestmark = pytest.mark.libraries  # the simulator's patches


def _run(elastic_manager: manager.Manager, steps: int, record: list, *, compiled: bool = False,
         minimum_slice_count: int = 1):
    """A user's loop: a mesh over the active slices, a jit (or compiled) step, a read each step."""

    @elastic_manager.elastic_retry(minimum_slice_count=minimum_slice_count, poll_interval=0.05, timeout=30)
    def loop():
        w, step_fn, replicated, batch_sharding = replica_setup(elastic_manager)
        if compiled:
            shape = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=batch_sharding)
            step_fn = step_fn.lower(jax.ShapeDtypeStruct((64,), jnp.float32, sharding=replicated), shape).compile()
        record.append(("attempt", elastic_manager.active_slice_count))
        for step in range(steps):
            batch = jax.device_put(jnp.ones((8, 64)), batch_sharding)
            w = step_fn(w, batch)
            record.append(("step", step, float(w[0])))
        return w

    return loop()


@pytest.mark.parametrize("compiled", [False, True], ids=["jax.jit step", "compiled step"])
def test_a_step_keyed_loss_fires_in_a_loop_that_announces_nothing(compiled):
    record: list = []
    with SimulatedSlices(2, 2, schedule="lose:1@4") as sim:
        _run(manager.Manager(), 6, record, compiled=compiled)
    assert [r for r in record if r[0] == "attempt"] == [("attempt", 2), ("attempt", 1)]
    assert [r[1] for r in record if r[0] == "step"] == [0, 1, 2, 0, 1, 2, 3, 4, 5]  # step 4 was lost
    assert sim.steps == 10 and sim.unfired == ()


def test_a_loss_at_dispatch_fails_the_dispatch_of_that_step_in_a_users_loop():
    record: list = []
    with SimulatedSlices(2, 2, schedule="lose:1@3/dispatch"):
        _run(manager.Manager(), 4, record)
    # the third dispatch never ran: the attempt ended after two steps read
    assert [r[1] for r in record if r[0] == "step"] == [0, 1, 0, 1, 2, 3]


def test_the_same_schedule_fires_at_the_same_step_whatever_the_step_time():
    seen = []
    for delay in (0.0, 0.05):
        record: list = []
        with SimulatedSlices(2, 2, schedule="lose:1@3,restore:1@5"):
            elastic_manager = manager.Manager()
            original = jax.block_until_ready

            @elastic_manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=30)
            def loop():
                mesh = Mesh(np.asarray([d for i in sorted(elastic_manager.active_slice_indices)
                                        for d in elastic_manager.slice_to_devices[i]]), ("d",))
                w = jax.device_put(jnp.zeros(4), NamedSharding(mesh, PartitionSpec()))
                step = jax.jit(lambda w: w + 1)
                record.append(elastic_manager.active_slice_count)
                for _ in range(4):
                    w = step(w)
                    original(w)
                    threading.Event().wait(delay)
                    if elastic_manager.available_inactive_slices:
                        raise manager.ScaleUpSignalError()
                return w

            loop()
        seen.append(record)
    assert seen[0] == seen[1] == [2, 1, 2]


def test_a_time_keyed_loss_of_a_hung_slice_fails_the_read_the_loop_is_blocked_in():
    """``hang:1@2,lose:1@+0.5``: the loop blocks in ``jax.block_until_ready`` on the hung
    slice, announces nothing, and the loss half a second later fails that read."""
    record: list = []
    with SimulatedSlices(2, 2, schedule="hang:1@2,lose:1@+0.5") as sim:
        _run(manager.Manager(), 4, record)
    assert [r for r in record if r[0] == "attempt"] == [("attempt", 2), ("attempt", 1)]
    assert sim.unfired == ()


def test_the_health_check_inside_the_simulator_is_elastic_dews_for_any_code():
    was = health.installed()
    health.uninstall()
    try:
        with SimulatedSlices(2, 2):
            assert pw_elastic.DefaultSliceHealthChecker is health.ReusableSliceHealthChecker
        assert pw_elastic.DefaultSliceHealthChecker is not health.ReusableSliceHealthChecker
    finally:
        if was:
            health.install()


def test_faults_that_never_fired_are_warned_of_and_recorded_in_the_fault_log(tmp_path, caplog):
    log = tmp_path / "faults.jsonl"
    record: list = []
    with caplog.at_level(logging.WARNING, logger="elastic_dew.simulate"):
        with SimulatedSlices(2, 2, schedule="lose:1@2,restore:1@40", fault_log=log) as sim:
            _run(manager.Manager(), 3, record)
    assert [str(f) for f in sim.unfired] == ["restore:1@40/step"]
    assert "scheduled faults never fired: ['restore:1@40/step']" in caplog.text
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(line["scheduled"], line.get("never_fired", False)) for line in lines] == [
        ("lose:1@2/step", False), ("restore:1@40/step", True)]


def test_a_named_step_function_is_the_only_one_counted():
    with SimulatedSlices(2, 2, schedule="lose:1@2", step_function="train_step") as sim:
        x = jax.device_put(jnp.ones(1024), sim.slice_to_devices[1][0])

        def train_step(v):
            return v + 1

        for _ in range(3):
            jax.jit(lambda v: v * 2)(x)  # larger inputs, another name: not a step
        small = jax.device_put(jnp.ones(2), sim.slice_to_devices[1][0])
        jax.jit(train_step)(small)
        assert sim.lost == frozenset()
        jax.jit(train_step)(small)
        assert sim.lost == {1} and sim.steps == 2
        healthy = jax.device_put(jnp.ones(2), sim.slice_to_devices[0][0])
        jax.jit(train_step).lower(healthy).compile()(healthy)  # compiled, the same name: a step
        assert sim.steps == 3


def test_the_step_function_still_counts_when_a_resize_shrinks_its_batch():
    with SimulatedSlices(4, 2) as sim:
        def train_step(w, batch):
            return w + batch.mean()

        w = jnp.zeros(4)
        for slices in (4, 1, 1):  # a quarter of the batch after losing three slices
            batch = jax.device_put(jnp.ones((64 * slices, 64)), sim.slice_to_devices[0][0])
            w = jax.jit(train_step)(w, batch)
        jax.jit(lambda x: x.sum())(w)  # a program of another name that carries less is not a step
        assert sim.steps == 3


def test_a_time_keyed_return_fires_at_the_next_step_dispatch_of_a_loop_that_keeps_stepping(tmp_path):
    log = tmp_path / "faults.jsonl"
    with SimulatedSlices(2, 2, schedule="lose:1@2,restore:1@+0.3", fault_log=log) as sim:
        elastic_manager = manager.Manager()

        @elastic_manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=30)
        def loop():
            mesh = Mesh(np.asarray([d for i in sorted(elastic_manager.active_slice_indices)
                                    for d in elastic_manager.slice_to_devices[i]]), ("d",))
            w = jax.device_put(jnp.zeros(4), NamedSharding(mesh, PartitionSpec()))
            for _ in range(40 if elastic_manager.active_slice_count == 1 else 3):
                w = jax.jit(lambda w: w + 1)(w)
                jax.block_until_ready(w)
                threading.Event().wait(0.05)
                if elastic_manager.available_inactive_slices:
                    raise manager.ScaleUpSignalError()
            return w

        loop()
    assert sim.attempts == [(0, 1), (0,), (0, 1)]
    restore = json.loads(log.read_text().splitlines()[1])
    assert restore["scheduled"] == "restore:1@+0.3/step" and restore["phase"] == "step"
