"""A loop checkpointing as MaxText's pre-training program does, through Orbax v1's ``training.Checkpointer``.

Schedules: lose:1@4,restore:1@7; lose:1@4,lose:2@6,restore:1@8,restore:2@9; hang:1@4,lose:1@+3,restore:1@7; lose:1@4,restore:1@+3; preempt@5; kill@4

One ``Manager``, made once; inside ``elastic_retry`` each attempt makes its own
``ocp.v1.training.Checkpointer`` over the same persistent directory (MaxText makes its
checkpoint manager per attempt), loads the newest committed step with
``load_checkpointables(step, {"items": abstract})`` and goes on from the step after it, and
every 2 steps requests ``save_checkpointables_async(step, {"items": state})`` without
waiting for the commit (MaxText's ``async_checkpointing``). Each step's batch comes from a
jitted synthetic-data generator dispatched before the step (MaxText's
``raw_generate_synthetic_data``). Step numbers are MaxText's: the checkpoint of step ``N``
holds the state after steps ``0..N``. A returned slice is taken up by
``ScaleUpSignalError`` after waiting for the saves in flight; on SIGTERM it saves the current
step at the next boundary, waits for the commit and exits 143. It imports nothing of
elastic_dew.

    python maxtext_checkpointing.py [--steps N] [--checkpoints DIR] [--all-slices] [--by-path]
                                    [--mistake restored_nothing]

``--by-path``: load by the step's path instead (``ocp.v1.load_checkpointables(path, ...)``).
``--all-slices``: pause-resume (``minimum_slice_count=None``, MaxText's
``elastic_min_slice_count=-1``). ``--mistake restored_nothing``: the one mistake it makes on
request, for the diagnosis's tests: it never loads, each attempt starts from a fresh state
although checkpoints were committed. Prints ``done at step N`` at the end.
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

FEATURES = 16
HIDDEN = 64
BATCH = 8
EVERY = 2


@jax.jit
def raw_generate_synthetic_data(data, step):
    """A batch from the synthetic tokens made once per attempt (MaxText's generator takes
    them and returns the step's batch)."""
    return data[:, :-1] * (1.0 + 0.01 * step)


@jax.jit
def train_step(state, batch):
    def loss_fn(w):
        return jnp.mean(((batch @ w).sum(axis=1) - batch.sum(axis=1)) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(state["w"])
    return {"w": state["w"] - 0.01 * grad, "step": state["step"] + 1}, loss


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoints", default="checkpoints-maxtext-shape")
    parser.add_argument("--all-slices", action="store_true")
    parser.add_argument("--by-path", action="store_true")
    parser.add_argument("--mistake", choices=["restored_nothing"])
    args = parser.parse_args(argv)
    manager = pw_manager.Manager()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # checkpoint at the next boundary

    @manager.elastic_retry(minimum_slice_count=None if args.all_slices else 1, poll_interval=0.05, timeout=60)
    def train():
        checkpointer = ocp.v1.training.Checkpointer(  # per attempt, over the same directory
            os.path.abspath(args.checkpoints),
            save_decision_policy=ocp.v1.training.save_decision_policies.FixedIntervalPolicy(EVERY))
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices).reshape(manager.active_slice_count, -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        abstract = {"w": jax.ShapeDtypeStruct((FEATURES, HIDDEN), jnp.float32, sharding=replicated),
                    "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
        try:
            latest = None if args.mistake == "restored_nothing" else checkpointer.latest
            if latest is not None:
                items = (ocp.v1.load_checkpointables(latest.path, {"items": abstract}) if args.by_path
                         else checkpointer.load_checkpointables(latest.step, {"items": abstract}))
                state = items["items"]
                step = latest.step + 1
            else:
                state = jax.device_put({"w": np.zeros((FEATURES, HIDDEN), np.float32), "step": np.int32(0)},
                                       replicated)
                step = 0
            rng = np.random.default_rng(0)
            data = jax.device_put(rng.normal(size=(BATCH, FEATURES + 1)).astype(np.float32), replicated)
            while step < args.steps:
                batch = raw_generate_synthetic_data(data, step)
                state, loss = train_step(state, batch)
                float(loss)  # the read where a lost slice surfaces
                if step % EVERY == 0 or stop:
                    try:
                        checkpointer.save_checkpointables_async(step, {"items": state}, force=bool(stop))
                    except FileExistsError:  # an earlier attempt's save of this step committed (MaxText's way)
                        pass
                if stop:
                    checkpointer.wait()
                    sys.exit(143)
                if manager.available_inactive_slices:
                    checkpointer.wait()
                    raise pw_manager.ScaleUpSignalError()
                step += 1
            checkpointer.wait()
        finally:
            checkpointer.close()
        return step

    step = train()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
