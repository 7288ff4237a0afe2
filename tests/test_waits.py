"""Waits that end: a paused run that gets its slice back, schedules that can never fire,
SIGTERM while waiting for slices, a hung step, an error that is not a slice loss, the wait's
timeout, and where the persistent tier may write under Pathways persistence.

Trainings run as real subprocesses (``python -m elastic_dew train mlp ...``) on simulated
slices (TPU slices cannot exist here), so exit statuses and signals are real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastic_dew import cli, record, run
from elastic_dew.run import planning
from elastic_dew.elastic.config import ElasticConfig

from faultlib import turns as turns_of

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("JOBSET_NAME", None)
    return env


def _command(run_dir: Path, steps: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "elastic_dew", "train", "mlp", "--steps", str(steps),
            "--run-dir", str(run_dir), *args]


def _train(run_dir: Path, steps: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(_command(run_dir, steps, *args), capture_output=True, text=True,
                          timeout=240, cwd=run_dir.parent, env=_env())


def _status(proc: subprocess.CompletedProcess, expected: int) -> subprocess.CompletedProcess:
    assert proc.returncode == expected, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def test_the_chaos_flags_help_names_time_keyed_faults_hang_and_error(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    chaos = " ".join(capsys.readouterr().out.split("--schedule SCHEDULE")[-1].split("--run-dir")[0].split())
    for text in ("@+SECONDS", "restore:3@+3", "hang (the slice stops answering)", "error (a runtime error"):
        assert text in chaos, chaos


@pytest.mark.slow
def test_a_hung_slice_past_the_step_timeout_is_a_loss_and_a_paused_run_finishes_on_four_slices_once_it_returns(
        tmp_path):
    """The run needs every slice: it waits for slice 3 after the step deadline (1 s) declares
    the hung slice lost (it returns 2 s after the hang), and again after slice 3 is lost at
    step 17 (it returns 3 s later); it finishes on four slices."""
    run_dir = tmp_path / "r"
    schedule = "hang:3@10,restore:3@+2,lose:3@17,restore:3@+3"
    proc = _status(_train(run_dir, 30, "--schedule", schedule, "--step-timeout", "1"), 0)
    assert "DEADLINE_EXCEEDED" in proc.stderr
    turns = turns_of(run_dir)
    assert ("stop", "slice_lost", 9) in turns and ("stop", "slice_lost", 16) in turns
    assert turns[-1] == ("stop", "done", 30)
    steps = [e for e in record.read_events(run_dir) if e["event"] == "step"]
    assert steps[-1]["step"] == 30 and steps[-1]["slices"] == 4


def test_a_return_keyed_to_a_step_a_paused_run_cannot_reach_is_refused_before_anything_runs(tmp_path, capsys):
    run_dir = tmp_path / "r"
    argv = ["train", "mlp", "--steps", "60", "--run-dir", str(run_dir), "--schedule", "lose:3@17,restore:3@35"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "restore:3@35/step can never fire" in err
    assert "restore:3@+3" in err
    assert "carry on without it with --min-slices 3" in err  # the console words the setting
    assert not run_dir.exists()


@pytest.mark.slow
def test_sigterm_while_waiting_for_a_slice_exits_143_and_the_rerun_resumes_from_the_snapshot(tmp_path):
    run_dir = tmp_path / "r"
    command = _command(run_dir, 30, "--schedule", "lose:3@17", "--snapshot-every", "5", "--timeout", "200")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=tmp_path, env=_env())
    try:
        deadline = time.monotonic() + 180
        while ("stop", "slice_lost", 16) not in turns_of(run_dir):
            assert process.poll() is None, process.communicate()[1][-4000:]
            assert time.monotonic() < deadline, "the run never started waiting for slice 3"
            time.sleep(0.2)
        time.sleep(1.0)  # well inside the wait for slice 3, which never comes
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143, stderr[-4000:]
    assert took < 30, f"exiting took {took:.1f} s"
    saves = [e for e in record.read_events(run_dir) if e["event"] == "save" and e["tier"] == "checkpoint"]
    assert [e["step"] for e in saves] == [15]
    assert ("stop", "preempted", 15) in turns_of(run_dir)

    _status(_train(run_dir, 30, "--schedule", "lose:3@17", "--snapshot-every", "5", "--timeout", "200"), 0)
    turns = turns_of(run_dir)
    assert ("resume", "checkpoint", 16) in turns
    assert turns[-1] == ("stop", "done", 30)


@pytest.mark.slow
def test_a_sigterm_just_before_a_slice_loss_ends_the_wait_at_once_and_commits_the_snapshot(tmp_path):
    """The notice is pending when the wait begins (its step boundary never came): the wait
    must end at once, as a SIGTERM during it does, not after ``--timeout``, with the
    snapshot's step committed. (That a rerun resumes from the step such a stop commits is
    the test above's second half.)"""
    run_dir = tmp_path / "r"
    args = ("--schedule", "preempt@17,lose:3@17", "--timeout", "60", "--snapshot-every", "5")
    proc = _status(_train(run_dir, 30, *args), 143)
    assert "no checkpoint was committed" not in proc.stderr
    turns = turns_of(run_dir)
    assert turns[-2:] == [("stop", "slice_lost", 16), ("stop", "preempted", 15)]
    saves = [e["step"] for e in record.read_events(run_dir) if e["event"] == "save" and e["tier"] == "checkpoint"]
    assert saves == [15]


