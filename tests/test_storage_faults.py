"""When the storage misbehaves: every checkpoint call bounded, abandoned saves fenced, failures worded.

Against the real Cloud Storage API (fake-gcs-server on 127.0.0.1 behind the fault proxy,
``elastic_dew.testing.fault_proxy``) and real small file systems (tmpfs mounts, full or
remounted read-only: the suite runs as root, where file permissions prove nothing). Orbax's
real ``CheckpointManager``, TensorStore, gcsfs and google-cloud-storage do the writing.
The whole runs of the command line under these faults are in ``tests/test_storage_runs.py``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew.elastic.state import orbax_step
from elastic_dew.elastic.state import storage, storage_clients
from elastic_dew.elastic.state.checkpoints import Checkpoints, StorageError, StorageTimeout
from elastic_dew.testing.fault_proxy import ProxyFault
from elastic_dew.testing.waits import poll

pytestmark = pytest.mark.libraries


def _state(value: float) -> dict:
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    return {"w": jax.device_put(jnp.full((64, 4), value, jnp.float32), NamedSharding(mesh, P("data")))}


def _abstract() -> dict:
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    return {"w": jax.ShapeDtypeStruct((64, 4), jnp.float32, sharding=NamedSharding(mesh, P("data")))}


@contextlib.contextmanager
def _through(proxy):
    """This process's Cloud Storage clients reach the bucket through ``proxy``."""
    from elastic_dew.runtime import use_local_bucket

    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")}
    os.environ["STORAGE_EMULATOR_HOST"] = os.environ["TENSORSTORE_GCS_HTTP_URL"] = proxy.url
    use_local_bucket()
    import gcsfs

    gcsfs.GCSFileSystem.clear_instance_cache()  # a cached file system keeps its endpoint
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        gcsfs.GCSFileSystem.clear_instance_cache()


def test_a_save_whose_uploads_stall_is_abandoned_at_its_timeout_and_its_late_release_is_never_restored(
    fault_proxy, bucket, tmp_path
):
    directory = f"{bucket}/ck"
    with _through(fault_proxy):
        checkpoints = Checkpoints(directory, timeout=60, record_dir=tmp_path, max_to_keep=10)
        checkpoints.save(1, _state(1.0), {"step": 1})
        checkpoints.wait()
        checkpoints.timeout = 2.0  # after the first save, which compiles and opens the clients
        fault_proxy.add(ProxyFault("stall", method="POST", path=f"{bucket[5:]}/ck/2/*"))
        assert checkpoints.save(2, _state(2.0), {"step": 2})
        started = time.monotonic()
        failure = checkpoints.wait_or_abandon()
        waited = time.monotonic() - started
        assert isinstance(failure, StorageTimeout) and waited < 2.0 + 5, (failure, waited)  # the timeout, not the stall, ended it
        assert f"step 2 in {directory}" in str(failure) and "2 s" in str(failure)
        assert checkpoints.failures() == [failure]
        assert orbax_step.read_abandoned(tmp_path) == {2}

        fault_proxy.clear()
        fault_proxy.release()  # the late release: Orbax's writer goes on and commits step 2
        assert poll(lambda: orbax_step.committed(epath.Path(directory) / "2"), 30)
        assert checkpoints.latest_step() == 1
        again = Checkpoints(directory, timeout=2.0, record_dir=tmp_path, max_to_keep=10)
        assert again.latest_step() == 1  # another process honours the record
        with pytest.raises(ValueError, match="abandoned"):
            again.restore(2, _abstract())
        assert not checkpoints.save(2, _state(2.0), {"step": 2})  # never saved over the orphan
        checkpoints.timeout = 60
        assert checkpoints.save(3, _state(3.0), {"step": 3})  # a fresh manager: the next save commits
        checkpoints.wait()
        assert checkpoints.latest_step() == 3
        restored, meta = again.restore(1, _abstract())
        assert meta == {"step": 1} and float(restored["w"][0, 0]) == 1.0
        checkpoints.close()
        again.close()


