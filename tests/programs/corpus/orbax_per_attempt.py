"""A loop that restores from an Orbax ``CheckpointManager`` made per attempt (MaxText's shape).

Schedules: lose:2@9,restore:2@17; lose:1@4,lose:2@8; hang:1@5,lose:1@+2; preempt@6

One ``Manager``, made once; inside ``elastic_retry`` each attempt makes its own
``CheckpointManager`` over the same persistent directory (as MaxText does), restores the
newest committed step, and checkpoints every 2 steps. On SIGTERM it saves the current step
at the next step boundary, waits for the commit and exits 143. A returned slice is taken up
by ``ScaleUpSignalError`` at a step boundary. It imports nothing of elastic_dew.

    python orbax_per_attempt.py [--steps N] [--checkpoints DIR]

Prints ``done at step N`` at the end.
"""

import argparse
import os
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pathwaysutils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
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


def batch_at(step):
    """The examples of ``step``: a pure function of the step, so a restore needs no data state."""
    return np.random.default_rng(step).normal(size=(BATCH, FEATURES)).astype(np.float32)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--checkpoints", default="checkpoints-orbax-per-attempt")
    args = parser.parse_args(argv)
    manager = pw_manager.Manager()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # checkpoint at the next boundary

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def train():
        checkpoints = ocp.CheckpointManager(  # per attempt, over the same directory
            os.path.abspath(args.checkpoints),
            options=ocp.CheckpointManagerOptions(save_interval_steps=2, max_to_keep=2))
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices).reshape(manager.active_slice_count, -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        rows = NamedSharding(mesh, PartitionSpec(("replica", "data")))
        abstract = {"w": jax.ShapeDtypeStruct((FEATURES,), jnp.float32, sharding=replicated),
                    "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
        if checkpoints.latest_step() is not None:
            state = checkpoints.restore(checkpoints.latest_step(), args=ocp.args.StandardRestore(abstract))
        else:
            state = jax.device_put({"w": np.zeros(FEATURES, np.float32), "step": np.int32(0)}, replicated)
        step = int(state["step"])
        try:
            while step < args.steps:
                state, loss = train_step(state, jax.device_put(batch_at(step), rows))
                float(loss)  # the read where a lost slice surfaces
                step += 1
                back = bool(manager.available_inactive_slices)
                checkpoints.save(step, args=ocp.args.StandardSave(state), force=bool(stop) or back)
                if stop:
                    checkpoints.wait_until_finished()
                    sys.exit(143)
                if back:
                    checkpoints.wait_until_finished()
                    raise pw_manager.ScaleUpSignalError()
            checkpoints.wait_until_finished()
        finally:
            checkpoints.close()
        return step

    step = train()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
