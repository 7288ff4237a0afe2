"""A guide-shaped loop that takes a returned slice up by ``ScaleUpSignalError``.

Schedules: lose:2@9,restore:2@17; lose:1@4,lose:2@8; hang:1@5,lose:1@+2; preempt@6

One ``Manager`` and one Orbax ``Snapshotter`` made once; ``elastic_retry`` around the
training; each attempt builds its mesh from the Manager's active slices, loads the newest
snapshot, puts Grain's ``ElasticIterator`` at its step, snapshots every step, and raises
``ScaleUpSignalError`` at a step boundary once a slice is back, so that ``elastic_retry``
starts an attempt with it. It imports nothing of elastic_dew.

    python scale_up_signal.py [--steps N]

Prints ``done at step N`` at the end.
"""

import argparse

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pathwaysutils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter
from pathwaysutils.elastic import manager as pw_manager

pathwaysutils.initialize()  # before the first JAX call: on Pathways it registers the backend

FEATURES = 8
BATCH = 24


@jax.jit
def train_step(state, batch):
    def loss_fn(w):
        return jnp.mean((batch @ w - batch.sum(axis=1)) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(state["w"])
    return {"w": state["w"] - 0.01 * grad, "step": state["step"] + 1}, loss


def examples():
    rows = np.random.default_rng(0).normal(size=(4096, FEATURES)).astype(np.float32)
    return grain.MapDataset.range(len(rows)).map(lambda i: rows[i])


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args(argv)
    manager = pw_manager.Manager()
    snapshotter = Snapshotter(replica_axis_index=0)
    data = grain.experimental.ElasticIterator(examples(), BATCH, grain.sharding.ShardOptions(0, 1))

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def train():
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices).reshape(manager.active_slice_count, -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        rows = NamedSharding(mesh, PartitionSpec(("replica", "data")))
        abstract = {"w": jax.ShapeDtypeStruct((FEATURES,), jnp.float32, sharding=replicated),
                    "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
        if snapshotter.latest is not None:
            snapshotter.join()
            state = snapshotter.load(abstract)
        else:
            state = jax.device_put({"w": np.zeros(FEATURES, np.float32), "step": np.int32(0)}, replicated)
        step = int(state["step"])
        data.set_state({"global_next_index": step * BATCH})  # the data at the restored step
        while step < args.steps:
            state, loss = train_step(state, jax.device_put(next(data), rows))
            float(loss)  # the read where a lost slice surfaces
            step += 1
            snapshotter.save(step, state)
            if manager.available_inactive_slices:
                snapshotter.join()
                raise pw_manager.ScaleUpSignalError()
        snapshotter.join()
        return step

    step = train()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
