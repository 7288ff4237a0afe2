"""The Pathways guide's elastic training loop, written as a user would, runs under the simulator.

``train`` and ``run_training_loop`` below follow the guide's example (Manager and Orbax
Snapshotter created once outside the retry; ``elastic_retry`` with ``minimum_slice_count=1``
(replica-resize) or ``None`` (pause-resume); snapshot restore at the start of an attempt; in-place scale-up when
``available_inactive_slices`` is non-empty) with a Grain ``ElasticIterator``. What was added
for the simulator, and nothing else:

* the ``SimulatedSlices`` context (TPU slices cannot exist here);
* ``lose``/``restore`` calls at chosen steps (``faults``), or the simulator's fault schedule
  (a time-keyed return, ``restore:1@+0.3``, for the loop that waits for its slice);
* ``active_devices(elastic_manager)`` for the guide's ``elastic_manager.active_devices``,
  which the pathwaysutils release on the package index lacks.

The user's step logs a metric each step, as real loops do: that read is where a lost slice
surfaces. The model is a running sum of the examples and a per-example count, so the final
state proves exactly-once data: every example counted once, whatever the slices did.
"""

from __future__ import annotations

import logging
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pathwaysutils
from jax.sharding import NamedSharding, PartitionSpec
from pathwaysutils.elastic import manager

from elastic_dew.elastic.slices.mesh import active_devices
from elastic_dew.simulate import SimulatedSlices
import pytest

pytestmark = pytest.mark.libraries  # pathwaysutils' Manager and elastic_retry, Orbax

pathwaysutils.initialize()
log = logging.getLogger(__name__)

DATASET_SIZE = 320
GLOBAL_BATCH = 8
FINAL_STEP = DATASET_SIZE // GLOBAL_BATCH


def create_mesh(elastic_manager: manager.Manager, devices_per_slice: int) -> jax.sharding.Mesh:
    device_array = np.asarray(active_devices(elastic_manager)).reshape(
        (elastic_manager.active_slice_count, devices_per_slice)
    )
    return jax.sharding.Mesh(device_array, axis_names=("replica", "model"))


def initialize_training_loop(mesh: jax.sharding.Mesh):
    state_sharding = NamedSharding(mesh, PartitionSpec())
    batch_sharding = NamedSharding(mesh, PartitionSpec("replica"))
    state = {
        "total": jax.device_put(jnp.zeros((), jnp.int32), state_sharding),
        "seen": jax.device_put(jnp.zeros((DATASET_SIZE,), jnp.int32), state_sharding),
    }
    abstract_state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )

    def train_step(state, batch):
        return {"total": state["total"] + batch.sum(), "seen": state["seen"].at[batch].add(1)}

    jitted_train_step = jax.jit(
        train_step, in_shardings=(state_sharding, batch_sharding), out_shardings=state_sharding
    )
    data_iterator = grain.experimental.ElasticIterator(
        grain.MapDataset.range(DATASET_SIZE).map(lambda i: np.int32(i)),
        global_batch_size=GLOBAL_BATCH,
        shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1),
    )
    return state, abstract_state, jitted_train_step, data_iterator


