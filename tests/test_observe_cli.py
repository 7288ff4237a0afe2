"""``elastic-dew train``'s observability options, end to end on simulated slices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO
from elastic_dew import cli

pytestmark = pytest.mark.slow


def _train(run_dir, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("JOBSET_NAME", None)
    return subprocess.run(
        [sys.executable, "-m", "elastic_dew", "train", "mlp", "--steps", "4",
         "--run-dir", str(run_dir), *args],
        capture_output=True, text=True, timeout=240, cwd=run_dir.parent, env=env,
    )


def test_a_piped_run_logs_json_lines_and_writes_tensorboard_files_with_its_goodput(tmp_path):
    run_dir = tmp_path / "run"
    proc = _train(run_dir)  # --log-format auto, and stderr is a pipe here
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    ours = [line for line in lines if line["logger"].startswith("elastic_dew")]
    assert ours and all(line["severity"] in ("INFO", "WARNING") for line in ours)
    assert any("4 simulated slices" in line["message"] for line in ours)
    assert any(line.get("step") == 4 for line in lines)  # the context follows the steps
    summary = json.loads((run_dir / "summary.json").read_text())
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [s.step for s in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    assert acc.Scalars("goodput/goodput")[0].value == pytest.approx(summary["goodput"])


def test_text_logs_and_no_tensorboard_on_request(tmp_path):
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "--log-format", "text", "--no-tensorboard")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert " INFO elastic_dew.run.execution: training " in proc.stderr
    assert not any(line.startswith("{") for line in proc.stderr.splitlines())
    assert not (run_dir / "tensorboard").exists()


def test_an_unknown_log_format_is_refused_with_exit_2_before_the_run_directory_exists(tmp_path, capsys):
    # In this process: the refusal comes from the command line, before JAX or the run starts.
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "mlp", "--steps", "4", "--run-dir", str(tmp_path / "run"), "--log-format", "yaml"])
    assert exited.value.code == 2
    assert "error: argument --log-format: invalid choice: 'yaml'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