@pytest.mark.slow
def test_an_error_that_is_not_a_slice_loss_fails_the_run_without_a_retry(tmp_path):
    run_dir = tmp_path / "r"
    proc = _status(_train(run_dir, 30, "--schedule", "error@12"), run.FAILED_EXIT)
    assert "INVALID_ARGUMENT" in proc.stderr and "not retried" in proc.stderr
    turns = turns_of(run_dir)
    assert not [t for t in turns if t[1] == "slice_lost"]
    assert [t for t in turns if t[0] == "resume"] == [("resume", "fresh", 1)]


@pytest.mark.slow
def test_the_timeout_ends_a_wait_for_a_slice_that_never_returns(tmp_path):
    run_dir = tmp_path / "r"
    started = time.monotonic()
    proc = _status(_train(run_dir, 30, "--schedule", "lose:3@5", "--timeout", "2"), run.FAILED_EXIT)
    assert time.monotonic() - started < 200
    assert "waited timeout=2.0 s" in proc.stderr
    assert ("stop", "slice_lost", 4) in turns_of(run_dir)


@pytest.fixture
def persistence(monkeypatch):
    """Pathways persistence on (the environment the rendered controller sets); no Pathways
    server is needed: planning a run touches nothing."""
    monkeypatch.setenv("JAX_PLATFORMS", "proxy")
    monkeypatch.setenv("ENABLE_PATHWAYS_PERSISTENCE", "1")


def test_a_local_checkpoint_directory_under_pathways_persistence_is_refused(persistence, tmp_path):
    with pytest.raises(run.UsageError, match="is not a gs:// URL.*TPU workers write"):
        planning.plan_run(run.RunConfig(recipe="mlp", run_dir=str(tmp_path / "r")))
    local = ElasticConfig(global_batch=24, checkpoint_dir="/gcs/runs/x/checkpoints")
    with pytest.raises(run.UsageError, match="checkpoint_dir=/gcs/runs/x/checkpoints is not a gs:// URL"):
        planning.plan_run(run.RunConfig(recipe="mlp", run_dir=str(tmp_path / "r"), elastic=local))
    assert not (tmp_path / "r").exists()


def test_a_gs_checkpoint_directory_under_pathways_persistence_is_accepted(persistence, tmp_path):
    bucket = ElasticConfig(global_batch=24, checkpoint_dir="gs://bucket/runs/x/checkpoints")
    planned = planning.plan_run(run.RunConfig(recipe="mlp", run_dir=str(tmp_path / "r"), elastic=bucket))
    assert planned.elastic.checkpoint_dir == "gs://bucket/runs/x/checkpoints"
    assert not planned.simulate


def test_a_gs_checkpoint_directory_without_persistence_is_accepted_too(tmp_path):
    bucket = ElasticConfig(global_batch=24, checkpoint_dir="gs://bucket/runs/x/checkpoints")
    assert planning.plan_run(run.RunConfig(recipe="mlp", run_dir=str(tmp_path / "r"), elastic=bucket)).elastic.checkpoint_dir == "gs://bucket/runs/x/checkpoints"
