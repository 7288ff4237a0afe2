"""Tier 2: persistent Orbax checkpoints, commit safety, and the multi-tier rules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew.elastic import checkpoints as checkpoints_module
from elastic_dew.elastic import orbax_private
from elastic_dew.elastic.checkpoints import Checkpoints

AXES = ("replica", "data", "model")
REPO = Path(__file__).resolve().parent.parent


def mesh_of(replicas: int, first: int = 0) -> Mesh:
    devices = np.array(jax.devices()[first : first + replicas * 2]).reshape(replicas, 2, 1)
    return Mesh(devices, AXES)


def state_on(mesh: Mesh, scale: float = 1.0) -> dict:
    params = jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4) * scale
    return {
        "params": jax.device_put(params, NamedSharding(mesh, P("data", None))),
        "rng": jax.device_put(jax.random.key_data(jax.random.key(1)), NamedSharding(mesh, P())),
        "key": jax.device_put(jax.random.key(2), NamedSharding(mesh, P())),
    }


def abstract_on(state: dict, mesh: Mesh) -> dict:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, x.sharding.spec)),
        state,
    )


def assert_same(got: dict, want: dict) -> None:
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.prng_key):
            assert jax.dtypes.issubdtype(g.dtype, jax.dtypes.prng_key)
            g, w = jax.random.key_data(g), jax.random.key_data(w)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_checkpoint_restores_its_arrays_and_json_meta_onto_another_mesh(tmp_path):
    four, three = mesh_of(4), mesh_of(3)
    state = state_on(four)
    meta = {"step": 3, "data": {"global_next_index": 96, "dataset_length": 500}}
    checkpoints = Checkpoints(str(tmp_path), max_to_keep=2)
    checkpoints.save(3, state, meta)
    checkpoints.wait()
    assert checkpoints.latest_step() == 3
    # The meta item is plain JSON on disk: readable by anyone, nothing pickled.
    assert json.loads((tmp_path / "3" / "meta" / "metadata").read_text()) == meta

    restored, restored_meta = checkpoints.restore(3, abstract_on(state, three))
    assert restored_meta == meta
    assert_same(restored, state)
    assert restored["params"].sharding.mesh == three
    checkpoints.close()


def test_steps_start_at_one_and_bad_meta_is_refused_before_anything_is_written(tmp_path):
    mesh = mesh_of(4)
    checkpoints = Checkpoints(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="step=0 must be an int >= 1"):
        checkpoints.save(0, state_on(mesh), {"step": 0})
    with pytest.raises(ValueError, match="JSON"):
        checkpoints.save(1, state_on(mesh), {"step": 1, "when": object()})
    checkpoints.wait()
    assert checkpoints.latest_step() is None
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == []
    checkpoints.close()


def test_a_step_at_or_below_the_newest_committed_one_is_skipped_not_written(tmp_path):
    mesh = mesh_of(4)
    checkpoints = Checkpoints(str(tmp_path), max_to_keep=2)
    checkpoints.save(4, state_on(mesh), {"step": 4})
    checkpoints.wait()
    checkpoints.save(2, state_on(mesh, 2.0), {"step": 2}, force=True)
    checkpoints.save(4, state_on(mesh, 3.0), {"step": 4}, force=True)
    checkpoints.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4"]
    restored, _ = checkpoints.restore(4, abstract_on(state_on(mesh), mesh))
    assert_same(restored, state_on(mesh))
    checkpoints.close()


def test_partial_and_temporary_step_directories_are_never_restored_and_are_replaced(tmp_path):
    mesh = mesh_of(4)
    state = state_on(mesh)
    checkpoints = Checkpoints(str(tmp_path), max_to_keep=3)
    checkpoints.save(1, state, {"step": 1})
    checkpoints.wait()
    checkpoints.close()
    # A save cut short leaves Orbax's temporary directory; a copy cut short leaves a
    # plain step directory without the commit timestamp.
    (tmp_path / "5.orbax-checkpoint-tmp-1234" / "state").mkdir(parents=True)
    (tmp_path / "7" / "state").mkdir(parents=True)
    (tmp_path / "7" / "_CHECKPOINT_METADATA").write_text('{"commit_timestamp_nsecs": null}')

    reopened = Checkpoints(str(tmp_path), max_to_keep=3)
    assert reopened.latest_step() == 1
    with pytest.raises(ValueError, match="step 7 is not committed.*newest committed step is 1"):
        reopened.restore(7, abstract_on(state, mesh))

    reopened.save(7, state_on(mesh, 7.0), {"step": 7})
    reopened.wait()
    assert reopened.latest_step() == 7
    restored, meta = reopened.restore(7, abstract_on(state, mesh))
    assert meta == {"step": 7}
    assert_same(restored, state_on(mesh, 7.0))
    reopened.close()


_KILLED_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp
    from elastic_dew.elastic.checkpoints import Checkpoints

    directory = sys.argv[1]
    checkpoints = Checkpoints(directory, max_to_keep=1)
    checkpoints.save(1, {"w": jnp.full((4,), 1.0)}, {"step": 1})
    checkpoints.wait()
    print("COMMITTED 1", flush=True)
    big = {"w": jnp.ones((96 * 1024 * 1024 // 4,), dtype=jnp.float32)}
    jax.block_until_ready(big)
    checkpoints.save(2, big, {"step": 2})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(".orbax-checkpoint-tmp" in name for name in os.listdir(directory)):
            print("WRITING 2", flush=True)
            break
        time.sleep(0.002)
    checkpoints.wait()
    print("COMMITTED 2", flush=True)
    time.sleep(60)
    """
)


