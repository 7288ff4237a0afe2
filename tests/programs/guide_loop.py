"""A training loop written as pathwaysutils' resilience guide shows it, with one mistake on request.

``pathwaysutils.initialize()`` first; one ``Manager`` and one Orbax ``Snapshotter``, made once; ``elastic_retry`` around the
training; each attempt builds its mesh from the Manager's active slices, loads the newest
snapshot, puts Grain's ``ElasticIterator`` at its step, snapshots every step, and raises
``ScaleUpSignalError`` at a step boundary once a slice is back. With ``--checkpoints DIR``
it also writes an Orbax checkpoint every 5 steps and one at SIGTERM (then exits 143), and
resumes from the newest one. It imports nothing of elastic_dew: ``elastic-dew simulate``
runs it as it is, and the suite's in-process tests call :func:`main`.

    python guide_loop.py [--steps N] [--checkpoints DIR] [--mistake NAME]

``--mistake`` makes one of the mistakes ``elastic-dew simulate`` names (the name of the
problem it is diagnosed as); ``case1`` makes the three of the issue's first case at once.
Prints ``done at step N`` at the end.
"""

import argparse
import signal
import sys

import grain
import jax
import pathwaysutils
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter
from pathwaysutils.elastic import manager as pw_manager

BATCH = 24  # examples per step: divides every data-parallel width of 1 to 4 slices of 2 devices
FEATURES = 8
MISTAKES = ("restored_nothing", "recreated_per_attempt", "held_across_attempts", "mesh_on_lost_slice",
            "no_save_at_preemption", "data_not_rewound", "returned_slice_ignored", "batch_not_divisible",
            "not_initialized", "case1")
#: The batch_not_divisible mistake: divides 4 slices of 2 devices, not the 3 left after a loss.
INDIVISIBLE_BATCH = 16

KEPT = []  # the held_across_attempts mistake: every step's state, at module level


@jax.jit
def train_step(state, batch):
    """One step of least squares towards w = 1 on the batch's rows."""

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
    parser.add_argument("--checkpoints")
    parser.add_argument("--mistake", choices=MISTAKES)
    args = parser.parse_args(argv)
    mistakes = set()
    if args.mistake == "case1":
        mistakes = {"recreated_per_attempt", "held_across_attempts", "returned_slice_ignored"}
    elif args.mistake:
        mistakes = {args.mistake}

    if "not_initialized" not in mistakes:
        pathwaysutils.initialize()  # before the first JAX call: on Pathways it registers the backend
    batch_size = INDIVISIBLE_BATCH if "batch_not_divisible" in mistakes else BATCH
    manager = pw_manager.Manager()
    snapshotter = Snapshotter(replica_axis_index=0)
    data = grain.experimental.ElasticIterator(examples(), batch_size, grain.sharding.ShardOptions(0, 1))
    checkpoints = None
    stop = []
    if args.checkpoints:
        import orbax.checkpoint as ocp

        checkpoints = ocp.CheckpointManager(args.checkpoints, options=ocp.CheckpointManagerOptions(
            save_interval_steps=5, max_to_keep=2))
        if "no_save_at_preemption" not in mistakes:
            signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # checkpoint at the next boundary

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60)
    def train():
        snap = Snapshotter(replica_axis_index=0) if "recreated_per_attempt" in mistakes else snapshotter
        if "mesh_on_lost_slice" in mistakes:
            devices = jax.devices()  # every slice of the allocation, lost ones included
        else:
            devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        slices = len({d.slice_index for d in devices})
        mesh = Mesh(np.asarray(devices).reshape(slices, -1), ("replica", "data"))
        replicated = NamedSharding(mesh, PartitionSpec())
        rows = NamedSharding(mesh, PartitionSpec(("replica", "data")))
        abstract = {"w": jax.ShapeDtypeStruct((FEATURES,), jnp.float32, sharding=replicated),
                    "step": jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)}
        if snap.latest is not None and "restored_nothing" not in mistakes:
            state = snap.load(abstract)
        elif checkpoints is not None and checkpoints.latest_step() is not None:
            import orbax.checkpoint as ocp

            state = checkpoints.restore(checkpoints.latest_step(), args=ocp.args.StandardRestore(abstract))
        else:
            state = jax.device_put({"w": np.zeros(FEATURES, np.float32), "step": np.int32(0)}, replicated)
        step = int(state["step"])
        if "data_not_rewound" not in mistakes:
            data.set_state({"global_next_index": step * batch_size})  # the data at the restored step
        while step < args.steps:
            batch = jax.device_put(next(data), rows)
            state, loss = train_step(state, batch)
            float(loss)  # the read where a lost slice surfaces
            step += 1
            snap.save(step, state)
            if "held_across_attempts" in mistakes:
                KEPT.append(state)
            if checkpoints is not None:
                import orbax.checkpoint as ocp

                checkpoints.save(step, args=ocp.args.StandardSave(state), force=bool(stop))
                if stop:
                    checkpoints.wait_until_finished()
                    sys.exit(143)
            if "returned_slice_ignored" not in mistakes and manager.available_inactive_slices:
                snap.join()
                raise pw_manager.ScaleUpSignalError()
        snap.join()
        return step

    step = train()
    if checkpoints is not None:
        checkpoints.wait_until_finished()
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
