"""Persistent checkpoints on ``gs://``, against a real Cloud Storage API (fake-gcs-server on 127.0.0.1).

Orbax writes a ``gs://`` step in place and marks it finalized with ``commit_success.txt``
(no rename), TensorStore's ``gcs`` driver writes the arrays, gcsfs the directories and
metadata, and google-cloud-storage is asked about the bucket before an old step is
deleted: every one of them runs here for real, reached through ``STORAGE_EMULATOR_HOST``
alone (the ``gcs_server`` fixture, :func:`elastic_dew.runtime.use_local_bucket`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from conftest import REPO
from elastic_dew.elastic.state import orbax_step
from elastic_dew.elastic.state.checkpoints import Checkpoints

pytestmark = pytest.mark.libraries  # the Cloud Storage clients, gcsfs and TensorStore's gcs driver


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("replica", "data"))


def _state(mesh: Mesh, scale: float) -> dict:
    sharded = NamedSharding(mesh, P("data", None))
    return {
        "params": {
            "w": jax.device_put(jnp.arange(256.0, dtype=jnp.float32).reshape(16, 16) * scale, sharded),
            "b": jax.device_put(jnp.linspace(-1, 1, 16, dtype=jnp.bfloat16) * scale, NamedSharding(mesh, P())),
        },
        "step": jax.device_put(jnp.int32(scale), NamedSharding(mesh, P())),
        "key": jax.device_put(jax.random.key(int(scale)), NamedSharding(mesh, P())),
    }


def _abstract(state: dict) -> dict:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _bits(tree: dict) -> list[bytes]:
    def raw(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x).tobytes()

    return [raw(x) for x in jax.tree.leaves(tree)]


def test_a_sharded_state_saved_to_a_bucket_restores_bit_for_bit_on_its_shardings(bucket, gcs_server):
    mesh = _mesh()
    state = _state(mesh, 3.0)
    checkpoints = Checkpoints(f"{bucket}/run/checkpoints", max_to_keep=2)
    checkpoints.save(7, state, {"step": 7, "data": {"global_next_index": 42}})
    checkpoints.wait()
    assert checkpoints.latest_step() == 7
    names = gcs_server.objects(bucket, "run/checkpoints/7/")
    assert "run/checkpoints/7/commit_success.txt" in names
    assert any(name.startswith("run/checkpoints/7/state/") for name in names), names

    restored, meta = Checkpoints(f"{bucket}/run/checkpoints").restore(7, _abstract(state))
    assert meta == {"step": 7, "data": {"global_next_index": 42}}
    assert _bits(restored) == _bits(state)
    assert restored["params"]["w"].sharding == state["params"]["w"].sharding
    assert jax.dtypes.issubdtype(restored["key"].dtype, jax.dtypes.prng_key)
    checkpoints.close()


def test_only_the_newest_max_to_keep_steps_stay_in_the_bucket(bucket, gcs_server):
    mesh = _mesh()
    checkpoints = Checkpoints(f"{bucket}/ckpt", max_to_keep=2)
    for step in (1, 2, 3, 4):
        checkpoints.save(step, _state(mesh, float(step)), {"step": step})
        checkpoints.wait()
    checkpoints.close()
    steps = {name.split("/")[1] for name in gcs_server.objects(bucket, "ckpt/")}
    assert steps == {"3", "4"}, steps  # every object of steps 1 and 2 deleted, not only listed away
    assert orbax_step.committed_checkpoint_steps(epath.Path(f"{bucket}/ckpt")) == [3, 4]


#: Saves step 1 of a sharded state to gs://, then pauses step 2's save at POINT (in Orbax's
#: own code, in its writer thread) and says so; the test SIGKILLs it there.
_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from private_names import ORBAX_STEP_CREATE, ORBAX_STEP_FINALIZE, ORBAX_STEP_METADATA_STORE, ORBAX_WRITE_TEXT
    from elastic_dew.runtime import use_local_bucket
    from elastic_dew.elastic.state.checkpoints import Checkpoints

    use_local_bucket()
    directory, point = sys.argv[1], sys.argv[2]
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    def state(value):
        return {"w": jax.device_put(jnp.full((64, 4), value, jnp.float32), NamedSharding(mesh, P("data")))}
    checkpoints = Checkpoints(directory, max_to_keep=1)
    checkpoints.save(1, state(1.0), {"step": 1})
    checkpoints.wait()

    def pause():
        print("PAUSED", point, flush=True)
        time.sleep(120)

    if point == "step-created":      # the step's metadata object exists, no arrays yet
        create = ORBAX_STEP_CREATE.get()
        async def paused_create(self):
            path = await create(self)
            getattr(self, ORBAX_STEP_METADATA_STORE.name).wait_until_finished()
            pause()
            return path
        ORBAX_STEP_CREATE.set(paused_create)
    elif point == "items-written":   # arrays and meta written, no commit timestamp
        async def paused_finalize(self):
            pause()
        ORBAX_STEP_FINALIZE.set(paused_finalize)
    elif point == "commit-recorded": # commit timestamp in the metadata, no commit_success.txt
        write_text = ORBAX_WRITE_TEXT.get()
        async def paused_write_text(path, text, *args, **kwargs):
            if path.name == "commit_success.txt" and path.parent.name.isdigit():  # the step's, not an item's
                pause()
            return await write_text(path, text, *args, **kwargs)
        ORBAX_WRITE_TEXT.set(paused_write_text)
    checkpoints.save(2, state(2.0), {"step": 2})
    checkpoints.wait()
    print("COMMITTED 2", flush=True)
    """
)