def test_a_save_killed_mid_write_is_never_restored_and_keeps_the_previous_checkpoint(tmp_path):
    """A real child process is SIGKILLed while Orbax writes step 2 (max_to_keep=1)."""
    directory = tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", XLA_FLAGS="")
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD, str(directory)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        lines = []
        for line in child.stdout:
            lines.append(line.strip())
            if line.startswith("WRITING 2") or line.startswith("COMMITTED 2"):
                break
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert lines == ["COMMITTED 1", "WRITING 2"], lines
    assert child.returncode == -signal.SIGKILL
    names = sorted(p.name for p in directory.iterdir())
    assert "1" in names and "2" not in names, names
    assert any(name.startswith("2.orbax-checkpoint-tmp") for name in names), names

    checkpoints = Checkpoints(str(directory), max_to_keep=1)
    assert checkpoints.latest_step() == 1
    mesh = mesh_of(1)
    abstract = {"w": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=NamedSharding(mesh, P()))}
    restored, meta = checkpoints.restore(1, abstract)
    assert meta == {"step": 1}
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.ones(4))

    # The same step written again after the crash commits normally.
    checkpoints.save(2, {"w": jax.device_put(jnp.full((4,), 2.0), NamedSharding(mesh, P()))}, {"step": 2})
    checkpoints.wait()
    assert checkpoints.latest_step() == 2
    checkpoints.close()


def test_multi_tier_on_cpu_is_refused_at_construction_before_touching_the_directory(tmp_path):
    directory = tmp_path / "mtc"
    with pytest.raises(RuntimeError, match="colocated Python.*'cpu'.*checkpoint_kind='orbax'"):
        Checkpoints(str(directory), kind="multi_tier", run_name="run", mesh=mesh_of(4))
    assert not directory.exists()


def test_an_unknown_kind_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="kind='s3' must be one of orbax, multi_tier"):
        Checkpoints("/tmp/unused-elastic-dew", kind="s3")


class FakeInitialization:
    """Stands in for orbax's multi-tier ``initialization`` (needs TPU sidecars + the replicator)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def initialize_multi_tier_checkpointing(self, directory, **kwargs):
        self.calls.append({"directory": str(directory), **kwargs})


class FakeReplicatorModule:
    """Stands in for ``replicator_checkpoint_manager``: keeps saved items in memory."""

    def __init__(self) -> None:
        self.managers: list = []
        self.saved: dict[int, object] = {}
        module = self

        class Options:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

        class Manager:
            def __init__(self, directory, *, options, global_mesh):
                self.options, self.global_mesh, self.closed = options, global_mesh, False
                module.managers.append(self)

            def save(self, step, args, force=False):
                module.saved[step] = args["state"].item
                return True

            def latest_step(self):
                return max(module.saved) if module.saved else None

            def restore(self, step, args):
                return {"state": module.saved[step]}

            def wait_until_finished(self):
                pass

            def close(self):
                self.closed = True

        self.ReplicatorCheckpointManagerOptions = Options
        self.ReplicatorCheckpointManager = Manager


def test_multi_tier_initialises_again_exactly_when_the_active_slice_count_changes(tmp_path, monkeypatch):
    """Orbax's multi-tier modules are faked: they need TPUs and colocated-Python sidecars."""
    initialization, replicator = FakeInitialization(), FakeReplicatorModule()
    monkeypatch.setattr(checkpoints_module, "_require_colocated_python", lambda: None)
    monkeypatch.setattr(checkpoints_module, "_multi_tier_modules", lambda: (initialization, replicator))

    checkpoints = Checkpoints(str(tmp_path), kind="multi_tier", run_name="run-a")
    assert checkpoints.latest_step() is None and initialization.calls == []

    four = mesh_of(4)
    checkpoints.on_active_slices_changed(list(four.devices.flat), four)
    checkpoints.on_active_slices_changed(list(four.devices.flat), four)
    assert [c["num_slices"] for c in initialization.calls] == [4]
    first = initialization.calls[0]
    assert first["use_colocated_python"] is True and first["run_name"] == "run-a"
    assert first["devices"] == list(four.devices.flat)
    assert replicator.managers[0].options.kwargs["use_colocated_python"] is True

    three = mesh_of(3)
    checkpoints.on_active_slices_changed(list(three.devices.flat), three)
    assert [c["num_slices"] for c in initialization.calls] == [4, 3]
    assert initialization.calls[1]["devices"] == list(three.devices.flat)
    assert replicator.managers[0].closed and replicator.managers[-1].global_mesh == three

    # Same count on other devices: no new initialisation, but a manager bound to the new mesh.
    other_three = mesh_of(3, first=2)
    checkpoints.on_active_slices_changed(list(other_three.devices.flat), other_three)
    assert len(initialization.calls) == 2
    assert replicator.managers[-1].global_mesh == other_three

    state = state_on(other_three)
    with pytest.raises(ValueError, match="step=0"):
        checkpoints.save(0, state, {"step": 0})
    assert replicator.saved == {}

    meta = {"step": 1, "data": {"global_next_index": 24}}
    checkpoints.save(1, state, meta)
    checkpoints.wait()
    assert checkpoints.latest_step() == 1
    restored, restored_meta = checkpoints.restore(1, abstract_on(state, other_three))
    assert restored_meta == meta
    assert_same(restored, state)
    checkpoints.close()


