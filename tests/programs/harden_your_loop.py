"""The resilience guide's pathwaysutils loop, hardened with elastic_dew's pieces (docs/harden-your-loop.md).

Your own ``Manager``, ``Snapshotter``, ``CheckpointManager`` and ``ElasticIterator``, your own
loop; each ``# +`` line is one piece, usable alone:

    python harden_your_loop.py --checkpoints DIR [--steps N] [--step-timeout S] [--probe-timeout S]
                               [--without PIECE,...]

``--without`` leaves pieces out (``health``, ``deadline``, ``preemption_save``) to measure
what each buys under ``elastic-dew simulate``. Prints ``done at step N`` at the end.
"""

import argparse
import sys
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter
from pathwaysutils.elastic import manager as pw_manager

from elastic_dew.elastic import StepDeadline, build_mesh  # +
from elastic_dew.your_loop import install_health_checker, restore_checkpoint, save_at_preemption, save_checkpoint  # +
from elastic_dew.runtime import PREEMPTED_EXIT, PreemptionNotice  # +

BATCH = 24  # examples per step: divides every data-parallel width of 1 to 4 slices of 2 devices
FEATURES = 8


@jax.jit
def train_step(state, batch):
    """One step of least squares towards w = 1 on the batch's rows."""

    def loss_fn(w):
        return jnp.mean((batch @ w - batch.sum(axis=1)) ** 2)

    loss, grad = jax.value_and_grad(loss_fn)(state["w"])
    return {"w": state["w"] - 0.01 * grad, "step": state["step"] + 1}, loss


def examples():
    rows = np.random.default_rng(0).normal(size=(4096, FEATURES)).astype(np.float32)
    return grain.MapDataset.source(rows)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--step-timeout", type=float, default=None)
    parser.add_argument("--probe-timeout", type=float, default=None)
    parser.add_argument("--without", default="")
    args = parser.parse_args(argv)
    without = set(filter(None, args.without.split(",")))

    if "health" not in without:
        install_health_checker(args.probe_timeout)  # + slice checks compiled once, a hung slice's bounded
    manager = pw_manager.Manager()
    snapshotter = Snapshotter(replica_axis_index=0)
    data = grain.experimental.ElasticIterator(examples(), BATCH, grain.sharding.ShardOptions(0, 1))
    start = data.get_state()
    checkpoints = ocp.CheckpointManager(args.checkpoints, options=ocp.CheckpointManagerOptions(
        save_interval_steps=5, max_to_keep=2))
    deadline = StepDeadline(args.step_timeout)  # + a read that does not finish is a slice loss
    notice = PreemptionNotice()  # + SIGTERM noted, acted on at the next step boundary

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def train():
        mesh = build_mesh(manager, axes=("replica", "data"))  # + the active slices, your axes
        replicated = NamedSharding(mesh, PartitionSpec())
        rows = NamedSharding(mesh, PartitionSpec(("replica", "data")))
        abstract = {"w": jax.ShapeDtypeStruct((FEATURES,), jnp.float32, sharding=replicated),
                    "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
        if snapshotter.latest is not None:
            restored = snapshotter.load({"state": abstract, "data": data.get_state()})
            state, position = restored["state"], restored["data"]
        elif (found := restore_checkpoint(checkpoints, abstract)) is not None:  # + bounded, with the data position
            state, position, _ = found
        else:
            state = jax.device_put({"w": np.zeros(FEATURES, np.float32), "step": np.int32(0)}, replicated)
            position = start
        data.set_state(position)
        step = int(state["step"])
        while step < args.steps:
            began = time.monotonic()
            batch = jax.device_put(next(data), rows)
            state, loss = train_step(state, batch)
            if "deadline" in without:
                float(loss)
            else:
                deadline.read(lambda: float(loss), step + 1, loss.is_ready)  # +
                deadline.observe(time.monotonic() - began)  # + sizes the automatic bound
            step += 1
            snapshotter.save(step, {"state": state, "data": data.get_state()})
            if notice.reached(step):
                if "preemption_save" not in without:
                    save_at_preemption(checkpoints, step, state, data=data.get_state(),  # +
                                       received=notice.received)
                sys.exit(PREEMPTED_EXIT)
            save_checkpoint(checkpoints, step, state, data=data.get_state())  # + bounded
            if manager.available_inactive_slices:
                snapshotter.join()
                raise pw_manager.ScaleUpSignalError()
        snapshotter.join()
        return step

    step = train()
    checkpoints.wait_until_finished()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
