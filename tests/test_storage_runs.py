"""Whole ``elastic-dew train`` runs under storage faults, restarted as a JobSet restarts them.

A bucket behind the fault proxy (``elastic_dew.testing.fault_proxy``, in front of the local
Cloud Storage server) whose uploads or reads stop answering, answer 503 and 429 storms or
refuse with 403, a bucket that does not exist, and a checkpoint directory on a small tmpfs
that fills up. Every scenario checks the invariants: nothing committed lost or
damaged, every example once, and the clean run's digest where the run completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from etils import epath

from conftest import REPO
from elastic_dew import record, rundir
from elastic_dew.elastic.state import orbax_step
from elastic_dew.testing.fault_proxy import FaultProxy, ProxyFault

pytestmark = [pytest.mark.slow, pytest.mark.libraries]

STEPS = 20
#: The storage timeout and grace window of the stall scenarios: a healthy save of this state
#: through the proxy commits in about half a second on a loaded two-core machine, so a timeout
#: ten times that is never taken for a stall (the grace window keeps a 2 s margin).
TIMEOUT = 6
GRACE = 8
#: Errors of each kind a storm injects into one process (every 3rd upload, every 4th read).
STORM = 2
#: The mlp recipe; no TensorBoard files or timeline picture, which these tests do not read
#: (about a second of each process's CPU: matplotlib and tensorboardX).
_TRAIN = ["train", "mlp", "--steps", str(STEPS), "--slices", "2", "--checkpoint-every", "5", "--log-format", "text",
          "--no-summary", "--no-tensorboard"]


def _env(**extra: str) -> dict[str, str]:
    from elastic_dew.runtime.local_bucket import local_bucket_env

    derived = local_bucket_env({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"})
    env = {key: value for key, value in os.environ.items() if key not in derived and key != "STORAGE_EMULATOR_HOST"}
    env.update(PYTHONPATH=str(REPO), **extra)
    env.pop("XLA_FLAGS", None)
    return env


def _train(run_dir: Path, *args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "elastic_dew", *_TRAIN, "--run-dir", str(run_dir), *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=run_dir.parent)
    return done, time.monotonic() - started


def _digest(run_dir: Path) -> str:
    return json.loads((run_dir / rundir.SUMMARY_FILE).read_text())["state_digest"]


def _every_example_once(run_dir: Path) -> None:
    spans = sorted(tuple(e["examples"]) for e in record.committed_step_lines(record.read_events(run_dir)))
    width = spans[0][1] - spans[0][0]
    assert spans == [(width * k, width * (k + 1)) for k in range(STEPS)], spans


@pytest.fixture(scope="module")
def clean_digest(tmp_path_factory) -> str:
    """The failure-free run's digest."""
    run_dir = tmp_path_factory.mktemp("clean") / "run"
    done, _ = _train(run_dir, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return _digest(run_dir)


ENDLESS_STORM = "test_an_endless_503_and_429_storm_abandons_nothing_and_the_preemption_keeps_the_commit_in_flight"
#: The endless storm's first process: a preemption at 12 under a 10 s no-progress deadline.
ENDLESS_STORM_ARGS = ("--storage-timeout", "10", "--grace-period", "60", "--schedule", "preempt@12")


@pytest.fixture(scope="module", autouse=True)
def endless_storm(request, gcs_server, tmp_path_factory):
    """The endless storm's first process, started with this module's first test when its test
    is selected: it spends about half a minute waiting out its clients' backoffs, so it runs
    beside the tests before its own (in a bucket, run directory and fault proxy of its own),
    and its test reads it. ``(proxy, uploads rule, reads rule, bucket, run_dir, future of
    (CompletedProcess, seconds))``, or ``None`` when its test is not selected."""
    if not any(getattr(item, "module", None) is request.module and getattr(item, "originalname", None) == ENDLESS_STORM
               for item in request.session.items):
        yield None
        return
    bucket = gcs_server.create_bucket("endless-storm")
    run_dir = tmp_path_factory.mktemp("endless-storm") / "run"
    with FaultProxy(gcs_server.url) as proxy, ThreadPoolExecutor(1) as pool:
        objects = f"{bucket[5:]}/ck/*"
        uploads = proxy.add(ProxyFault("error", method="POST", path=objects, status=503, every=3))
        reads = proxy.add(ProxyFault("error", method="GET", path=objects, status=429, every=4))
        first: Future = pool.submit(_train, run_dir, "--checkpoint-dir", f"{bucket}/ck", *ENDLESS_STORM_ARGS,
                                    env=_env(**proxy.env))
        yield proxy, uploads, reads, bucket, run_dir, first


def _objects(gcs_server, bucket: str, prefix: str) -> dict[str, str]:
    """``{name: md5}`` of the objects under ``prefix``, read from the server itself."""
    query = urllib.parse.urlencode({"prefix": prefix})
    with urllib.request.urlopen(f"{gcs_server.url}/storage/v1/b/{bucket[5:]}/o?{query}", timeout=10) as reply:
        return {item["name"]: item.get("md5Hash", "") for item in json.load(reply).get("items", [])}


def _events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in record.read_events(run_dir) if e["event"] == kind]


