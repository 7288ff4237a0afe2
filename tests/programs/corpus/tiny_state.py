"""A guide-shaped loop that calls ``pathwaysutils.initialize()`` and carries tiny state.

Schedules: lose:1@6,restore:1@12; lose:1@4,lose:2@8; hang:1@5,lose:1@+2; preempt@6

``pathwaysutils.initialize()`` first, as a Pathways program starts; a state of two float32
scalars (8 bytes); one ``Manager`` and one Orbax ``Snapshotter`` made once; each attempt
builds its mesh from the Manager's active slices, loads the newest snapshot and snapshots
every step, and raises ``ScaleUpSignalError`` at a step boundary once a slice is back. It
imports nothing of elastic_dew.

    python tiny_state.py [--steps N]

Prints ``done at step N`` at the end.
"""

import argparse

import pathwaysutils

pathwaysutils.initialize()

import jax  # noqa: E402 - after initialize(), as Pathways programs do
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter  # noqa: E402
from pathwaysutils.elastic import manager as pw_manager  # noqa: E402


@jax.jit
def train_step(state):
    """Two scalars: ``a`` moves towards 10, ``b`` counts the steps."""
    return {"a": state["a"] + 0.1 * (10.0 - state["a"]), "b": state["b"] + 1.0}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args(argv)
    manager = pw_manager.Manager()
    snapshotter = Snapshotter(replica_axis_index=0)

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def train():
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices).reshape(manager.active_slice_count, -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        abstract = {name: jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated) for name in ("a", "b")}
        if snapshotter.latest is not None:
            snapshotter.join()
            state = snapshotter.load(abstract)
        else:
            state = jax.device_put({"a": np.float32(0), "b": np.float32(0)}, replicated)
        step = int(state["b"])
        while step < args.steps:
            state = train_step(state)
            step = int(state["b"])  # the read where a lost slice surfaces
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
