"""Tier 2: persistent Orbax checkpoints, commit safety, and multi-tier checkpointing.

Everything runs Orbax's real code. Multi-tier checkpointing runs under ``SimulatedSlices``
with its replicator stand-in: TPU workers, their colocated-Python sidecars and GKE's
replicator service cannot exist on CPU (what the stand-in reproduces is in
``elastic_dew.simulate.replicator``)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.elastic.state.checkpoints import Checkpoints, MultiTierError
from elastic_dew.elastic.state.meta import MetaError
from elastic_dew.elastic.state.multi_tier import META_CAPACITY
from elastic_dew.runtime import Preempted, PreemptionNotice
from elastic_dew.simulate import SimulatedSlices

from linear import LinearProgram
from linear import dataset as linear_dataset

pytestmark = pytest.mark.libraries  # Orbax's CheckpointManager and its multi-tier replicator manager

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


def _array_codec(step_dir: Path, leaf: str) -> dict | None:
    """The compressor a leaf's zarr metadata names, read from the step's OCDBT store."""
    import tensorstore as ts

    store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{step_dir / 'state'}/"}).result()
    return json.loads(store.read(f"{leaf}/.zarray").result().value)["compressor"]


def test_checkpoints_written_uncompressed_and_with_orbaxs_zstd_default_both_restore(tmp_path, monkeypatch):
    """Tier 2 writes its arrays uncompressed (``USE_COMPRESSION``); a checkpoint written with
    Orbax's default zstd compression (an earlier build, or another writer) restores all the
    same: each array's codec is read from its own metadata."""
    mesh = mesh_of(4)
    state, meta = state_on(mesh), {"step": 1}
    monkeypatch.setattr(orbax_private, "USE_COMPRESSION", True)
    written = Checkpoints(str(tmp_path))
    written.save(1, state, meta)
    written.wait()
    written.close()
    monkeypatch.undo()
    written = Checkpoints(str(tmp_path))
    written.save(2, jax.tree.map(lambda x: x, state), {"step": 2})
    written.wait()
    written.close()
    assert _array_codec(tmp_path / "1", "params") == {"id": "zstd", "level": 1}
    assert _array_codec(tmp_path / "2", "params") is None

    reader = Checkpoints(str(tmp_path))
    for step in (1, 2):
        restored, restored_meta = reader.restore(step, abstract_on(state, mesh_of(3)))
        assert restored_meta == {"step": step}
        assert_same(restored, state)
    reader.close()


def test_a_resume_lists_the_checkpoints_once_and_reads_the_newest_steps_metadata_once(tmp_path, monkeypatch):
    """As the protocol resumes (the newest state asked, then restored): the directory is
    listed once, and the newest step's commit metadata and its arrays' tree metadata are each
    read once (the tree metadata by Orbax's own restore; nothing reads it again first)."""
    from collections import Counter

    from etils import epath

    from elastic_dew.elastic.state.tiers import Tiers

    mesh, directory = mesh_of(4), tmp_path / "ckpt"
    state = state_on(mesh)
    checkpoints = Checkpoints(str(directory))
    for step in (1, 2):
        checkpoints.save(step, state, {"step": step})
        checkpoints.wait()
    checkpoints.close()
    tiers = Tiers(None, Checkpoints(str(directory)), owns_checkpoints=True)  # Orbax's manager lists it as it opens
    reads: Counter[str] = Counter()
    listings: Counter[str] = Counter()
    path_type = type(epath.Path(directory))
    read_text, iterdir = path_type.read_text, path_type.iterdir

    def counted_read(path, *args, **kwargs):
        reads[os.path.relpath(path, directory)] += 1
        return read_text(path, *args, **kwargs)

    def counted_listing(path):
        listings[os.path.relpath(path, directory)] += 1
        return iterdir(path)

    monkeypatch.setattr(path_type, "read_text", counted_read)
    monkeypatch.setattr(path_type, "iterdir", counted_listing)
    tiers.newest_known()
    restored = tiers.restore(abstract_on(state, mesh))
    monkeypatch.undo()
    assert (restored.source, restored.step, restored.meta) == ("checkpoint", 2, {"step": 2})
    assert_same(restored.state, state)
    assert listings["."] == 1, listings
    assert reads["2/_CHECKPOINT_METADATA"] == 1 and reads["2/state/_METADATA"] == 1, reads
    assert not [path for path in reads if path.startswith("1")], reads
    tiers.close()


