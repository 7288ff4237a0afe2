"""A guide-shaped loop that pauses until every slice is back, started as a Pathways program starts.

Schedules: lose:2@9,restore:2@+3

``pathwaysutils.initialize()`` first; one ``Manager`` and one Orbax ``Snapshotter`` made
once; ``elastic_retry`` with ``minimum_slice_count=None`` around the training, so that after
a loss it waits for every slice of the allocation (a return keyed to time fires while it
waits); each attempt builds its mesh from the Manager's active slices, loads the newest
snapshot, puts Grain's ``ElasticIterator`` at its step and snapshots every step. It imports
nothing of elastic_dew.

    python boundary_pause_resume.py [--steps N]

Prints ``done at step N`` at the end.
"""

import argparse

import pathwaysutils

pathwaysutils.initialize()

import grain  # noqa: E402 - after initialize(), as Pathways programs do
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter  # noqa: E402
from pathwaysutils.elastic import manager as pw_manager  # noqa: E402

FEATURES = 8
BATCH = 24


@jax.jit
def train_step(state, batch):
    def loss_fn(w):
        return jnp.mean((batch @ w - batch.sum(axis=1)) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(state["w"])
    return {"w": state["w"] - 0.01 * grad}, loss


def examples():
    rows = np.random.default_rng(0).normal(size=(4096, FEATURES)).astype(np.float32)
    return grain.MapDataset.range(len(rows)).map(lambda i: rows[i])


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args(argv)
    manager = pw_manager.Manager()
    snapshotter = Snapshotter(replica_axis_index=0)
    data = grain.experimental.ElasticIterator(examples(), BATCH, grain.sharding.ShardOptions(0, 1))

    @manager.elastic_retry(minimum_slice_count=None, poll_interval=0.05, timeout=60)
    def train():
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices).reshape(manager.active_slice_count, -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        rows = NamedSharding(mesh, PartitionSpec(("replica", "data")))
        abstract = {"w": jax.ShapeDtypeStruct((FEATURES,), jnp.float32, sharding=replicated)}
        if snapshotter.latest is not None:
            snapshotter.join()
            step = snapshotter.latest.step
            state = snapshotter.load(abstract)
        else:
            step = 0
            state = jax.device_put({"w": np.zeros(FEATURES, np.float32)}, replicated)
        data.set_state({"global_next_index": step * BATCH})  # the data at the restored step
        while step < args.steps:
            state, loss = train_step(state, jax.device_put(next(data), rows))
            float(loss)  # the read where a lost slice surfaces
            step += 1
            snapshotter.save(step, state)
        snapshotter.join()
        return step

    step = train()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