def _accounted(run_dir: Path, scheduled: list[int]) -> dict[int, str]:
    """What became of each scheduled checkpoint: ``committed``, or its ``storage`` event's
    outcome; a step with neither is missing from the result."""
    fate = {e["step"]: e["outcome"] for e in _events(run_dir, "storage")}
    fate.update({e["step"]: "committed" for e in _events(run_dir, "commit")})
    return {step: fate[step] for step in scheduled if step in fate}


def test_a_save_whose_uploads_stall_is_abandoned_and_the_run_finishes_with_the_clean_digest(
    fault_proxy, gcs_server, bucket, tmp_path, clean_digest
):
    """Step 10's uploads never answer: the save is abandoned once the storage had no activity
    for --storage-timeout; the loop never waits for it more than PATIENCE a checkpoint, every
    other checkpoint is committed or skipped with an event (15 may be replaced in the queue by
    20 while 10 is still held), and the run finishes with the clean digest."""
    from elastic_dew.elastic.state.tiers import PATIENCE

    name = bucket[5:]
    run_dir = tmp_path / "run"
    fault_proxy.add(ProxyFault("stall", method="POST", path=f"{name}/ck/10/*"))
    done, seconds = _train(run_dir, "--checkpoint-dir", f"{bucket}/ck", "--storage-timeout", str(TIMEOUT),
                           env=_env(**fault_proxy.env))
    assert done.returncode == 0, done.stderr[-3000:]
    abandoned = [e for e in _events(run_dir, "storage") if e["outcome"] == "abandoned"]
    assert [(e["step"], e["storage"]) for e in abandoned] == [(10, f"{bucket}/ck")]
    assert abandoned[0]["waited"] < TIMEOUT + 5  # the deadline after its last activity
    fate = _accounted(run_dir, [5, 10, 15, 20])
    assert fate in ({5: "committed", 10: "abandoned", 15: "committed", 20: "committed"},
                    {5: "committed", 10: "abandoned", 15: "skipped", 20: "committed"}), fate
    assert orbax_step.read_abandoned(run_dir) == {10}
    committed = [step for step, outcome in fate.items() if outcome == "committed"]
    assert orbax_step.committed_checkpoint_steps(epath.Path(f"{bucket}/ck"), abandoned={10}) == committed
    held = [e["seconds"] for e in _events(run_dir, "save") if e["tier"] == "checkpoint" and 10 < e["step"] < 20]
    assert held and max(held) < PATIENCE + 2, held  # never waited for the stalled save itself
    assert _digest(run_dir) == clean_digest
    _every_example_once(run_dir)


def test_a_stalled_bucket_never_hangs_a_preemption_or_a_restore_and_nothing_committed_is_lost(
    fault_proxy, gcs_server, bucket, tmp_path, clean_digest
):
    """A preemption at 17 whose save stalls exits 143 inside the grace window naming 15, the
    newest committed; the restart's reads of 15 stall (exit 1 within the timeout, naming the
    storage, the step and the timeout); the bucket healthy again, the same command resumes from
    15 to the clean digest, every example once. (A stalled save during training is the test
    above's.)"""
    name = bucket[5:]
    run_dir = tmp_path / "run"
    checkpoints = f"{bucket}/ck"
    env = _env(**fault_proxy.env)
    common = ("--checkpoint-dir", checkpoints, "--storage-timeout", str(TIMEOUT), "--grace-period", str(GRACE),
              "--schedule", "preempt@17")

    fault_proxy.add(ProxyFault("stall", method="POST", path=f"{name}/ck/17/*"))
    first, _ = _train(run_dir, *common, env=env)
    assert first.returncode == 143, first.stderr[-3000:]
    abandoned = _events(run_dir, "storage")
    assert [(e["outcome"], e["step"], e["storage"]) for e in abandoned] == [("abandoned", 17, checkpoints)], abandoned
    stop = _events(run_dir, "stop")[-1]
    fault = _events(run_dir, "fault")[-1]
    assert (stop["reason"], stop["step"]) == ("preempted", 15)
    assert stop["wall"] - fault["wall"] < GRACE  # inside the grace window, from the notice
    assert orbax_step.read_abandoned(run_dir) == {17}
    kept = _objects(gcs_server, bucket, "ck/15/")
    assert f"ck/15/commit_success.txt" in kept

    fault_proxy.clear()
    fault_proxy.release()
    fault_proxy.add(ProxyFault("stall", method="GET", path=f"{name}/ck/15/state/*"))
    second, seconds = _train(run_dir, *common, env=env)
    assert second.returncode == 1, second.stderr[-3000:]
    assert seconds < TIMEOUT + 60
    assert (f"checkpoint restore of step 15 in {checkpoints} had no activity for the storage timeout of {TIMEOUT} s"
            in second.stderr)
    assert "Traceback" not in second.stderr

    fault_proxy.clear()
    fault_proxy.release()
    third, _ = _train(run_dir, *common, env=env)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (_events(run_dir, "resume")[-1]["source"], _events(run_dir, "resume")[-1]["step"]) == ("checkpoint", 16)
    assert _digest(run_dir) == clean_digest
    _every_example_once(run_dir)
    assert {k: v for k, v in _objects(gcs_server, bucket, "ck/15/").items()} == kept  # untouched