def test_steps_start_at_one_and_bad_meta_is_refused_before_anything_is_written(tmp_path):
    mesh = mesh_of(4)
    checkpoints = Checkpoints(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="step=0 must be an int >= 1"):
        checkpoints.save(0, state_on(mesh), {"step": 0})
    with pytest.raises(MetaError, match="JSON"):
        checkpoints.save(1, state_on(mesh), {"step": 1, "when": object()})
    checkpoints.wait()
    assert checkpoints.latest_step() is None
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == []
    checkpoints.close()


def test_a_library_error_that_mentions_metadata_abandons_the_save_and_the_run_goes_on(tmp_path, monkeypatch):
    """Only a meta the tier cannot carry (``MetaError``) is the caller's error; an Orbax
    ``ValueError`` about its own metadata is a failed save, abandoned like any other."""
    mesh = mesh_of(4)
    checkpoints = Checkpoints(str(tmp_path / "ckpt"))

    def broken(*args, **kwargs):
        raise ValueError("could not write the checkpoint's metadata file")

    monkeypatch.setattr(checkpoints.manager, "save", broken)
    assert checkpoints.save(1, state_on(mesh), {"step": 1}) is False
    (failure,) = checkpoints.failures()
    assert failure.operation == "save" and "metadata file" in str(failure)
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
    from elastic_dew.elastic.state.checkpoints import Checkpoints

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


@pytest.mark.slow
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


def test_multi_tier_without_a_pathways_backend_is_refused_at_construction_before_touching_the_directory(tmp_path):
    directory = tmp_path / "mtc"
    with pytest.raises(RuntimeError, match="colocated Python.*'cpu'.*checkpoint_kind='orbax'"):
        Checkpoints(str(directory), kind="multi_tier", run_name="run", mesh=mesh_of(4))
    assert not directory.exists()


def test_an_unknown_kind_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="kind='s3' must be one of orbax, multi_tier"):
        Checkpoints("/tmp/unused-elastic-dew", kind="s3")


# -- multi-tier: Orbax's real initialize_multi_tier_checkpointing and colocated
# ReplicatorCheckpointManager under SimulatedSlices, which stands in for Pathways (devices
# with slice_index, the backend test) and, with replicator=, for GKE's replicator service
# (elastic_dew.simulate.replicator: it follows the service's file protocol). Nothing of
# Orbax is faked.


def slice_mesh(sim, slices) -> Mesh:
    devices = [d for i in slices for d in sim.slice_to_devices[i]]
    return Mesh(np.array(devices).reshape(len(slices), -1, 1), AXES)


def bind(checkpoints: Checkpoints, mesh: Mesh) -> None:
    checkpoints.on_active_slices_changed(list(mesh.devices.flat), mesh)


def multi_tier(sim, **kwargs) -> Checkpoints:
    return Checkpoints(str(sim.replicator.local), kind="multi_tier", run_name="dew", **kwargs)


