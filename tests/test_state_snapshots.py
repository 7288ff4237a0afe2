"""Tier 1: Orbax Snapshotter snapshots on the 8-CPU-device mesh, and the choice across tiers."""

from __future__ import annotations

import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew.elastic.state.checkpoints import Checkpoints
from elastic_dew.elastic.state.snapshots import Snapshots
from elastic_dew.elastic.state.tiers import Tiers

pytestmark = pytest.mark.libraries  # Orbax's Snapshotter and pathwaysutils' split and concatenate

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
    """The state's computation blocks on an event, so Orbax's transfer stays in flight.

    A lone leaf is not packed (packing needs two or more), so the save only queues
    Orbax's transfer (on CPU, a jitted pack of a leaf whose host callback is
    blocked would itself wait for it on the training thread).
    """
    mesh = mesh_of(4)
    release = threading.Event()

    def held(x):
        release.wait(30)
        return x

    slow = jax.jit(
        lambda a: jax.pure_callback(held, jax.ShapeDtypeStruct(a.shape, a.dtype), a) + 1,
        out_shardings=NamedSharding(mesh, P("data")),
    )
    x = slow(jax.device_put(jnp.zeros(8), NamedSharding(mesh, P("data"))))
    snapshots = Snapshots()
    try:
        results = [snapshots.save(1, {"x": x}, {"step": 1}, mesh)]
        # Orbax's worker takes the first request off its one-slot queue and blocks on it; only
        # then is the second queued and the third skipped (a loaded machine may be slow to start it).
        deadline = time.monotonic() + 20
        while snapshots._snapshotter.busy() and time.monotonic() < deadline:
            time.sleep(0.01)
        results += [snapshots.save(step, {"x": x}, {"step": step}, mesh) for step in (2, 3)]
    finally:
        release.set()

    assert results[0] is True
    assert results[2] is False  # the first transfer is blocked, the second is queued
    assert snapshots.requested == 3
    assert snapshots.taken == sum(results) < 3
    last_taken = max(step for step, took in zip((1, 2, 3), results) if took)
    assert snapshots.latest_step() == last_taken
    loaded, meta, step = snapshots.load({"x": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh, P("data")))})
    assert step == last_taken and meta == {"step": last_taken}
    np.testing.assert_array_equal(np.asarray(loaded["x"]), np.ones(8))


def mixed_state_on(mesh: Mesh) -> dict:
    """A trainer-like state: replicated leaves of several dtypes, a typed key, one model-sharded leaf."""
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    return {
        "params": {
            "w": jax.device_put(rng.standard_normal((6, 5)).astype(np.float32), replicated),
            "b": jax.device_put(rng.standard_normal(5).astype(np.float32), replicated),
            "emb": jax.device_put(rng.standard_normal((3, 4)).astype(jnp.bfloat16), replicated),
            "proj": jax.device_put(rng.standard_normal((4, 8)).astype(np.float32), NamedSharding(mesh, P(None, "model"))),
        },
        "count": jax.device_put(np.int32(41), replicated),
        "mask": jax.device_put(np.array([True, False, True]), replicated),
        "key": jax.device_put(jax.random.key(11), replicated),
        "nan": jax.device_put(np.array([np.nan, -0.0, np.inf], np.float32), replicated),
    }


def model_mesh_of(replicas: int) -> Mesh:
    devices = np.array(jax.devices()[: replicas * 2]).reshape(replicas, 1, 2)
    return Mesh(devices, AXES)


