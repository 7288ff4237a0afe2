"""Real runs' records fed to both goodput calculators, and a real run's log lines.

The training runs as real subprocesses (``python -m elastic_dew train mlp``) on simulated
slices (TPU slices cannot exist here): the first process is stopped by its fault schedule,
either killed (SIGKILL, an abrupt preemption with no stop line) or preempted gracefully
(``preempt@N``: the stopped step is checkpointed, exit 143), and the same command is run
again after a sleep, so the record has a real gap between processes. ml-goodput-measurement's
calculator reads the entries the export writes through the in-memory logger of
``test_observe_goodput`` (Cloud Logging cannot be reached from a test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from elastic_dew import record
from elastic_dew.record.goodput import account, summarize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goodputlib import library_breakdown, library_only_rules  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
GAP = 3.0
SCHEDULES = {
    "killed": ("lose:3@5,restore:3@+1,kill@25", -9),
    "preempted": ("preempt@25", 143),
}


def _train(run_dir: Path, chaos: str, status: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("JOBSET_NAME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "train", "mlp", "--steps", "40", "--run-dir",
         str(run_dir), "--schedule", chaos, "--checkpoint-every", "10", "--log-format", "json",
         "--no-tensorboard"],
        capture_output=True, text=True, timeout=240, cwd=run_dir.parent, env=env,
    )
    assert proc.returncode == status, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"
    return proc


def _stopped_and_rerun(kind: str, tmp_path_factory):
    chaos, status = SCHEDULES[kind]
    run_dir = tmp_path_factory.mktemp(kind) / "r"
    first = _train(run_dir, chaos, status)
    time.sleep(GAP)  # the pod waiting to be rescheduled
    second = _train(run_dir, chaos, 0)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return events, first.stderr + second.stderr, run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Both scenarios of :data:`SCHEDULES`, run side by side (each in its own run directory,
    its processes one after the other, their sleeps overlapping): ``{kind: finished future}``,
    whose result is ``(events, stderr, run_dir)``; a scenario that failed fails only the
    tests that read it."""
    with ThreadPoolExecutor(len(SCHEDULES)) as pool:
        return {kind: pool.submit(_stopped_and_rerun, kind, tmp_path_factory) for kind in SCHEDULES}


@pytest.fixture(scope="module")
def killed(runs):
    return runs["killed"].result()


@pytest.fixture(scope="module")
def preempted(runs):
    return runs["preempted"].result()


@pytest.mark.parametrize("kind", sorted(SCHEDULES))
def test_the_library_reads_a_real_run_as_elastic_dew_does_but_for_its_two_own_rules(
    kind, request, tmp_path
):
    """Both calculators agree on the wall time, the gap and the re-done steps, and the
    library's goodput is elastic_dew's moved by exactly its first-step and last-step rules
    (``library_only_rules``, docs/observability.md): nothing else of the run reaches it
    differently. How far those two rules move it depends on how long the first steps and
    the end of the run took, so it is reported, not asserted (no timed assertions)."""
    events, _, _ = request.getfixturevalue(kind)
    ours = account(events)
    summary = summarize(events)
    assert summary["processes"] == 2 and summary["final_step"] == 40
    goodput, badput, total = library_breakdown(events, tmp_path)
    assert total == pytest.approx(ours.wall_seconds, rel=1e-3)
    gap = ours.badput["infrastructure_recovery_from_disruption"]
    assert gap > GAP / 2  # process_start is the OS's start time, to a clock tick
    if kind == "preempted":  # the stop is the last event; the library measures from it too
        assert badput["infrastructure_recovery_from_disruption"] == pytest.approx(gap, abs=1e-3)
    else:  # the library measures from the last step's start, a step before the kill
        assert badput["infrastructure_recovery_from_disruption"] == pytest.approx(gap, rel=0.1)
        assert ours.badput["wasted_progress_from_disruption"] > 0
        assert badput["wasted_progress_from_disruption"] > 0
    excess, tail = library_only_rules(events)
    expected = 100 * (ours.productive_seconds - excess + tail) / ours.wall_seconds
    assert goodput == pytest.approx(expected, abs=0.01), (
        f"library {goodput:.3f} %, elastic_dew {100 * ours.goodput:.3f} %, "
        f"first-step excess {excess:.3f} s, last-step tail {tail:.3f} s"
    )


def test_a_handled_slice_loss_is_a_warning_in_the_json_logs(killed):
    _, stderr, _ = killed
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    detected = [line for line in lines if line["message"].startswith("Elastic event detected")]
    assert detected, "pathwaysutils logged no slice loss"
    assert {line["severity"] for line in detected} == {"WARNING"}
    assert "Traceback" not in detected[0]["message"] and "handled slice loss" in detected[0]["message"]


def test_a_run_killed_with_sigkill_and_run_again_resumes_from_its_last_checkpoint_with_every_step_once(killed):
    """Checkpoints are saved asynchronously, so the newest one committed before the kill is
    step 20 or 10, or none yet (then the run starts afresh); the kill fires once. (That the
    parameters then end bitwise as without the kill is ``test_fault_matrix_kill``'s.)"""
    events, _, run_dir = killed
    resumes = [(e["source"], e["step"]) for e in events if e["event"] == "resume"]
    assert resumes[0] == ("fresh", 1)
    assert resumes[-1] in (("checkpoint", 21), ("checkpoint", 11), ("fresh", 1))
    assert [e["step"] for e in record.committed_step_lines(events)] == list(range(1, 41))
    assert [f.action for f in record.read_faults(run_dir)] == ["lose", "restore", "kill"]
