"""A loop that restores from Orbax's v1 ``training.Checkpointer``, made per attempt.

Schedules: lose:1@5; lose:1@4,lose:2@8

One ``Manager``, made once; inside ``elastic_retry`` each attempt makes an
``ocp.v1.training.Checkpointer`` over the same persistent directory, loads the newest
committed step (``checkpointer.load``, or with ``--by-path``
``ocp.v1.load(path)`` of its directory), and checkpoints every 2 steps, waiting for
each commit. It imports nothing of elastic_dew.

    python orbax_v1_checkpointer.py [--steps N] [--checkpoints DIR] [--by-path]

Prints ``done at step N`` at the end.
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pathwaysutils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import manager as pw_manager

pathwaysutils.initialize()  # before the first JAX call: on Pathways it registers the backend


@jax.jit
def train_step(state):
    return {"w": state["w"] * 0.5 + 1.0, "step": state["step"] + 1}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoints", default="checkpoints-orbax-v1")
    parser.add_argument("--by-path", action="store_true")
    args = parser.parse_args(argv)
    manager = pw_manager.Manager()

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def train():
        checkpointer = ocp.v1.training.Checkpointer(os.path.abspath(args.checkpoints))
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices).reshape(manager.active_slice_count, -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        abstract = {"w": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=replicated),
                    "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
        try:
            latest = checkpointer.latest
            if latest is None:
                state = jax.device_put({"w": np.zeros(8, np.float32), "step": np.int32(0)}, replicated)
            elif args.by_path:
                state = ocp.v1.load(str(latest.path), abstract)
            else:
                state = checkpointer.load(None, abstract)
            step = int(state["step"])
            while step < args.steps:
                state = train_step(state)
                step = int(state["step"])  # the read where a lost slice surfaces
                if step % 2 == 0:
                    checkpointer.save(step, state)
                    checkpointer.wait()
                if manager.available_inactive_slices:
                    raise pw_manager.ScaleUpSignalError()
        finally:
            checkpointer.close()
        return step

    step = train()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