def test_multi_tier_saves_and_restores_bitwise_through_orbaxs_colocated_manager(tmp_path):
    with SimulatedSlices(2, 2, replicator=tmp_path) as sim:
        mesh = slice_mesh(sim, [0, 1])
        checkpoints = multi_tier(sim, mesh=mesh, backup_interval_minutes=7)
        # One handshake per worker (one per slice), each told its peer in the other slice.
        assert [(h.rank, h.nodes, h.peers, h.backup_interval_minutes) for h in sim.replicator.handshakes] == [
            (0, 2, (1,), 7), (1, 2, (0,), 7)
        ]
        assert checkpoints.latest_step() is None
        state = state_on(mesh)
        with pytest.raises(ValueError, match="step=0"):
            checkpoints.save(0, state, {"step": 0})
        # A meta larger than the kind carries is the caller's error, raised, not a storage
        # failure that abandons the save.
        with pytest.raises(MetaError, match=f"carries at most {META_CAPACITY}"):
            checkpoints.save(1, state, {"step": 1, "note": "x" * META_CAPACITY})
        assert checkpoints.failures() == []
        meta = {"step": 1, "data": {"global_next_index": 24}}
        checkpoints.save(1, state, meta)
        checkpoints.wait()
        assert checkpoints.latest_step() == 1
        restored, restored_meta = checkpoints.restore(1, abstract_on(state, mesh))
        assert restored_meta == meta
        assert_same(restored, state)
        assert restored["params"].sharding.mesh == mesh
        sim.replicator.sync()
        checkpoints.close()
    assert sorted(p.name for p in (tmp_path / "backup" / "dew").iterdir()) == ["1"]


class _Recorder:
    """Wraps a manager and records every attribute asked of it (a call into its workers)."""

    def __init__(self, manager) -> None:
        self.manager, self.asked = manager, []

    def __getattr__(self, name):
        self.asked.append(name)
        return getattr(self.manager, name)


def test_multi_tier_initialises_again_for_a_new_slice_set_of_the_same_count_and_never_calls_the_lost_one(tmp_path):
    """Replica-resize from slices {0, 1} to {0, 2}: the count is unchanged, the workers are not."""
    with SimulatedSlices(3, 2, replicator=tmp_path) as sim:
        checkpoints = multi_tier(sim)
        first = slice_mesh(sim, [0, 1])
        bind(checkpoints, first)
        bind(checkpoints, first)  # the same devices again: nothing to do
        assert checkpoints.initializations == 1
        checkpoints.save(1, state_on(first), {"step": 1})
        checkpoints.wait()
        recorder = checkpoints.manager = _Recorder(checkpoints.manager)

        sim.lose(1)
        checkpoints.on_slice_lost()
        assert checkpoints.latest_step() == 1  # known committed, without asking the workers
        other = slice_mesh(sim, [0, 2])
        bind(checkpoints, other)
        assert recorder.asked == []
        assert checkpoints.initializations == 2
        assert checkpoints.latest_step() == 1
        expected = state_on(other)  # the same values, on slices that are not lost
        restored, meta = checkpoints.restore(1, abstract_on(expected, other))
        assert meta == {"step": 1} and restored["params"].sharding.mesh == other
        assert_same(restored, expected)

        # Scale-up in place (no loss): the old manager's save commits, then a new setup.
        checkpoints.save(2, restored, {"step": 2})
        sim.restore(1)
        everything = slice_mesh(sim, [0, 1, 2])
        bind(checkpoints, everything)
        assert checkpoints.initializations == 3
        assert checkpoints.latest_step() == 2
        assert [h.nodes for h in sim.replicator.handshakes] == [2, 2, 2, 2, 3, 3, 3]
        checkpoints.close()


def test_a_replaced_node_is_restored_from_its_peer_only_by_initialising_again_on_the_same_devices(tmp_path):
    """Pause-resume returns the same devices, but the returned slice may be a new node with an
    empty local directory: only the initialisation's handshake makes the replicator restore it."""
    with SimulatedSlices(2, 2, replicator=tmp_path) as sim:
        mesh = slice_mesh(sim, [0, 1])
        checkpoints = multi_tier(sim, mesh=mesh)
        state = state_on(mesh, 3.0)
        checkpoints.save(4, state, {"step": 4})
        checkpoints.wait()
        sim.replicator.sync()
        sim.replicator.replace_node(1)

        bind(checkpoints, mesh)  # the same devices and no loss reported: not initialised again
        with pytest.raises(ValueError, match="No step path found"):
            checkpoints.restore(4, abstract_on(state, mesh))

        checkpoints.on_slice_lost()
        bind(checkpoints, mesh)
        assert [(r.rank, r.step, r.source) for r in sim.replicator.restores] == [(1, 4, "peer n0")]
        assert checkpoints.latest_step() == 4
        restored, meta = checkpoints.restore(4, abstract_on(state, mesh))
        assert meta == {"step": 4}
        assert_same(restored, state)
        checkpoints.close()


