"""A guide-shaped loop whose whole state is two float32 scalars, started as a Pathways program starts.

Schedules: lose:1@6,restore:1@12; hang:1@5,lose:1@+2; suspend:1@5,wake:1@+1; preempt@6

``pathwaysutils.initialize()`` first; one ``Manager`` and one Orbax ``Snapshotter`` made
once; ``elastic_retry`` around the training; each attempt builds its mesh from the Manager's
active slices, loads the newest snapshot, puts Grain's ``ElasticIterator`` at its step,
trains a line ``y = w * x + b`` (8 bytes of state) and snapshots every step, and raises
``ScaleUpSignalError`` at a step boundary once a slice is back. It imports nothing of
elastic_dew: its steps are found by the step rule through either boundary. Its 24 steps
leave a dozen after the return at step 12 for the ``Manager``'s monitor to find the slice back
(through the proxy it polls, as on Pathways).

    python boundary_two_scalars.py [--steps N]

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

BATCH = 24  # divides every data-parallel width of 1 to 4 slices of 2 devices


@jax.jit
def train_step(state, batch):
    """One step of least squares towards w = 2, b = 1 on the batch's points."""

    def loss_fn(params):
        return jnp.mean((params["w"] * batch + params["b"] - (2.0 * batch + 1.0)) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(state)
    return {"w": state["w"] - 0.1 * grad["w"], "b": state["b"] - 0.1 * grad["b"]}, loss


def examples():
    points = np.random.default_rng(0).normal(size=4096).astype(np.float32)
    return grain.MapDataset.range(len(points)).map(lambda i: points[i])


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
        abstract = {"w": jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated),
                    "b": jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)}
        if snapshotter.latest is not None:
            step = snapshotter.latest.step
            state = snapshotter.load(abstract)
        else:
            step = 0
            state = jax.device_put({"w": np.float32(0), "b": np.float32(0)}, replicated)
        data.set_state({"global_next_index": step * BATCH})  # the data at the restored step
        while step < args.steps:
            state, loss = train_step(state, jax.device_put(next(data), rows))
            float(loss)  # the read where a lost slice surfaces
            step += 1
            snapshotter.save(step, state)
            if manager.available_inactive_slices and step < args.steps:
                snapshotter.join()
                raise pw_manager.ScaleUpSignalError()
        snapshotter.join()
        return step

    step = train()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
