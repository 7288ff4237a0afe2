"""The simulator's slice semantics: lose and restore, read paths, health check, snapshots.

TPU slices cannot exist here; :class:`SimulatedSlices` stands in for them on the 8 CPU
devices of the test process (conftest), with the real pathwaysutils Manager and health check
and the real Orbax Snapshotter running on top.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import elastic, manager

from elastic_dew._compat.orbax import HostSnapshotter
from elastic_dew.simulate import SimulatedSlices

pytestmark = pytest.mark.libraries  # the simulator's patches


def _on_slice(sim: SimulatedSlices, index: int) -> jax.Array:
    """A two-device array on slice ``index`` (sharded over its devices)."""
    mesh = Mesh(np.asarray(sim.slice_to_devices[index]), ("d",))
    return jax.device_put(np.arange(4.0), NamedSharding(mesh, PartitionSpec("d")))


def _single(sim: SimulatedSlices, index: int) -> jax.Array:
    """A single-device array on the first device of slice ``index``."""
    return jax.device_put(np.arange(4.0), sim.slice_to_devices[index][0])


def _whole_mesh(sim: SimulatedSlices) -> Mesh:
    return Mesh(np.asarray(sim.devices).reshape(sim.slices, -1), ("replica", "data"))


READS = {
    "np.asarray": lambda x: np.asarray(x),
    "np.array": lambda x: np.array(x),
    "__array__": lambda x: x.__array__(),
    "jax.device_get": lambda x: jax.device_get(x),
    "block_until_ready method": lambda x: x.block_until_ready(),
    "jax.block_until_ready": lambda x: jax.block_until_ready(x),
    "jax.block_until_ready of several": lambda x: jax.block_until_ready([x, x + 0]),
    "indexing": lambda x: x[0],
    "item": lambda x: x.item(0),
    "float of a result": lambda x: float(x.sum()),
    "int of a result": lambda x: int(x.sum()),
    "tolist": lambda x: x.tolist(),
    "iteration": lambda x: list(x),
    "repr": lambda x: repr(x),
}


@pytest.mark.parametrize("read", list(READS), ids=list(READS))
@pytest.mark.parametrize("make", [_on_slice, _single], ids=["sharded", "single-device"])
def test_every_read_of_an_array_on_a_lost_slice_raises_a_slice_down_error(read, make):
    with SimulatedSlices(4, 2) as sim:
        x = make(sim, 1)
        sim.lose(1)
        with pytest.raises(jax.errors.JaxRuntimeError) as caught:
            READS[read](x)
        assert "DATA_LOSS" in str(caught.value)
        assert elastic.is_error_due_to_slice_down(caught.value)


def test_arrays_on_healthy_slices_stay_readable_while_another_is_lost():
    with SimulatedSlices(4, 2) as sim:
        arrays = {index: _on_slice(sim, index) for index in range(4)}
        sim.lose(2)
        for index in (0, 1, 3):
            np.testing.assert_array_equal(np.asarray(arrays[index]), np.arange(4.0))
            assert float(arrays[index][3]) == 3.0
        with pytest.raises(jax.errors.JaxRuntimeError):
            np.asarray(arrays[2])


def test_a_jit_call_onto_a_lost_slice_fails_at_dispatch_and_a_copy_put_there_fails_when_read():
    with SimulatedSlices(4, 2) as sim:
        whole = jax.device_put(np.ones(8), NamedSharding(_whole_mesh(sim), PartitionSpec("replica")))
        sim.lose(3)
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS.*dispatched"):
            jax.jit(lambda x: x * 2)(whole)
        fresh_on_lost = jax.device_put(np.ones(2), sim.slice_to_devices[3][0])  # the put: no error
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
            jax.block_until_ready(fresh_on_lost)


def test_the_real_health_check_reports_exactly_the_lost_slices():
    with SimulatedSlices(4, 2) as sim:
        slices = manager.Manager().slice_to_devices
        assert elastic.get_active_slice_indices(slices) == {0, 1, 2, 3}
        for index in range(4):
            sim.lose(index)
            assert elastic.get_active_slice_indices(slices) == {0, 1, 2, 3} - {index}
            sim.restore(index)
        sim.lose(0)
        sim.lose(2)
        assert elastic.get_active_slice_indices(slices) == {1, 3}
        sim.restore(0)
        assert elastic.get_active_slice_indices(slices) == {0, 1, 3}
        assert sim.lost == {2}


def test_a_restored_slice_reads_fresh_arrays_and_keeps_the_old_ones_lost():
    with SimulatedSlices(4, 2) as sim:
        before = _on_slice(sim, 1)
        sim.lose(1)
        during = _on_slice(sim, 1)
        sim.restore(1)
        after = _on_slice(sim, 1)
        np.testing.assert_array_equal(np.asarray(after), np.arange(4.0))
        for gone in (before, during):
            with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
                np.asarray(gone)


def test_fresh_arrays_on_a_restored_slice_are_never_reported_lost_including_any_that_take_a_dead_arrays_id():
    """pathwaysutils' own mock tracks lost arrays by id(); Python reuses ids, so it misreports.

    Whether the allocator hands the dead array's id out again among the fresh arrays depends
    on the Python and jaxlib builds (it usually does at once); the simulator marks the arrays
    themselves, so every fresh one must read, reused id or not.
    """
    with SimulatedSlices(4, 2) as sim:
        sim.lose(1)
        old = _single(sim, 1)
        sim.restore(1)
        del old
        for _ in range(200):
            fresh = _single(sim, 1)
            np.testing.assert_array_equal(np.asarray(fresh), np.arange(4.0))


def test_manager_without_arguments_sees_the_devices_grouped_into_slices():
    with SimulatedSlices(3, 2) as sim:
        m = manager.Manager()
        assert m.total_slice_count == 3
        assert {index: list(devices) for index, devices in m.slice_to_devices.items()} == sim.slice_to_devices
        assert m.active_slice_indices == {0, 1, 2}
        assert m.default_device in sim.devices


def test_the_monitor_thread_reports_a_lost_slice_as_unavailable_and_a_restored_one_as_available(monkeypatch):
    checks: list[tuple[set, set]] = []
    three_checks = threading.Event()
    check = elastic.get_active_slice_indices

    def counted(slice_to_devices, *args, **kwargs):  # the monitor's probe of its inactive slices
        found = check(slice_to_devices, *args, **kwargs)
        checks.append((set(slice_to_devices), set(found)))
        if len(checks) >= 3:
            three_checks.set()
        return found

    monkeypatch.setattr(elastic, "get_active_slice_indices", counted)
    with SimulatedSlices(4, 2) as sim:
        sim.lose(2)
        m = manager.Manager()
        assert m.active_slice_indices == {0, 1, 3}
        checks.clear()  # the Manager's own probe of every slice; from here on, the monitor's
        three_checks.clear()
        m.start_monitoring(poll_interval=0.05)
        try:
            assert three_checks.wait(30), f"the monitor thread checked {len(checks)} times in 30 s"
            assert checks[:3] == [({2}, set())] * 3  # it probed the lost slice and found it down
            assert m.available_inactive_slices == frozenset()
            sim.restore(2)
            sim.await_monitor(m, timeout=30)
            assert m.available_inactive_slices == {2}
        finally:
            m.close()


def test_snapshotter_load_recovers_the_state_from_the_surviving_replicas():
    with SimulatedSlices(4, 2) as sim:
        mesh = Mesh(np.asarray(sim.devices).reshape(4, 2, 1), ("replica", "data", "model"))
        weights = jax.device_put(np.arange(16.0).reshape(4, 4), NamedSharding(mesh, PartitionSpec(None, "model")))
        # Earlier tests' snapshots may still be alive (Orbax's worker thread keeps its
        # Snapshotter); count only the pinned arrays this save made.
        before = [a for a in jax.live_arrays() if a.sharding.memory_kind == "pinned_host"]
        snapshotter = ocp.v1.training.pathways.Snapshotter(replica_axis_index=0)
        snapshotter.save(7, {"weights": weights, "step": 7})
        snapshotter.join()
        pinned = [
            a for a in jax.live_arrays()
            if a.sharding.memory_kind == "pinned_host" and not any(a is b for b in before)
        ]
        del before
        assert len(pinned) == 4  # one replica per slice

        sim.lose(1)
        readable = {sim.slice_of(next(iter(a.devices()))): True for a in pinned}
        for replica in pinned:
            index = sim.slice_of(next(iter(replica.devices())))
            try:
                np.asarray(replica)
            except jax.errors.JaxRuntimeError:
                readable[index] = False
        assert readable == {0: True, 1: False, 2: True, 3: True}

        survivors = Mesh(
            np.asarray([d for i in (0, 2, 3) for d in sim.slice_to_devices[i]]).reshape(3, 2, 1),
            ("replica", "data", "model"),
        )
        abstract = {
            "weights": jax.ShapeDtypeStruct((4, 4), np.float32, sharding=NamedSharding(survivors, PartitionSpec())),
            "step": 0,
        }
        restored = snapshotter.load(abstract)
        assert restored["step"] == 7
        np.testing.assert_array_equal(np.asarray(restored["weights"]), np.arange(16.0).reshape(4, 4))
        assert restored["weights"].sharding.mesh.devices.shape == (3, 2, 1)


def test_replicas_a_snapshot_load_donated_read_as_deleted_and_a_later_loss_can_still_mark_every_array():
    # Orbax's load joins the replicas with pathwaysutils' concatenate_by_mesh_axis, which
    # donates them; on the CPU client that left them broken, and the next loss's walk of
    # jax.live_arrays() killed the process with SIGSEGV (the soak's schedule 493).
    with SimulatedSlices(4, 2) as sim:
        mesh = Mesh(np.asarray(sim.devices).reshape(4, 2, 1), ("replica", "data", "model"))
        snapshotter = HostSnapshotter(replica_axis_index=0)  # Orbax's, with its stored replicas readable
        snapshotter.save(3, {"w": jax.device_put(np.arange(4.0), NamedSharding(mesh, PartitionSpec()))})
        snapshotter.join()
        replicas, _ = snapshotter.newest()
        donated = [tree["w"] for tree in replicas]
        abstract = {"w": jax.ShapeDtypeStruct((4,), np.float32, sharding=NamedSharding(mesh, PartitionSpec()))}
        restored = snapshotter.load(abstract)

        sim.lose(1)
        assert all(replica.is_deleted() for replica in donated)
        with pytest.raises(RuntimeError, match="deleted"):
            np.asarray(donated[0])
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
            np.asarray(restored["w"])  # on every slice, lost 1 among them


def test_a_donating_join_of_replicas_moves_their_buffers_into_its_result_without_a_copy():
    from pathwaysutils.experimental.concatenate_by_mesh_axis import concatenate_by_mesh_axis

    with SimulatedSlices(2, 1) as sim:
        pinned = [
            jax.device_put(np.full(8, float(i), np.float32), NamedSharding(
                Mesh(np.asarray([device]).reshape(1, 1, 1), ("replica", "data", "model")), PartitionSpec()
            ).with_memory_kind("pinned_host"))
            for i, device in enumerate(sim.devices)
        ]
        buffers = [a.addressable_shards[0].data.unsafe_buffer_pointer() for a in pinned]
        joined = concatenate_by_mesh_axis([{"w": a} for a in pinned], "replica")["w"]
        assert [s.data.unsafe_buffer_pointer() for s in joined.addressable_shards] == buffers
        assert [float(np.asarray(s.data)[0]) for s in joined.addressable_shards] == [0.0, 1.0]
        assert all(a.is_deleted() for a in pinned)
        with pytest.raises(RuntimeError, match="deleted"):
            jax.device_put(pinned[0], pinned[1].sharding)


def test_every_patch_is_undone_when_the_context_exits():
    originals = (
        elastic.get_slice_to_devices,
        np.asarray,
        np.array,
        jax.Array.block_until_ready if hasattr(jax.Array, "block_until_ready") else None,
    )
    with SimulatedSlices(4, 2) as sim:
        x = _on_slice(sim, 1)
        sim.lose(1)
        assert elastic.get_slice_to_devices is not originals[0]
    after = (
        elastic.get_slice_to_devices,
        np.asarray,
        np.array,
        jax.Array.block_until_ready if hasattr(jax.Array, "block_until_ready") else None,
    )
    assert after == originals
    np.testing.assert_array_equal(np.asarray(x), np.arange(4.0))
    with pytest.raises(AttributeError):
        elastic.get_slice_to_devices(jax.devices())  # CPU devices have no slice_index again


def test_too_few_host_devices_is_a_clear_error_naming_the_flag_and_the_count():
    with pytest.raises(RuntimeError, match="--xla_force_host_platform_device_count=10") as caught:
        with SimulatedSlices(5, 2):
            pass
    assert "needs 10 host devices" in str(caught.value)
    assert "JAX has 8" in str(caught.value)


def test_one_simulator_at_a_time():
    with SimulatedSlices(2, 2):
        with pytest.raises(RuntimeError, match="already active"):
            with SimulatedSlices(2, 2):
                pass
    with SimulatedSlices(2, 2) as again:  # the first one's exit freed the seat
        assert again.lost == frozenset()


@pytest.mark.parametrize("bad", [(0, 2), (2, 0), (-1, 1)])
def test_bad_slice_shapes_are_refused_before_anything_is_patched(bad):
    with pytest.raises(ValueError, match="must be a whole number >= 1"):
        SimulatedSlices(*bad)
    assert elastic.get_slice_to_devices.__module__ == "pathwaysutils.elastic.elastic"


def test_losing_a_slice_that_does_not_exist_names_the_valid_slices():
    with SimulatedSlices(2, 2) as sim:
        with pytest.raises(ValueError, match=r"slices are 0\.\.1"):
            sim.lose(2)


def test_a_slice_lost_on_another_thread_surfaces_at_the_next_read():
    with SimulatedSlices(2, 2) as sim:
        x = _on_slice(sim, 0)
        thread = threading.Thread(target=sim.lose, args=(0,))
        thread.start()
        thread.join()
        with pytest.raises(jax.errors.JaxRuntimeError):
            x.block_until_ready()