def test_replicated_leaves_are_packed_flat_per_dtype_and_a_sharded_leaf_into_rows_of_its_shards():
    mesh = model_mesh_of(4)
    state = mixed_state_on(mesh)
    snapshots = Snapshots()
    assert snapshots.save(3, state, {"step": 3}, mesh)
    snapshots.join()

    replica = snapshots._snapshotter.newest()[0][0]
    packed = replica["state"]["packed"]
    layout = json.loads(replica["meta"])["packing"]
    flat = [(g, a) for g, a in zip(layout["groups"], packed) if g["kind"] == "flat"]
    assert sorted(g["dtype"] for g, _ in flat) == ["bfloat16", "bool", "float32", "int32", "uint32"]
    assert [a.ndim for _, a in flat] == [1] * 5
    # Each flat group is padded to a multiple of a slice's two devices and split over them:
    # one copy per slice, not one per device.
    assert [a.size for g, a in flat] == [g["padded"] for g, _ in flat]
    assert [g["padded"] for g, _ in flat] == [-(-g["size"] // 2) * 2 for g, _ in flat]
    assert all(a.sharding.shard_shape(a.shape) == (a.size // 2,) for _, a in flat)
    # The model-sharded leaf is packed too, as one row per shard: each device packs its own.
    rows = [(g, a) for g, a in zip(layout["groups"], packed) if g["kind"] == "rows"]
    assert len(rows) == 1 and rows[0][0]["axes"] == ["model"] and rows[0][1].shape == (2, 16)
    assert rows[0][1].sharding.shard_shape((2, 16)) == (1, 16)
    assert replica["state"]["leaves"] == []
    by_path = {e["path"]: e for e in layout["leaves"]}
    assert by_path["['params']['proj']"]["dim"] == 1
    assert by_path["['key']"]["key_impl"] == "threefry2x32"


def test_large_leaves_and_a_lone_small_leaf_are_not_packed_and_still_round_trip(monkeypatch):
    """Packing saves per-leaf dispatch; a large leaf would only pay an extra copy each way."""
    from elastic_dew.elastic.state import packing

    monkeypatch.setattr(packing, "PACK_MAX_BYTES", 64)
    mesh = model_mesh_of(4)
    replicated = NamedSharding(mesh, P())
    state = {
        "big": jax.device_put(np.arange(64, dtype=np.float32), replicated),  # 256 bytes
        "small": jax.device_put(np.arange(4, dtype=np.float32), replicated),
        "tiny": jax.device_put(np.int32(7), replicated),
    }
    snapshots = Snapshots()
    assert snapshots.save(1, state, {"step": 1}, mesh)
    snapshots.join()
    layout = json.loads(snapshots._snapshotter.newest()[0][0]["meta"])["packing"]
    by_path = {e["path"]: e for e in layout["leaves"]}
    assert "group" not in by_path["['big']"]
    assert "group" in by_path["['small']"] and "group" in by_path["['tiny']"]

    lone = {"big": state["big"], "small": state["small"]}  # one small leaf: nothing to gain
    snapshots = Snapshots()
    assert snapshots.save(2, lone, {"step": 2}, mesh)
    snapshots.join()
    layout = json.loads(snapshots._snapshotter.newest()[0][0]["meta"])["packing"]
    assert layout["groups"] == [] and all("group" not in e for e in layout["leaves"])
    smaller = model_mesh_of(2)
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(smaller, P())), lone
    )
    loaded, meta, step = snapshots.load(abstract)
    assert step == 2 and meta == {"step": 2}
    np.testing.assert_array_equal(loaded["big"], np.arange(64, dtype=np.float32))
    np.testing.assert_array_equal(loaded["small"], np.arange(4, dtype=np.float32))


def test_a_packed_snapshot_loads_onto_a_smaller_mesh_bitwise_equal_on_the_target_shardings():
    four, two = model_mesh_of(4), model_mesh_of(2)
    state = mixed_state_on(four)
    meta = {"step": 9, "data": {"global_next_index": 108}}
    snapshots = Snapshots()
    assert snapshots.save(9, state, meta, four)

    # The targets differ from the saved shardings: a replicated leaf lands split along model.
    targets = jax.tree.map(lambda x: NamedSharding(two, x.sharding.spec), state)
    targets["params"]["w"] = NamedSharding(two, P(None, None))
    targets["params"]["emb"] = NamedSharding(two, P(None, "model"))
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, targets)
    loaded, loaded_meta, step = snapshots.load(abstract)

    assert (loaded_meta, step) == (meta, 9)
    assert jax.dtypes.issubdtype(loaded["key"].dtype, jax.dtypes.prng_key)
    flat_loaded = jax.tree_util.tree_leaves_with_path(loaded)
    flat_state = jax.tree_util.tree_leaves(state)
    flat_targets = jax.tree_util.tree_leaves(targets)
    for (path, got), want, target in zip(flat_loaded, flat_state, flat_targets):
        assert got.sharding == target, jax.tree_util.keystr(path)
        assert got.dtype == want.dtype and got.shape == want.shape
        if jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), jax.tree_util.keystr(path)

    # The snapshot was re-split on the smaller mesh, still packed: a second loss is survivable.
    one = model_mesh_of(1)
    again = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(one, P())), abstract)
    reloaded, _, _ = snapshots.load(again)
    np.testing.assert_array_equal(np.asarray(reloaded["params"]["w"]), np.asarray(state["params"]["w"]))
    assert int(reloaded["count"]) == 41


