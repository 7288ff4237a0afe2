"""Tier 1: Orbax Snapshotter snapshots on the 8-CPU-device mesh, and the choice across tiers."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew.elastic.state import Checkpoints, Snapshots, newest

AXES = ("replica", "data", "model")


def mesh_of(replicas: int) -> Mesh:
    devices = np.array(jax.devices()[: replicas * 2]).reshape(replicas, 2, 1)
    return Mesh(devices, AXES)


def state_on(mesh: Mesh) -> dict:
    params = jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4)
    return {
        "params": jax.device_put(params, NamedSharding(mesh, P("data", None))),
        "opt": {"mu": jax.device_put(params * 0.5, NamedSharding(mesh, P(None, "data")))},
        "rng": jax.device_put(jax.random.key_data(jax.random.key(7)), NamedSharding(mesh, P())),
    }


def abstract_on(state: dict, mesh: Mesh) -> dict:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, x.sharding.spec)),
        state,
    )


def test_a_snapshot_of_four_replicas_loads_onto_three_with_equal_values_and_its_meta():
    four, three = mesh_of(4), mesh_of(3)
    state = state_on(four)
    meta = {"step": 12, "data": {"global_next_index": 384, "dataset_length": 1000}}
    snapshots = Snapshots(replica_axis_index=0)

    assert snapshots.save(12, state, meta, four) is True
    assert snapshots.latest_step() == 12

    loaded, loaded_meta, step = snapshots.load(abstract_on(state, three))
    assert step == 12
    assert loaded_meta == meta
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(state)):
        assert got.sharding.mesh == three
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert loaded["params"].sharding.spec == P("data", None)


def test_single_device_arrays_and_typed_keys_are_replicated_onto_the_mesh_before_saving():
    mesh = mesh_of(4)
    key = jax.random.key(3)  # committed to one device
    counter = jnp.asarray(5, dtype=jnp.int32)
    assert len(counter.sharding.device_set) == 1
    snapshots = Snapshots()

    assert snapshots.save(2, {"key": key, "counter": counter}, {"step": 2}, mesh)
    abstract = {
        "key": jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=NamedSharding(mesh_of(2), P())),
        "counter": jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh_of(2), P())),
    }
    loaded, _, _ = snapshots.load(abstract)
    assert int(loaded["counter"]) == 5
    assert jax.dtypes.issubdtype(loaded["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(loaded["key"]), jax.random.key_data(key))


def test_an_array_partitioned_along_the_replica_axis_is_refused_before_anything_is_saved():
    mesh = mesh_of(4)
    sharded = jax.device_put(jnp.zeros((8, 4)), NamedSharding(mesh, P("replica", None)))
    snapshots = Snapshots()
    with pytest.raises(ValueError, match=r"\['w'\].*partitioned along the replica axis 'replica'"):
        snapshots.save(1, {"w": sharded}, {"step": 1}, mesh)
    assert snapshots.requested == 0
    assert snapshots.latest_step() is None


def test_meta_that_is_not_json_is_refused_and_nothing_is_pickled():
    mesh = mesh_of(4)
    snapshots = Snapshots()
    with pytest.raises(ValueError, match="JSON"):
        snapshots.save(1, state_on(mesh), {"step": 1, "data": object()}, mesh)
    assert snapshots.requested == 0


def test_a_save_while_the_previous_one_is_in_flight_is_counted_as_requested_but_not_taken():
    """The state's computation blocks on an event, so Orbax's transfer stays in flight."""
    mesh = mesh_of(4)
    release = threading.Event()

    def held(x):
        release.wait(30)
        return x

    slow = jax.jit(
        lambda a: jax.pure_callback(held, jax.ShapeDtypeStruct(a.shape, a.dtype), a) + 1,
        out_shardings=NamedSharding(mesh, P()),
    )
    x = slow(jax.device_put(jnp.zeros(8), NamedSharding(mesh, P())))
    snapshots = Snapshots()
    try:
        results = [snapshots.save(step, {"x": x}, {"step": step}, mesh) for step in (1, 2, 3)]
    finally:
        release.set()

    assert results[0] is True
    assert results[2] is False  # the first transfer is blocked, the second is queued
    assert snapshots.requested == 3
    assert snapshots.taken == sum(results) < 3
    last_taken = max(step for step, took in zip((1, 2, 3), results) if took)
    assert snapshots.latest_step() == last_taken
    loaded, meta, step = snapshots.load({"x": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh, P()))})
    assert step == last_taken and meta == {"step": last_taken}
    np.testing.assert_array_equal(np.asarray(loaded["x"]), np.ones(8))


def test_loading_before_any_snapshot_completed_is_a_clear_error():
    snapshots = Snapshots()
    assert snapshots.latest_step() is None
    with pytest.raises(RuntimeError, match="no snapshot"):
        snapshots.load({})


def test_resume_takes_the_newest_tier_and_a_tie_goes_to_the_snapshot(tmp_path):
    mesh = mesh_of(4)
    state = state_on(mesh)
    snapshots = Snapshots()
    checkpoints = Checkpoints(str(tmp_path / "ckpt"))
    try:
        assert newest(None, None) == ("fresh", None)
        assert newest(snapshots, checkpoints) == ("fresh", None)

        checkpoints.save(5, state, {"step": 5})
        checkpoints.wait()
        assert newest(snapshots, checkpoints) == ("checkpoint", 5)

        snapshots.save(5, state, {"step": 5}, mesh)
        assert newest(snapshots, checkpoints) == ("snapshot", 5)

        snapshots.save(6, state, {"step": 6}, mesh)
        assert newest(snapshots, None) == ("snapshot", 6)

        checkpoints.save(8, state, {"step": 8})
        checkpoints.wait()
        assert newest(snapshots, checkpoints) == ("checkpoint", 8)
    finally:
        checkpoints.close()