def test_a_replicator_failure_is_an_error_that_says_where_to_look_and_keeps_the_checkpoints(tmp_path):
    with SimulatedSlices(1, 2, replicator=tmp_path) as sim:
        mesh = slice_mesh(sim, [0])
        checkpoints = multi_tier(sim, mesh=mesh)
        checkpoints.save(1, state_on(mesh), {"step": 1})
        checkpoints.wait()
        sim.replicator.sync()
        sim.replicator.fail("backup bucket not writable")
        checkpoints.on_slice_lost()
        with pytest.raises(MultiTierError, match="replicator failed.*backup bucket not writable.*kubectl logs"):
            bind(checkpoints, mesh)
        assert not (sim.replicator.local / "replicator.failed").exists()  # read and cleared by Orbax
        bind(checkpoints, mesh)
        assert checkpoints.latest_step() == 1
        checkpoints.close()


def test_an_initialisation_the_replicator_never_answers_ends_at_the_timeout_with_what_to_check(tmp_path):
    with SimulatedSlices(1, 2, replicator=tmp_path) as sim:
        sim.replicator.answering = False
        started = time.monotonic()
        with pytest.raises(MultiTierError, match="not initialised within 2 s.*replicator.yaml.*ElasticConfig.mtc_init_timeout"):
            multi_tier(sim, mesh=slice_mesh(sim, [0]), init_timeout_seconds=2)
        assert time.monotonic() - started < 30
        assert sim.replicator.handshakes == []


def test_multi_tier_needs_a_run_name(tmp_path, monkeypatch):
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
    setting = orbax_private.HANDLER_SETTINGS["min_slice_bytes_for_replica_parallel"]
    assert getattr(type_handlers.get_type_handler(jax.Array), setting) is None  # the registered handler untouched


def test_a_leaf_saved_replica_parallel_is_prepared_so_its_first_save_compiles_nothing_in_the_loop(tmp_path, monkeypatch):
    """The bound is lowered so that a small leaf stands in for a large one. pathwaysutils runs
    each attempt under ``jax.default_device``; so does this test, since JAX caches a compile
    under the calling thread's context."""
    monkeypatch.setattr(orbax_private, "REPLICA_PARALLEL_MIN_SLICE_BYTES", 64)
    mesh = mesh_of(4)
    with jax.default_device(jax.devices()[0]):
        checkpoints = Checkpoints(str(tmp_path / "prepared"))
        state = _fresh_state(mesh, 40)
        checkpoints.precompile_saves(state)
        assert checkpoints.precompiler.done(timeout=120)
        assert _compiles_during(lambda: checkpoints.save(1, state, {"step": 1})) == 0
        checkpoints.wait()
        checkpoints.close()

        unprepared = Checkpoints(str(tmp_path / "unprepared"))
        other = _fresh_state(mesh, 56)
        assert _compiles_during(lambda: unprepared.save(1, other, {"step": 1})) > 0
        unprepared.wait()
        unprepared.close()
    assert Checkpoints(str(tmp_path / "prepared")).latest_step() == 1