def test_a_load_onto_a_precompiled_mesh_and_the_save_after_it_compile_nothing():
    """What the precompiler prepares for a lost slice's mesh, from the abstract state alone
    (a typed key among the leaves), is what the load and the next save run: no backend
    compile while they do (jax.monitoring's compile events)."""
    four, three = model_mesh_of(4), model_mesh_of(3)
    state = mixed_state_on(four)
    snapshots = Snapshots()
    assert snapshots.save(5, state, {"step": 5}, four)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(three, x.sharding.spec)), state
    )
    snapshots.precompile_resume(abstract, three)
    compiles: list = []

    def on_compile(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(on_compile)
    try:
        loaded, _, step = snapshots.load(abstract)
        assert snapshots.save(6, loaded, {"step": 6}, three)
        snapshots.join()
    finally:
        jax.monitoring.unregister_event_duration_listener(on_compile)
    assert step == 5 and compiles == []
    np.testing.assert_array_equal(np.asarray(loaded["params"]["proj"]), np.asarray(state["params"]["proj"]))


def counted_packs(monkeypatch) -> list:
    """Each run of a pack program on the devices appends to the returned list (a host
    callback inside the program, so it counts executions, not Python calls)."""
    from elastic_dew.elastic.state import packing

    runs: list = []
    original = packing._pack_fn

    def counted(layout, mesh, replica_axis_index):
        inner = original(layout, mesh, replica_axis_index).__wrapped__

        def pack(*leaves):
            jax.debug.callback(lambda: runs.append(1))
            return inner(*leaves)

        shardings = [packing._group_sharding(mesh, replica_axis_index, g) for g in layout["groups"]]
        return jax.jit(pack, out_shardings=shardings)

    monkeypatch.setattr(packing, "_pack_fn", counted)
    return runs


def test_precompiling_the_saves_of_a_resume_onto_a_covered_mesh_runs_no_pack_and_compiles_nothing(monkeypatch):
    """The resume window's precompile_saves, after the precompiler covered the mesh (or a
    save there compiled the pack), neither runs the pack on the devices nor compiles it
    again; the next save runs the kept executable."""
    runs = counted_packs(monkeypatch)
    four, three = model_mesh_of(4), model_mesh_of(3)
    state = mixed_state_on(four)
    snapshots = Snapshots()
    assert snapshots.save(5, state, {"step": 5}, four)
    snapshots.join()
    saved_runs = len(runs)
    assert saved_runs > 0  # the counter sees the pack run by a save
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(three, x.sharding.spec)), state
    )
    snapshots.precompile_resume(abstract, three)
    loaded, _, _ = snapshots.load(abstract)
    compiles: list = []

    def on_compile(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(on_compile)
    try:
        snapshots.precompile_saves(loaded, three)  # covered by the precompiler
        snapshots.precompile_saves(state, four)  # compiled by the first save's call
        jax.effects_barrier()
        assert len(runs) == saved_runs and compiles == []
        assert snapshots.save(6, loaded, {"step": 6}, three)
        snapshots.join()
        jax.effects_barrier()
    finally:
        jax.monitoring.unregister_event_duration_listener(on_compile)
    assert len(runs) > saved_runs and compiles == []


def test_a_load_that_needs_a_program_being_precompiled_waits_for_it_instead_of_compiling_it_again():
    from elastic_dew.elastic.state.programs import PrecompiledFunction

    class Jitted:  # jax.jit's surface: lower(...).compile() and a call that compiles if need be
        def __init__(self) -> None:
            self.compiles, self.compiled = 0, False
            self.compiling, self.release = threading.Event(), threading.Event()

        def lower(self, *abstract):
            return self

        def as_text(self):  # the lowered program's text, a new one for each test run
            return f"the test's program {id(self)}"

        def compile(self):
            self.compiles += 1
            self.compiling.set()
            self.release.wait(30)
            self.compiled = True

        def __call__(self, *args):
            if not self.compiled:
                self.compiles += 1
                self.compiled = True
            return args

    class WatchedLock:  # the program's lock, saying when a second caller has to wait for it
        def __init__(self) -> None:
            self.lock, self.contended = threading.Lock(), threading.Event()

        def __enter__(self):
            if not self.lock.acquire(blocking=False):
                self.contended.set()
                self.lock.acquire()
            return self

        def __exit__(self, *exc):
            self.lock.release()

    jitted = Jitted()
    program = PrecompiledFunction(jitted, mesh=None)
    program._lock = lock = WatchedLock()
    precompiler = threading.Thread(target=program.compile, args=("abstract",))
    precompiler.start()
    assert jitted.compiling.wait(30)
    results: list = []
    loader = threading.Thread(target=lambda: results.append(program("groups")))
    loader.start()
    assert lock.contended.wait(30), "the load did not wait for the program being precompiled"
    assert results == []  # still waiting: the precompiler holds the lock until its compile ends
    jitted.release.set()
    precompiler.join(30)
    loader.join(30)
    assert results == [("groups",)] and jitted.compiles == 1


def test_an_abstract_state_that_does_not_match_the_packing_layout_is_refused_and_the_snapshot_kept():
    mesh = mesh_of(4)
    state = {"w": jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P())), "n": jax.device_put(jnp.int32(1), NamedSharding(mesh, P()))}
    snapshots = Snapshots()
    assert snapshots.save(4, state, {"step": 4}, mesh)
    abstract = abstract_on(state, mesh_of(2))

    wrong_shape = dict(abstract, w=jax.ShapeDtypeStruct((4, 5), jnp.float32, sharding=abstract["w"].sharding))
    with pytest.raises(ValueError, match=r"leaf \['w'\] has shape \(4, 4\) and dtype float32.*\(4, 5\)"):
        snapshots.load(wrong_shape)
    wrong_dtype = dict(abstract, n=jax.ShapeDtypeStruct((), jnp.float32, sharding=abstract["n"].sharding))
    with pytest.raises(ValueError, match=r"leaf \['n'\].*dtype int32.*dtype float32"):
        snapshots.load(wrong_dtype)
    with pytest.raises(ValueError, match="2 leaves, the abstract state has 3"):
        snapshots.load(dict(abstract, extra=abstract["n"]))

    assert snapshots.latest_step() == 4  # refused before Orbax touched the replicas
    loaded, _, _ = snapshots.load(abstract)
    np.testing.assert_array_equal(np.asarray(loaded["w"]), np.ones((4, 4)))