def test_a_commit_whose_uploads_are_slow_but_answered_outlasts_the_storage_timeout_and_commits(
    fault_proxy, bucket, tmp_path
):
    """Every upload of step 2's arrays is held 0.5 s before it is answered: the commit takes
    several times the 1.5 s storage timeout, but the storage never goes 1.5 s without
    answering, so nothing is abandoned (a total timeout of 1.5 s would have given it up)."""
    directory = f"{bucket}/ck"
    with _through(fault_proxy):
        checkpoints = Checkpoints(directory, timeout=60, record_dir=tmp_path, max_to_keep=10)
        checkpoints.save(1, _state(1.0), {"step": 1})
        checkpoints.wait()
        checkpoints.timeout = 1.5
        fault_proxy.add(ProxyFault("stall", method="POST", path=f"{bucket[5:]}/ck/2/state/*", seconds=0.5))
        before = storage.METER.counters()
        started = time.monotonic()
        assert checkpoints.save(2, _state(2.0), {"step": 2})
        failure = checkpoints.wait_or_abandon()
        took = time.monotonic() - started
        moved = storage.METER.counters() - before
        assert failure is None and checkpoints.failures() == [], failure
        assert took > 3 * 1.5, took  # slow: longer than the timeout many times over
        assert len(fault_proxy.requests("stall")) >= 6 and moved.answered >= 6 and moved.nbytes > 0, moved
        assert checkpoints.latest_step() == 2 and checkpoints.abandoned == set()
        assert orbax_step.read_abandoned(tmp_path) == set()
        fault_proxy.clear()
        checkpoints.close()


def test_a_checkpoint_due_during_a_slow_commit_is_queued_not_waited_for_and_one_newer_takes_its_place(
    fault_proxy, bucket, tmp_path
):
    """Each upload of a checkpoint's arrays is held 0.5 s (a commit of several seconds): a
    checkpoint due meanwhile holds the loop at most PATIENCE, then waits in the queue; a
    newer one due takes its place (the older skipped, with an event naming its step and why);
    the queued one starts at the first step boundary after the commit ends, and both
    commits are events with their seconds."""
    from elastic_dew.elastic.events import Commit, Save, Storage
    from elastic_dew.elastic.state.tiers import PATIENCE, Tiers

    directory = f"{bucket}/ck"
    with _through(fault_proxy):
        checkpoints = Checkpoints(directory, timeout=30, record_dir=tmp_path, max_to_keep=10)
        checkpoints.save(1, _state(1.0), {"step": 1})
        checkpoints.wait()
        checkpoints.committed_saves()  # step 1's, before the tier
        events: list = []
        tier = Tiers(None, checkpoints, checkpoint_every=5, emit=events.append)
        fault_proxy.add(ProxyFault("stall", method="POST", path=f"{bucket[5:]}/ck/*/state/*", seconds=0.5))

        def step(n: int) -> Save | None:
            saves = len([e for e in events if isinstance(e, Save)])
            tier.on_step(n, _state(float(n)), {"step": n}, None)
            new = [e for e in events if isinstance(e, Save)][saves:]
            return new[-1] if new else None

        assert step(5).taken
        queued = step(10)
        assert (queued.step, queued.taken) == (10, False) and queued.seconds < PATIENCE + 1.5, queued
        replaced = step(15)
        assert (replaced.step, replaced.taken) == (15, False) and replaced.seconds < PATIENCE + 1.5, replaced
        assert tier.queued[0] == 15 and checkpoints.saving == 5
        for _ in range(300):  # step 16's boundary, until the queued one starts
            if checkpoints.saving != 5:
                break
            step(16)
            time.sleep(0.1)
        assert checkpoints.saving == 15 and tier.queued is None, [(type(e).__name__, e.step) for e in events]
        assert tier.save_final(15, _state(15.0), {"step": 15}) is None  # 15 commits: nothing more to save
        fault_proxy.clear()
    skipped = [e for e in events if isinstance(e, Storage)]
    assert [(e.outcome, e.step) for e in skipped] == [("skipped", 10)]
    assert "step 15 took its place in the queue behind the commit of step 5" in skipped[0].error
    assert [(e.step, e.taken) for e in events if isinstance(e, Save)] == [(5, True), (10, False), (15, False), (15, True)]
    commits = [e for e in events if isinstance(e, Commit)]
    assert [c.step for c in commits] == [5, 15] and all(c.seconds > PATIENCE and c.nbytes > 0 for c in commits), commits
    assert checkpoints.latest_step() == 15 and checkpoints.abandoned == set()
    checkpoints.close()