def train(final_step, snapshot_interval, devices_per_slice, faults, record, minimum_slice_count=1):
    elastic_manager = manager.Manager()
    snapshotter = ocp.v1.training.pathways.Snapshotter(replica_axis_index=0)
    record["manager"] = elastic_manager

    @elastic_manager.elastic_retry(
        minimum_slice_count=minimum_slice_count,
        poll_interval=0.05,  # in seconds
        timeout=60,  # in seconds
        retry_policy=manager.ElasticRetryLimit(max_attempts=10),
    )
    def run_training_loop():
        mesh = create_mesh(elastic_manager, devices_per_slice)
        state, abstract_state, jitted_train_step, data_iterator = initialize_training_loop(mesh)
        step = 0

        # Restore from the latest in-memory snapshot after a slice failure.
        if snapshotter.latest is not None:
            snapshotter.join()
            restored = snapshotter.load(
                {"state": abstract_state, "step": step, "iterator_state": data_iterator.get_state()}
            )
            state = restored["state"]
            step = int(restored["step"]) + 1
            data_iterator.set_state(restored["iterator_state"])
        record["attempts"].append((elastic_manager.active_slice_count, step))

        while step < final_step:
            batch = next(data_iterator)
            state = jitted_train_step(state, batch)
            if step in faults:
                faults.pop(step)()
            log.info("step %d total %d", step, int(state["total"]))

            if step % snapshot_interval == 0:
                snapshotter.save(
                    step, {"state": state, "step": step, "iterator_state": data_iterator.get_state()}
                )

            # If replacement slices are healthy, reinitialize and place state onto the new mesh.
            if elastic_manager.available_inactive_slices:
                elastic_manager.active_slice_indices |= elastic_manager.available_inactive_slices
                mesh = create_mesh(elastic_manager, devices_per_slice)
                iterator_state = data_iterator.get_state()
                _, abstract_state, jitted_train_step, data_iterator = initialize_training_loop(mesh)
                data_iterator.set_state(iterator_state)
                state_shardings = jax.tree.map(lambda x: x.sharding, abstract_state)
                state = jax.device_put(state, state_shardings)
                record["scale_ups"].append((step, elastic_manager.active_slice_count))

            step += 1

        return state

    state = run_training_loop()
    snapshotter.join()
    record["latest_snapshot"] = snapshotter.latest.step
    return state


def test_the_guides_loop_survives_a_lost_slice_resumes_from_a_snapshot_and_scales_back_up():
    record = {"attempts": [], "scale_ups": []}
    with SimulatedSlices(2, 2) as sim:

        def restore_and_wait_for_the_monitor():
            sim.restore(1)
            deadline = time.monotonic() + 30
            while not record["manager"].available_inactive_slices and time.monotonic() < deadline:
                time.sleep(0.01)

        faults = {12: lambda: sim.lose(1), 20: restore_and_wait_for_the_monitor}
        state = train(FINAL_STEP, snapshot_interval=5, devices_per_slice=2, faults=faults, record=record)

        assert faults == {}
        first, resumed = record["attempts"]
        assert first == (2, 0)
        slices, resume_step = resumed
        assert slices == 1
        # Just after a completed snapshot (0, 5 or 10; the Snapshotter skips a save while busy).
        # The newest snapshot that completed: Orbax skips a save while one is in flight and
        # drops one whose transfer the loss interrupted, so on a busy machine it may be none
        # (a fresh start at step 0); the data are exactly once either way (below).
        assert resume_step in (0, 1, 6, 11)
        assert record["scale_ups"] == [(20, 2)]
        assert state["total"].sharding.mesh.devices.shape == (2, 2)
        assert int(state["total"]) == sum(range(DATASET_SIZE))
        np.testing.assert_array_equal(np.asarray(state["seen"]), np.ones(DATASET_SIZE, np.int32))
        assert record["latest_snapshot"] == 35


def test_the_guides_loop_in_pause_resume_waits_for_the_slice_and_resumes_on_every_slice():
    record = {"attempts": [], "scale_ups": []}
    # Slice 1 is lost after step 12 (the step function's 13th dispatch) and returns 0.3 s later,
    # while the loop waits for it.
    with SimulatedSlices(2, 2, schedule="lose:1@13,restore:1@+0.3") as sim:
        state = train(
            FINAL_STEP, snapshot_interval=5, devices_per_slice=2, faults={}, record=record,
            minimum_slice_count=None,
        )

        first, (slices, resume_step) = record["attempts"]
        assert first == (2, 0)
        assert slices == 2  # waited for the slice instead of carrying on without it
        # The newest snapshot that completed: Orbax skips a save while one is in flight and
        # drops one whose transfer the loss interrupted, so on a busy machine it may be none
        # (a fresh start at step 0); the data are exactly once either way (below).
        assert resume_step in (0, 1, 6, 11)
        assert record["scale_ups"] == []
        assert sim.lost == frozenset()
        assert int(state["total"]) == sum(range(DATASET_SIZE))
        np.testing.assert_array_equal(np.asarray(state["seen"]), np.ones(DATASET_SIZE, np.int32))