def test_a_load_that_fails_after_orbax_took_the_replicas_drops_the_snapshot(monkeypatch):
    """Orbax's load is made to fail (standing in for a slice lost mid-load, which cannot happen on CPU)."""
    mesh = mesh_of(4)
    state = {"w": jax.device_put(jnp.ones(4), NamedSharding(mesh, P()))}
    snapshots = Snapshots()
    assert snapshots.save(2, state, {"step": 2}, mesh)
    snapshots.join()

    def lost(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("slice lost while loading")

    monkeypatch.setattr(snapshots._snapshotter, "load", lost)
    with pytest.raises(jax.errors.JaxRuntimeError):
        snapshots.load(abstract_on(state, mesh_of(2)))
    assert snapshots.latest_step() is None


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
        assert Tiers(None, None).newest() == ("fresh", None)
        assert Tiers(snapshots, checkpoints).newest() == ("fresh", None)

        checkpoints.save(5, state, {"step": 5})
        checkpoints.wait()
        assert Tiers(snapshots, checkpoints).newest() == ("checkpoint", 5)

        snapshots.save(5, state, {"step": 5}, mesh)
        assert Tiers(snapshots, checkpoints).newest() == ("snapshot", 5)

        snapshots.save(6, state, {"step": 6}, mesh)
        assert Tiers(snapshots, None).newest() == ("snapshot", 6)

        checkpoints.save(8, state, {"step": 8})
        checkpoints.wait()
        assert Tiers(snapshots, checkpoints).newest() == ("checkpoint", 8)
    finally:
        checkpoints.close()


def test_an_fsdp_state_is_held_once_per_slice_in_host_memory_and_loads_onto_fewer_slices_with_its_shardings():
    """Under fsdp a snapshot costs about state bytes / devices per slice on each device."""
    from elastic_dew.elastic.slices.sharding import bytes_per_device_max, state_bytes, state_shardings

    mesh = mesh_of(4)
    rng = np.random.default_rng(5)
    values = {
        "params": {"w": rng.standard_normal((64, 128)).astype(np.float32), "b": rng.standard_normal(128).astype(np.float32)},
        "opt_state": {"mu": {"w": rng.standard_normal((64, 128)).astype(np.float32), "b": np.zeros(128, np.float32)},
                      "count": np.int32(3)},
        "rng": np.array([1, 2], np.uint32),
    }
    placed = state_shardings("fsdp", values, mesh)
    state = jax.tree.map(jax.device_put, values, placed)
    assert state["params"]["w"].sharding.spec == P(None, "data")  # 128 is the largest dimension
    assert state["opt_state"]["mu"]["w"].sharding.spec == P(None, "data")
    snapshots = Snapshots()
    assert snapshots.save(4, state, {"step": 4}, mesh)
    snapshots.join()
    host = snapshots.host_bytes_per_device_max()
    assert host <= 1.1 * state_bytes(state) / 2
    assert host < bytes_per_device_max(jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, P())), state))

    smaller = mesh_of(3)
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), values, state_shardings("fsdp", values, smaller)
    )
    loaded, meta, step = snapshots.load(abstract)
    assert step == 4 and meta == {"step": 4}
    for got, want, target in zip(jax.tree.leaves(loaded), jax.tree.leaves(values), jax.tree.leaves(abstract)):
        np.testing.assert_array_equal(np.asarray(got), want)
        assert got.sharding == target.sharding
    snapshots.close()
    assert snapshots.host_bytes_per_device == host  # measured again on the reloaded copy
