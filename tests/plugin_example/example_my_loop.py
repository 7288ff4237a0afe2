"""A user's own elastic loop, tested with elastic_dew's pytest plugin (docs/testing.md).

Written as a user of pathwaysutils writes it; it imports nothing of elastic_dew. The
``slices`` marker and the ``simulated_slices`` fixture come from the plugin, which
elastic-dew installs; ``pytest --simulated-devices 4`` gives JAX its CPU devices first.
"""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import manager

DATASET, BATCH, STEPS = 64, 4, 16


def train(elastic_manager, snapshotter, attempts):
    """The guide's loop: a mesh over the active slices, restore the newest in-memory
    snapshot, step, snapshot every 2 steps, scale up when a slice comes back."""

    @elastic_manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def loop():
        slices = sorted(elastic_manager.active_slice_indices)
        devices = [d for s in slices for d in elastic_manager.slice_to_devices[s]]
        mesh = Mesh(np.asarray(devices).reshape(len(slices), -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        state = {"seen": jax.device_put(jnp.zeros(DATASET, jnp.int32), replicated)}
        data = grain.experimental.ElasticIterator(
            grain.MapDataset.range(DATASET).map(np.int32), global_batch_size=BATCH,
            shard_options=grain.sharding.ShardOptions(shard_index=0, shard_count=1),
        )
        train_step = jax.jit(lambda state, batch: {"seen": state["seen"].at[batch].add(1)},
                             out_shardings=replicated)
        step = 0
        if snapshotter.latest is not None:
            snapshotter.join()
            abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
            restored = snapshotter.load({"state": abstract, "step": 0, "data": data.get_state()})
            state, step = restored["state"], int(restored["step"]) + 1
            data.set_state(restored["data"])
        attempts.append(len(slices))
        while step < STEPS:
            state = train_step(state, jax.device_put(next(data), NamedSharding(mesh, PartitionSpec("replica"))))
            jax.block_until_ready(state)  # a lost slice surfaces here
            if step % 2 == 0:
                snapshotter.save(step, {"state": state, "step": step, "data": data.get_state()})
            if elastic_manager.available_inactive_slices:
                snapshotter.join()
                raise manager.ScaleUpSignalError()  # the next attempt takes every healthy slice
            step += 1
        return state

    return loop()


@pytest.mark.slices(2, 2, schedule="lose:1@6,restore:1@9")
def test_my_loop_survives_a_lost_slice_and_scales_back_up(simulated_slices):
    attempts = []
    state = train(manager.Manager(), ocp.v1.training.pathways.Snapshotter(replica_axis_index=0), attempts)
    assert attempts == [2, 1, 2]  # lost slice 1, carried on with one, took it back
    assert np.asarray(state["seen"]).tolist() == [1] * DATASET  # every example exactly once
