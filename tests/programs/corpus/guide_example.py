"""The resilience guide's example loop, completed to run: returned slices taken up in place.

Schedules: lose:2@9,restore:2@17; lose:1@4,lose:2@8; hang:1@5,lose:1@+2; preempt@6

One ``Manager`` and one Orbax ``Snapshotter`` made once, outside ``elastic_retry``; each
attempt builds its mesh from the Manager's active slices, loads the newest snapshot (the
state, the step and the data iterator's state), and at a step boundary where a slice is back
adds it to ``active_slice_indices`` in place, builds the new mesh and ``jax.device_put``\\ s
the state onto it, with no new attempt. What the guide leaves out (its model, its data, its
``initialize_training_loop``) is the smallest that runs: least squares on eight features,
Grain's ``ElasticIterator``. It imports nothing of elastic_dew.

    python guide_example.py [--steps N]

Prints ``done at step N`` at the end.
"""

import argparse

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pathwaysutils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import manager

pathwaysutils.initialize()  # before the first JAX call: on Pathways it registers the backend

FEATURES = 8
BATCH = 24  # divides every data-parallel width of 1 to 4 slices of 2 devices


def active_devices(elastic_manager):
    """The devices of the active slices (``Manager.active_devices`` in newer pathwaysutils)."""
    return [d for i in sorted(elastic_manager.active_slice_indices) for d in elastic_manager.slice_to_devices[i]]


def create_mesh(elastic_manager, devices_per_slice):
    device_array = np.asarray(active_devices(elastic_manager)).reshape(
        (elastic_manager.active_slice_count, devices_per_slice))
    return Mesh(device_array, axis_names=("replica", "model"))


def examples():
    rows = np.random.default_rng(0).normal(size=(4096, FEATURES)).astype(np.float32)
    return grain.MapDataset.range(len(rows)).map(lambda i: rows[i])


def initialize_training_loop(mesh):
    """A fresh state on ``mesh``, its abstract form, the jitted step, a data iterator."""
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = NamedSharding(mesh, PartitionSpec(("replica", "model")))
    abstract_state = {"w": jax.ShapeDtypeStruct((FEATURES,), jnp.float32, sharding=replicated)}
    state = jax.device_put({"w": np.zeros(FEATURES, np.float32)}, replicated)

    @jax.jit
    def train_step(state, batch):
        def loss_fn(w):
            return jnp.mean((batch @ w - batch.sum(axis=1)) ** 2)

        return {"w": state["w"] - 0.01 * jax.grad(loss_fn)(state["w"])}

    def jitted_train_step(state, batch):
        return train_step(state, jax.device_put(batch, rows))

    data_iterator = grain.experimental.ElasticIterator(examples(), BATCH, grain.sharding.ShardOptions(0, 1))
    return state, abstract_state, jitted_train_step, data_iterator


def train(final_step, snapshot_interval, devices_per_slice):
    elastic_manager = manager.Manager()
    snapshotter = ocp.v1.training.pathways.Snapshotter(replica_axis_index=0)

    @elastic_manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=60,
                                   retry_policy=manager.ElasticRetryLimit(max_attempts=10))
    def run_training_loop():
        mesh = create_mesh(elastic_manager, devices_per_slice)
        state, abstract_state, jitted_train_step, data_iterator = initialize_training_loop(mesh)
        step = 0

        # Restore from the latest in-memory snapshot after a slice failure.
        if snapshotter.latest is not None:
            snapshotter.join()
            restored = snapshotter.load({"state": abstract_state, "step": step,
                                         "iterator_state": data_iterator.get_state()})
            state = restored["state"]
            step = int(restored["step"]) + 1
            data_iterator.set_state(restored["iterator_state"])

        while step < final_step:
            batch = next(data_iterator)
            state = jitted_train_step(state, batch)
            float(state["w"][0])  # the step's read: where a lost slice surfaces

            if step % snapshot_interval == 0:
                snapshotter.save(step, {"state": state, "step": step, "iterator_state": data_iterator.get_state()})

            # If replacement slices are healthy, reinitialize and place state onto the new mesh.
            if elastic_manager.available_inactive_slices:
                elastic_manager.active_slice_indices |= elastic_manager.available_inactive_slices
                mesh = create_mesh(elastic_manager, devices_per_slice)
                iterator_state = data_iterator.get_state()
                _, abstract_state, jitted_train_step, data_iterator = initialize_training_loop(mesh)
                data_iterator.set_state(iterator_state)
                state_shardings = jax.tree.map(lambda x: x.sharding, abstract_state)
                state = jax.device_put(state, state_shardings)

            step += 1

        return step

    step = run_training_loop()
    snapshotter.join()
    return step


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args(argv)
    devices_per_slice = len(jax.devices()) // len({getattr(d, "slice_index", 0) for d in jax.devices()})
    step = train(args.steps, 1, devices_per_slice)
    print(f"done at step {step}", flush=True)
    return step


if __name__ == "__main__":
    main()