@pytest.mark.slow
def test_a_preemption_while_waiting_for_a_slice_commits_the_snapshot_through_multi_tier_on_the_healthy_slices(tmp_path):
    """Pause-resume loses slice 1 for good; a real SIGTERM (``preempt@+1``) ends the wait. The
    newest snapshot is committed through a multi-tier setup re-initialised on slice 0 alone,
    and a re-run on both slices resumes from it."""
    config = ElasticConfig(
        poll_interval=0.05, timeout=60, global_batch=8, snapshot_every=2, checkpoint_every=0,
        checkpoint_kind="multi_tier",
    )
    with SimulatedSlices(2, 2, schedule="lose:1@8,preempt@+1", replicator=tmp_path) as sim:
        config = dataclasses.replace(config, checkpoint_dir=str(sim.replicator.local))
        events: list = []
        with PreemptionNotice() as notice, pytest.raises(Preempted) as stopped:
            ElasticRun(LinearProgram(), ElasticData(linear_dataset()), config, emit=events.append,
                       notice=notice, run_name="dew").run(10)
        # Snapshot 6 was taken two step boundaries before the loss, so it has landed.
        assert stopped.value.step == 6
        assert [(e.reason, e.step) for e in events if e.kind == "stop"] == [("slice_lost", 7), ("preempted", 6)]
        assert [(e.tier, e.step) for e in events if e.kind == "save" and e.tier == "checkpoint"] == [("checkpoint", 6)]
        assert [h.nodes for h in sim.replicator.handshakes] == [2, 2, 1]  # start, then slice 0 alone

        sim.restore(1)
        again: list = []
        _, step = ElasticRun(LinearProgram(), ElasticData(linear_dataset()), config, emit=again.append,
                             run_name="dew").run(10)
    assert step == 10
    resumes = [(e.source, e.step) for e in again if e.kind == "resume"]
    assert resumes == [("checkpoint", 7)]


@pytest.mark.slow
def test_replica_resize_with_multi_tier_resumes_on_the_survivors_and_scales_back_through_new_setups(tmp_path):
    """Slice 1 is lost and returns: the next attempt initialises for slice 0 alone (the manager
    of the lost slice's mesh is never called again), resumes from the multi-tier checkpoint,
    and the scale-up initialises for both."""
    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, timeout=60, global_batch=8, snapshot_every=0,
        checkpoint_every=1, checkpoint_kind="multi_tier",
    )
    with SimulatedSlices(2, 2, schedule="lose:1@4,restore:1@7", replicator=tmp_path) as sim:
        config = dataclasses.replace(config, checkpoint_dir=str(sim.replicator.local))
        events: list = []
        _, step = ElasticRun(LinearProgram(), ElasticData(linear_dataset()), config, emit=events.append,
                             run_name="dew").run(9)
        nodes = [h.nodes for h in sim.replicator.handshakes]
    assert step == 9
    resumes = [(e.source, e.step) for e in events if e.kind == "resume"]
    assert [source for source, _ in resumes] == ["fresh", "checkpoint", "live"]
    assert resumes[1][1] - 1 in (2, 3)  # the newest committed step when slice 1 was lost
    assert nodes == [2, 2, 1, 2, 2]


@pytest.mark.parametrize(("given", "refusal"), [
    (dict(kind="s3"), "invalid Checkpoints: kind='s3' must be one of orbax, multi_tier"),
    (dict(max_to_keep=0), "invalid Checkpoints: max_to_keep=0 must be >= 1"),
    (dict(timeout=0), "invalid Checkpoints: timeout=0 must be > 0 seconds, or None for automatic"),
    (dict(kind="multi_tier", run_name="r", backup_interval_minutes=0),
     "invalid Checkpoints: backup_interval_minutes=0 must be >= 1 minutes"),
    (dict(kind="multi_tier", run_name="r", init_timeout_seconds=0),
     "invalid Checkpoints: init_timeout_seconds=0 must be >= 1 seconds"),
])
def test_checkpoints_refuses_a_setting_by_the_range_elastic_config_declares_for_it(tmp_path, given, refusal):
    from elastic_dew.settings import SettingError

    with pytest.raises(SettingError) as refused:
        Checkpoints(str(tmp_path / "ck"), **given)
    assert str(refused.value) == refusal
    assert not (tmp_path / "ck").exists()