def test_a_restore_whose_reads_stall_raises_naming_the_storage_step_and_timeout_and_reads_no_more(
    fault_proxy, bucket
):
    directory = f"{bucket}/ck"
    with _through(fault_proxy):
        checkpoints = Checkpoints(directory, timeout=60)
        checkpoints.save(4, _state(4.0), {"step": 4})
        checkpoints.wait()
        checkpoints.timeout = 1.5
        fault_proxy.add(ProxyFault("stall", method="GET", path=f"{bucket[5:]}/ck/4/state/*"))
        started = time.monotonic()
        with pytest.raises(StorageTimeout) as stalled:
            checkpoints.restore(4, _abstract())
        assert time.monotonic() - started < 1.5 + 5  # the timeout ended it, not the stall
        message = str(stalled.value)
        assert f"checkpoint restore of step 4 in {directory}" in message and "1.5 s" in message
        held = len(fault_proxy.requests("stall"))
        assert checkpoints.stalled and checkpoints.newest_known() == 4  # answered from memory
        assert len(fault_proxy.requests("stall")) == held
        fault_proxy.clear()
        fault_proxy.release()


def test_uploads_refused_403_fail_the_save_at_once_naming_the_permission(fault_proxy, bucket):
    directory = f"{bucket}/ck"
    with _through(fault_proxy):
        checkpoints = Checkpoints(directory, timeout=30)
        fault_proxy.add(ProxyFault("error", method="POST", status=403))
        started = time.monotonic()
        checkpoints.save(1, _state(1.0), {"step": 1})
        failure = checkpoints.wait_or_abandon()
        assert time.monotonic() - started < 10
    assert isinstance(failure, StorageError) and not isinstance(failure, StorageTimeout)
    assert "permission was refused" in str(failure) and directory in str(failure)
    assert checkpoints.abandoned == set()  # a failed write has ended: nothing to fence
    assert checkpoints.latest_step() is None


def test_a_bucket_that_does_not_exist_is_an_error_at_the_first_listing_not_an_empty_directory(gcs_server):
    directory = "gs://no-such-bucket-anywhere/ck"
    started = time.monotonic()
    with pytest.raises(StorageError) as missing:
        Checkpoints(directory, timeout=30)
    assert time.monotonic() - started < 10
    assert f"checkpoint listing in {directory} failed: the bucket or directory does not exist" in str(missing.value)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str = "1m"):
    """A small tmpfs at ``path`` (we run as root), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_disk_and_a_read_only_one_fail_the_save_naming_the_cause_and_keep_what_is_committed(tmp_path):
    with _tmpfs(tmp_path / "disk") as disk:
        checkpoints = Checkpoints(str(disk / "ck"), timeout=30, max_to_keep=10)
        checkpoints.save(1, _state(1.0), {"step": 1})
        checkpoints.wait()
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "fill").write_bytes(b"\0" * (free - 4096))
        checkpoints.save(2, _state(2.0), {"step": 2})
        full = checkpoints.wait_or_abandon()
        assert isinstance(full, StorageError) and "the disk is full" in str(full), full
        (disk / "fill").unlink()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        checkpoints.save(3, _state(3.0), {"step": 3})
        read_only = checkpoints.wait_or_abandon() or checkpoints.failures()[-1]
        assert "read-only" in str(read_only), read_only
        assert checkpoints.latest_step() == 1
        restored, meta = checkpoints.restore(1, _abstract())
        assert meta == {"step": 1} and float(restored["w"][0, 0]) == 1.0
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        # The failed writes' futures are collected here, inside the diversion a run has: their
        # "exception was never retrieved" records go to the log file, not to pytest's end.
        with storage_clients.divert_library_errors(tmp_path / "storage.log"):
            checkpoints.close()
            gc.collect()
