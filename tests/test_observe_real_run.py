"""A real run's record fed to both goodput calculators, and a real run's log lines.

The training runs as real subprocesses (``python -m elastic_dew train mlp``) on simulated
slices (TPU slices cannot exist here): the first is killed by its fault schedule (SIGKILL,
an abrupt preemption with no stop line), and the same command is run again after a sleep,
so the record has a real gap between processes. ml-goodput-measurement's calculator reads
the entries through the in-memory logger of ``test_observe_goodput`` (Cloud Logging cannot
be reached from a test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ml_goodput_measurement.src import goodput_elastic, goodput_utils

from elastic_dew.observe.goodput_export import GoodputExport
from elastic_dew.record.goodput import account, summarize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_observe_goodput import MemoryLogger  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GAP = 3.0
CHAOS = "lose:3@5,restore:3@+1,kill@25"


def _train(run_dir: Path, status: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("JOBSET_NAME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "train", "mlp", "--steps", "40", "--run-dir",
         str(run_dir), "--chaos", CHAOS, "--checkpoint-every", "10", "--log-format", "json",
         "--no-tensorboard"],
        capture_output=True, text=True, timeout=240, cwd=run_dir.parent, env=env,
    )
    assert proc.returncode == status, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def killed_and_rerun(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("real") / "r"
    first = _train(run_dir, -9)
    time.sleep(GAP)  # the pod waiting to be rescheduled
    second = _train(run_dir, 0)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return events, first.stderr + second.stderr


def _library(events, cache_dir):
    memory = MemoryLogger()
    export = GoodputExport("run", cloud_logger=memory, total_slices=4)
    for event in events:
        export(event)
    export.close()
    calculator = goodput_elastic.ElasticGoodputCalculator(
        "run", "goodput_run", cloud_logger=memory, using_pathways=True, cache_dir=str(cache_dir)
    )
    goodput, badput, _ = calculator.get_job_goodput(include_badput_breakdown=True)
    total = calculator._get_total_job_time(goodput_utils.datetime.datetime.now(
        goodput_utils.datetime.timezone.utc))
    return goodput, {k.name.lower(): v * total / 100 for k, v in badput.items()
                     if isinstance(v, float)}, total


def test_both_calculators_see_a_real_runs_wall_time_gap_and_lost_progress_alike(
    killed_and_rerun, tmp_path
):
    """On a real record the two agree on the span, the gap and the re-done steps; goodput
    itself differs by what only the library counts as productive (see docs/observability.md:
    data waits and host time between steps, and a step's saves made again after the kill
    are averaged by the library)."""
    events, _ = killed_and_rerun
    ours = account(events)
    summary = summarize(events)
    assert summary["processes"] == 2 and summary["final_step"] == 40
    goodput, badput, total = _library(events, tmp_path)
    assert total == pytest.approx(ours.wall_seconds, rel=1e-3)
    gap = ours.badput["infrastructure_recovery_from_disruption"]
    assert gap > GAP / 2  # process_start is the OS's start time, to a clock tick
    assert badput["infrastructure_recovery_from_disruption"] == pytest.approx(gap, rel=0.1)
    assert ours.badput["wasted_progress_from_disruption"] > 0
    assert badput["wasted_progress_from_disruption"] > 0
    assert 0 < 100 * ours.goodput <= goodput


def test_a_handled_slice_loss_is_a_warning_in_the_json_logs(killed_and_rerun):
    _, stderr = killed_and_rerun
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    detected = [line for line in lines if line["message"].startswith("Elastic event detected")]
    assert detected, "pathwaysutils logged no slice loss"
    assert {line["severity"] for line in detected} == {"WARNING"}
    assert "Traceback" in detected[0]["message"]  # the traceback stays