def test_the_elastic_configs_choices_are_its_fields_types():
    import typing

    from elastic_dew.elastic.config import BATCH_POLICIES, CHECKPOINT_KINDS, ElasticConfig

    hints = typing.get_type_hints(ElasticConfig)
    assert typing.get_args(hints["batch_policy"]) == BATCH_POLICIES == ("constant", "scale_by_active_slices")
    assert typing.get_args(hints["checkpoint_kind"]) == CHECKPOINT_KINDS == ("orbax", "multi_tier")


def _counting_reads(monkeypatch, directory: Path) -> dict:
    """Count the listings of ``directory`` by any caller (Orbax's included), and the reads of a
    step's commit metadata (Orbax's ``_CHECKPOINT_METADATA``) on the caller's thread and
    elastic_dew's (not those of the commit Orbax finishes in its own background thread)."""
    from etils import epath

    from elastic_dew.elastic.state import orbax_step

    counts = {"listings": 0, "commit_reads": 0}
    path_type = type(epath.Path(directory))
    iterdir, read_text = path_type.iterdir, path_type.read_text

    def counted_iterdir(self):
        if os.fspath(self) == os.fspath(directory):
            counts["listings"] += 1
        return iterdir(self)

    def counted_read_text(self, *args, **kwargs):
        reader = threading.current_thread()
        if self.name == orbax_step.ORBAX_METADATA and (reader is threading.main_thread()
                                                        or reader.name.startswith("elastic-dew")):
            counts["commit_reads"] += 1
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(path_type, "iterdir", counted_iterdir)
    monkeypatch.setattr(path_type, "read_text", counted_read_text)
    return counts


def test_a_resume_from_a_checkpoint_lists_the_directory_once_and_reads_one_commit(tmp_path, monkeypatch):
    """A new process (a new Checkpoints) over three committed steps: the resume's guess and
    its restore together list the directory once and read the newest step's commit once."""
    from elastic_dew.elastic.state.tiers import Tiers

    mesh = mesh_of(2)
    directory = tmp_path / "ck"
    writer = Checkpoints(str(directory), max_to_keep=5)
    for step in (1, 2, 3):
        assert writer.save(step, state_on(mesh, scale=step), {"step": step})
        writer.wait()
    writer.close()
    tiers = Tiers(None, Checkpoints(str(directory), max_to_keep=5), checkpoint_every=5)
    counts = _counting_reads(monkeypatch, directory)
    assert tiers.newest_known() == ("checkpoint", 3)  # the resume's guess, for its phase
    restored = tiers.restore(abstract_on(state_on(mesh), mesh))
    assert restored is not None and (restored.source, restored.step, restored.meta) == ("checkpoint", 3, {"step": 3})
    assert_same(restored.state, state_on(mesh, scale=3))
    assert counts == {"listings": 1, "commit_reads": 1}


def test_a_snapshot_newer_than_the_checkpoint_in_flight_resumes_without_waiting_for_it_or_listing(tmp_path, monkeypatch):
    from elastic_dew.elastic.state.snapshots import Snapshots
    from elastic_dew.elastic.state.tiers import Tiers

    mesh = mesh_of(2)
    directory = tmp_path / "ck"
    checkpoints = Checkpoints(str(directory))
    tiers = Tiers(Snapshots(), checkpoints, snapshot_every=1, checkpoint_every=2)
    assert tiers.newest_known() == ("fresh", None)  # the first resume's listing
    assert checkpoints.save(2, state_on(mesh, scale=2), {"step": 2})
    assert checkpoints.saving == 2
    assert tiers.snapshots.save(3, state_on(mesh, scale=3), {"step": 3}, mesh)
    counts = _counting_reads(monkeypatch, directory)
    waits: list = []
    monkeypatch.setattr(checkpoints, "wait", lambda *a, **k: waits.append(a))
    restored = tiers.restore(abstract_on(state_on(mesh), mesh))
    assert restored is not None and (restored.source, restored.step) == ("snapshot", 3)
    assert waits == [] and counts == {"listings": 0, "commit_reads": 0}
    monkeypatch.undo()
    checkpoints.wait()  # the older checkpoint still commits, in its own time
    assert checkpoints.latest_step() == 2
    checkpoints.close()
