"""Time-keyed faults fire from the simulator's clock while the loop is blocked, in every loop,
and a wait for slices learns of a returned slice as the schedule returns it.

``hang:1@7,lose:1@+3`` is a slice that stops answering and is declared dead three seconds
later, as Pathways' resource manager declares a worker dead: the read the loop is blocked in
must fail then, not when some other bound (the step deadline, 60 s here) runs out. TPU
slices cannot exist here; :class:`SimulatedSlices` stands in for them on the test process's
8 CPU devices (conftest).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import manager

from elastic_dew.elastic import hooks
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.rundir import FaultLog
from elastic_dew.simulate import SimulatedSlices

from linear import LinearProgram
from userloop import replica_setup
from linear import config as _config
from linear import dataset as _dataset
import pytest

pytestmark = pytest.mark.libraries  # the simulator's patches and pathwaysutils' wait for slices

HANG_THEN_DEAD = "hang:1@7,lose:1@+3"
#: How long after its due time the blocked read may end (the clock ticks every 0.05 s).
WITHIN = 1.0


def _fired(path) -> dict[str, float]:
    return {fault.action: fault.wall for fault in FaultLog(path).entries()}


def test_a_hung_slice_declared_dead_ends_the_blocked_read_of_elastic_dews_own_loop_on_time(tmp_path):
    stopped: list[float] = []

    def emit(event):
        if event.kind == "stop" and event.reason == "slice_lost":
            stopped.append(time.time())

    with SimulatedSlices(4, 2, schedule=HANG_THEN_DEAD, fault_log=tmp_path / "faults.jsonl") as sim:
        run = ElasticRun(LinearProgram(), ElasticData(_dataset()),
                         _config(tmp_path, minimum_slice_count=3, checkpoint_every=0), emit=emit)
        _, step = run.run(10)
    assert step == 10 and sim.unfired == ()
    fired = _fired(tmp_path / "faults.jsonl")
    assert fired["lose"] - fired["hang"] >= 3
    # The own loop's step deadline is 60 s here: only the clock ends the read this early.
    assert stopped and stopped[0] - (fired["hang"] + 3) < WITHIN


def _announced_loop(elastic_manager: manager.Manager, steps: int, record: list):
    """A third-party loop (pathwaysutils' ``elastic_retry``) that announces its phases."""

    @elastic_manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=30)
    def loop():
        w, step_fn, _, batch_sharding = replica_setup(elastic_manager)
        record.append(("attempt", elastic_manager.active_slice_count, time.time()))
        for step in range(1, steps + 1):
            hooks.phase("dispatch", step)
            w = step_fn(w, jax.device_put(jnp.ones((8, 64)), batch_sharding))
            hooks.phase("step", step)
            jax.block_until_ready(w)
            record.append(("step", step, time.time()))
        return w

    return loop()


def test_a_hung_slice_declared_dead_ends_the_blocked_read_of_an_announced_third_party_loop_on_time(tmp_path):
    record: list = []
    with SimulatedSlices(2, 2, schedule=HANG_THEN_DEAD, fault_log=tmp_path / "faults.jsonl") as sim:
        _announced_loop(manager.Manager(), 9, record)
    attempts = [r for r in record if r[0] == "attempt"]
    assert [r[1] for r in attempts] == [2, 1] and sim.unfired == ()
    fired = _fired(tmp_path / "faults.jsonl")
    assert 0 <= attempts[1][2] - (fired["hang"] + 3) < WITHIN


def test_a_wait_for_slices_without_a_poll_interval_sees_a_returned_slice_at_once():
    """pathwaysutils' default poll is 10 s; the schedule returns the slice 0.2 s after its loss."""
    record: list = []
    with SimulatedSlices(2, 2, schedule="lose:1@3,restore:1@+0.2") as sim:
        elastic_manager = manager.Manager()

        @elastic_manager.elastic_retry(timeout=30)  # every slice, pathwaysutils' default poll
        def loop():
            mesh = Mesh(np.asarray([d for i in sorted(elastic_manager.active_slice_indices)
                                    for d in elastic_manager.slice_to_devices[i]]), ("d",))
            w = jax.device_put(jnp.zeros(4), NamedSharding(mesh, PartitionSpec()))
            step = jax.jit(lambda w: w + 1)
            record.append((elastic_manager.active_slice_count, time.monotonic()))
            for _ in range(4):
                w = step(w)
                jax.block_until_ready(w)
            return w

        started = time.monotonic()
        loop()
    assert [slices for slices, _ in record] == [2, 2] and sim.unfired == ()
    assert record[1][1] - started < 5  # not the 10 s poll