def _storm(fault_proxy, bucket: str) -> tuple[ProxyFault, ProxyFault]:
    """A light storm from now on: every 3rd upload of a checkpoint's objects answered 503, every
    4th read of them 429, each :data:`STORM` times (the counts start afresh). The directory's
    own listing is spared: its requests go one at a time, so every 4th of them is the retry of
    the one before, and each retry waits twice as long (seconds of test time, nothing more)."""
    fault_proxy.clear()
    objects = f"{bucket[5:]}/ck/*"
    return (fault_proxy.add(ProxyFault("error", method="POST", path=objects, status=503, every=3, times=STORM)),
            fault_proxy.add(ProxyFault("error", method="GET", path=objects, status=429, every=4, times=STORM)))


def test_a_503_and_429_storm_through_a_preemption_and_a_resume_ends_at_the_clean_digest(
    fault_proxy, bucket, tmp_path, clean_digest
):
    """Each process meets a light storm (every 3rd upload of the checkpoint's objects 503,
    every 4th read of them 429, metadata and arrays alike): the clients retry them all,
    elastic_dew abandons nothing, and the preempted run's same command resumes from its
    checkpoint to the clean digest."""
    run_dir = tmp_path / "run"
    env = _env(**fault_proxy.env)
    args = ("--checkpoint-dir", f"{bucket}/ck", "--schedule", "preempt@12")
    storms = [_storm(fault_proxy, bucket)]
    first, _ = _train(run_dir, *args, env=env)
    assert first.returncode == 143, first.stderr[-3000:]
    storms.append(_storm(fault_proxy, bucket))
    second, _ = _train(run_dir, *args, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert [(uploads.fired, reads.fired) for uploads, reads in storms] == [(STORM, STORM)] * 2
    # every error retried by the clients, no save given up; each checkpoint committed or skipped with an event
    assert [e for e in _events(run_dir, "storage") if e["outcome"] != "skipped"] == []
    fate = _accounted(run_dir, [5, 10, 12, 15, 20])
    assert set(fate) == {5, 10, 12, 15, 20} and fate[20] == "committed", fate
    assert _events(run_dir, "resume")[-1]["source"] == "checkpoint"
    assert _digest(run_dir) == clean_digest
    _every_example_once(run_dir)


def test_an_endless_503_and_429_storm_abandons_nothing_and_the_preemption_keeps_the_commit_in_flight(
    endless_storm, clean_digest
):
    """The storm issue 40 reported, without end: every 3rd upload of the checkpoint's objects
    503, every 4th read 429, each retried by its client after a backoff, so commits take tens
    of seconds while every request is answered within seconds. Under a 10 s no-progress
    deadline nothing is abandoned; every scheduled checkpoint is committed or skipped with an
    event; the preemption at 12 lets the commit in flight finish and its stop names the newest
    committed step, which the re-run (the storm over) resumes from to the clean digest. (The
    first process starts with the module: :func:`endless_storm`.)"""
    fault_proxy, uploads, reads, bucket, run_dir, started = endless_storm
    env = _env(**fault_proxy.env)
    checkpoints = f"{bucket}/ck"
    args = ("--checkpoint-dir", checkpoints, *ENDLESS_STORM_ARGS)
    first, seconds = started.result()
    assert first.returncode == 143, first.stderr[-3000:]
    fault_proxy.clear()
    assert uploads.fired >= 10 and reads.fired >= 1, (uploads.fired, reads.fired)
    assert [e for e in _events(run_dir, "storage") if e["outcome"] == "abandoned"] == []
    fate = _accounted(run_dir, [5, 10, 12])
    assert fate.get(5) == "committed" and set(fate.values()) <= {"committed", "skipped"}, fate
    assert 10 in fate, fate  # committed, or skipped with an event naming it
    commits = [e for e in _events(run_dir, "commit")]
    stop = _events(run_dir, "stop")[-1]
    newest = max(e["step"] for e in commits)
    assert (stop["reason"], stop["step"]) == ("preempted", newest), (stop, commits)
    assert newest in orbax_step.committed_checkpoint_steps(epath.Path(checkpoints))
    storage = record.summarize(record.read_events(run_dir))["storage"]
    assert storage["committed"] == len(commits) and storage["abandoned"] == 0 and storage["retries"] >= 10, storage
    assert max(storage["commit_seconds"]) > 10  # slow (longer than the deadline), never stuck
    assert 0 <= storage["waited_seconds"] < seconds
    second, _ = _train(run_dir, *args, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (_events(run_dir, "resume")[-1]["source"], _events(run_dir, "resume")[-1]["step"]) == ("checkpoint", newest + 1)
    assert _digest(run_dir) == clean_digest
    _every_example_once(run_dir)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "ERROR" in line]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_uploads_refused_403_stop_the_run_at_its_first_save_with_one_line_naming_the_storage_and_the_fix(
    fault_proxy, gcs_server, bucket, tmp_path
):
    """A refusal that saving again does not fix: the run stops at its first checkpoint (step
    5), not after --max-failed-saves cadences of training with nothing durable."""
    run_dir = tmp_path / "run"
    fault_proxy.add(ProxyFault("error", method="POST", status=403))
    done, _ = _train(run_dir, "--checkpoint-dir", f"{bucket}/ck", env=_env(**fault_proxy.env))
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert (f"checkpoint saves to {bucket}/ck cannot succeed" in line and "permission was refused" in line
            and "roles/storage.objectUser" in line and "no checkpoint is committed" in line), line
    assert [(e["outcome"], e["step"]) for e in _events(run_dir, "storage")] == [("abandoned", 5)]
    assert max(e["step"] for e in _events(run_dir, "step")) <= 10  # stopped before a second save
    assert gcs_server.objects(bucket) == []
    assert "still waiting on the storage" not in done.stderr  # the refused save had ended


def test_a_bucket_that_does_not_exist_stops_the_run_before_its_directory_is_written(fault_proxy, tmp_path):
    run_dir = tmp_path / "run"
    directory = "gs://no-such-bucket-anywhere/ck"
    done, _ = _train(run_dir, "--checkpoint-dir", directory, env=_env(**fault_proxy.env))
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_error_line(done.stderr)
    assert (f"checkpoint listing in {directory} failed: the bucket or directory does not exist" in line
            and "create it, or give the --checkpoint-dir that exists" in line), line
    assert not run_dir.exists() and "storage.log" not in line  # no pointer to a file never written
    assert "still waiting on the storage" not in done.stderr  # nothing was: the listing failed


def test_a_full_checkpoint_disk_ends_the_run_with_one_clear_error_and_space_again_resumes_it(tmp_path, clean_digest):
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "fill").write_bytes(b"\0" * (free - 110 * 1024))  # room for one checkpoint (~72 KiB)
        run_dir = tmp_path / "run"
        args = ("--checkpoint-dir", str(disk / "ck"), "--max-failed-saves", "2")
        first, _ = _train(run_dir, *args, env=_env())
        assert first.returncode == 1, first.stderr[-3000:]
        ours = "\n".join(line for line in first.stderr.splitlines() if " elastic_dew" in line)
        assert "Traceback" not in first.stderr and "Task exception" not in first.stderr, ours + first.stderr[-2000:]
        assert (f"checkpoint saves to {disk / 'ck'} keep failing (2 saves in a row" in first.stderr
                and "the disk is full" in first.stderr and "the newest committed checkpoint is step 5" in first.stderr), (
            first.stderr[-3000:])
        assert (run_dir / rundir.STORAGE_LOG).read_text().count("Traceback") >= 1  # the details are kept
        assert orbax_step.committed_checkpoint_steps(disk / "ck") == [5]

        (disk / "fill").unlink()
        second, _ = _train(run_dir, *args, env=_env())
        assert second.returncode == 0, second.stderr[-3000:]
        assert (_events(run_dir, "resume")[-1]["source"], _events(run_dir, "resume")[-1]["step"]) == ("checkpoint", 6)
        assert _digest(run_dir) == clean_digest
        _every_example_once(run_dir)
        assert orbax_step.committed_checkpoint_steps(disk / "ck") == [10, 15, 20]  # max_to_keep=3 retires 5
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