def test_multi_tier_needs_a_run_name(tmp_path, monkeypatch):
    """Orbax's multi-tier modules are faked: they need TPUs and colocated-Python sidecars."""
    monkeypatch.setattr(checkpoints_module, "_require_colocated_python", lambda: None)
    monkeypatch.delenv("JOBSET_NAME", raising=False)
    with pytest.raises(ValueError, match="run_name or set JOBSET_NAME"):
        Checkpoints(str(tmp_path), kind="multi_tier")


def _fresh_state(mesh: Mesh, rows: int) -> dict:
    """A replicated state of a shape no other test compiles for (so its slicing is uncompiled)."""
    params = jnp.ones((rows, 16), jnp.float32)
    return {"params": jax.device_put(params, NamedSharding(mesh, P(None, "data")))}


def _compiles_during(action) -> int:
    compiles = []

    def listen(event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        action()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    return len(compiles)


def test_a_first_save_of_small_leaves_compiles_nothing_unprepared_and_leaves_orbax_registry_as_it_was(tmp_path):
    """Leaves whose per-replica slice is under the bound are written whole by one replica."""
    from orbax.checkpoint import type_handlers

    mesh = mesh_of(4)
    with jax.default_device(jax.devices()[0]):
        checkpoints = Checkpoints(str(tmp_path / "small"))
        state = _fresh_state(mesh, 72)
        assert _compiles_during(lambda: checkpoints.save(1, state, {"step": 1})) == 0
        checkpoints.wait()
        restored, _ = checkpoints.restore(1, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state))
        checkpoints.close()
    np.testing.assert_array_equal(np.asarray(restored["params"]), np.ones((72, 16), np.float32))
    assert type_handlers.get_type_handler(jax.Array)._min_slice_bytes_for_replica_parallel is None


def test_a_leaf_saved_replica_parallel_is_prepared_so_its_first_save_compiles_nothing_in_the_loop(tmp_path, monkeypatch):
    """The bound is lowered so that a small leaf stands in for a large one. pathwaysutils runs
    each attempt under ``jax.default_device``; so does this test, since JAX caches a compile
    under the calling thread's context."""
    monkeypatch.setattr(orbax_private, "REPLICA_PARALLEL_MIN_SLICE_BYTES", 64)
    mesh = mesh_of(4)
    with jax.default_device(jax.devices()[0]):
        checkpoints = Checkpoints(str(tmp_path / "prepared"))
        state = _fresh_state(mesh, 40)
        checkpoints.prepare(state)
        assert checkpoints.prepared(timeout=120)
        assert _compiles_during(lambda: checkpoints.save(1, state, {"step": 1})) == 0
        checkpoints.wait()
        checkpoints.close()

        unprepared = Checkpoints(str(tmp_path / "unprepared"))
        other = _fresh_state(mesh, 56)
        assert _compiles_during(lambda: unprepared.save(1, other, {"step": 1})) > 0
        unprepared.wait()
        unprepared.close()
    assert Checkpoints(str(tmp_path / "prepared")).latest_step() == 1