@pytest.mark.parametrize("point", ["step-created", "items-written", "commit-recorded"])
@pytest.mark.slow
def test_a_step_killed_half_written_in_a_bucket_is_skipped_and_saved_again_cleanly(bucket, gcs_server, point):
    """A real writer is SIGKILLed with step 2 half written (objects, no ``commit_success.txt``)."""
    directory = f"{bucket}/ckpt"
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}",  # the tests' seam, private_names
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, directory, point],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        line = writer.stdout.readline().strip()
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert line == f"PAUSED {point}"
    left = gcs_server.objects(bucket, "ckpt/2/")
    assert left and "ckpt/2/commit_success.txt" not in left, left
    if point == "commit-recorded":  # the window a commit-timestamp-only rule would get wrong
        assert '"commit_timestamp_nsecs": null' not in epath.Path(f"{directory}/2/_CHECKPOINT_METADATA").read_text()

    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))  # restored onto another mesh
    abstract = {"w": jax.ShapeDtypeStruct((64, 4), jnp.float32, sharding=NamedSharding(mesh, P("data")))}
    checkpoints = Checkpoints(directory, max_to_keep=1)
    assert checkpoints.latest_step() == 1
    with pytest.raises(ValueError, match="step 2 is not committed"):
        checkpoints.restore(2, abstract)
    restored, meta = checkpoints.restore(1, abstract)
    assert meta == {"step": 1}
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.ones((64, 4), np.float32))

    fresh = jax.device_put(jnp.full((64, 4), 5.0, jnp.float32), NamedSharding(mesh, P("data")))
    checkpoints.save(2, {"w": fresh}, {"step": 2})
    checkpoints.wait()
    assert checkpoints.latest_step() == 2
    restored, meta = checkpoints.restore(2, abstract)
    assert meta == {"step": 2}
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(fresh))
    checkpoints.close()
    # max_to_keep=1 deleted step 1 only after step 2 committed; nothing of the killed write is left.
    resaved = gcs_server.objects(bucket, "ckpt/")
    assert {name.split("/")[1] for name in resaved} == {"2"}
    killed_data = {name for name in left if "/ocdbt.process_0/d/" in name}  # random names per write
    assert not killed_data & set(resaved), killed_data & set(resaved)


def _one_switch_env(gcs_server, **extra: str) -> dict[str, str]:
    """This process's environment with the local bucket given by ``STORAGE_EMULATOR_HOST`` alone."""
    from elastic_dew.runtime.local_bucket import local_bucket_env

    derived = local_bucket_env({"STORAGE_EMULATOR_HOST": gcs_server.url})
    env = {key: value for key, value in os.environ.items() if key not in derived}
    env.update(gcs_server.env, PYTHONPATH=str(REPO), **extra)
    env.pop("XLA_FLAGS", None)
    return env


@pytest.mark.slow
def test_a_preempted_run_exits_143_and_the_same_command_resumes_from_its_gs_checkpoint(bucket, gcs_server, tmp_path):
    """``elastic-dew train --checkpoint-dir gs://...`` under a real SIGTERM, then the same
    command, with ``STORAGE_EMULATOR_HOST`` alone pointing every client at the local bucket."""
    from elastic_dew import record

    checkpoints = f"{bucket}/runs/a/checkpoints"
    command = [sys.executable, "-m", "elastic_dew", "train", "mlp", "--steps", "8", "--slices", "2",
               "--run-dir", str(tmp_path / "a"), "--checkpoint-dir", checkpoints, "--schedule", "preempt@4"]
    env = _one_switch_env(gcs_server)
    first = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert first.returncode == 143, first.stderr[-4000:]
    assert orbax_step.committed_checkpoint_steps(epath.Path(checkpoints)) == [4]
    second = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    events = record.read_events(tmp_path / "a")
    assert [(e["source"], e["step"]) for e in events if e["event"] == "resume"] == [("fresh", 1), ("checkpoint", 5)]
    assert [(e["reason"], e["step"]) for e in events if e["event"] == "stop"] == [("preempted", 4), ("done", 8)]
    spans = [tuple(e["examples"]) for e in record.committed_step_lines(events)]
    width = spans[0][1]  # exactly once across the two processes
    assert spans == [(width * k, width * (k + 1)) for k in range(8)]


@pytest.mark.slow
def test_a_large_state_is_committed_to_the_bucket_on_sigterm_before_the_grace_period_ends(bucket, gcs_server):
    """128 MB saved by a real preempted process; SIGKILLed at the grace period's end, as the kubelet does."""
    grace = 30.0
    checkpoints = f"{bucket}/ckpt"
    env = _one_switch_env(gcs_server, JAX_PLATFORMS="cpu", BENCH_DEVICES="1")
    worker = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.worker", "preempt", checkpoints, "128"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert worker.stdout.readline().strip() == "READY"
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait()
    finally:
        if worker.poll() is None:
            worker.kill()
    assert code == 143  # not -9: it finished inside the grace period
    steps = orbax_step.committed_checkpoint_steps(epath.Path(checkpoints))
    assert len(steps) == 1
    import orbax.checkpoint as ocp

    stored = ocp.StandardCheckpointHandler().metadata(epath.Path(f"{checkpoints}/{steps[0]}/state"))
    assert tuple(stored["w"].shape) == (128 * 2**20 // 4,)  # the whole state, float32
