"""The benchmark harness (``python -m benchmarks``): its output format and its accounting.

Not the targets: speed figures live in ``benchmarks/`` and ``docs/performance.md``. The
smoke tests read runs of the cheapest benchmarks in the hidden tiny mode, each test its own
real subprocess (:data:`TINY`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.__main__ import MODULES, parse
from benchmarks.common import CLUSTER_RESCHEDULE_S, ROWS, TARGETS, table, verdicts
from benchmarks.goodput import reschedule_delay, rescheduled_goodput
from benchmarks.work_lost import work_lost

from conftest import REPO

#: The benchmarks each smoke test runs, in the hidden tiny mode, in a real subprocess of its
#: own (the harness sets its own device count before JAX starts): a hang or a failure fails
#: only the test that reads it. The three start together, when the first is needed, and
#: share the cores instead of queueing.
TINY: dict[str, tuple[str, ...]] = {
    # The harness's output, over several benchmarks in one process (their rows merged into one
    # results file and table): the cheapest that write figures of every kind the table holds,
    # a data reposition, host-memory and disk restores, a real GCS API on loopback
    # (fake-gcs-server), and a real SIGTERM to a real worker process.
    "format": ("reposition", "restore_bw", "storage_bw", "preemption"),
    # Recovery at 4 and at 32 simulated slices, each in its own child process.
    "recovery_scaling": ("recovery_scaling",),
    # The issue-11 benchmarks: the lm recipe under fsdp, its snapshots, its overhead over a
    # bare loop, and its first checkpoint in fresh processes.
    "issue_11": ("snapshot_cost", "overhead", "first_save"),
    # The planner's model against one drawn schedule per policy on 4 slices, and against its
    # discrete-event simulation.
    "plan_validation": ("plan_validation",),
}

#: Seconds a tiny run may take from its start before it counts as hung (its test gets a
#: minute more): the three took about 85 s one after another in one process in an idle full
#: suite, and the issue-11 benchmarks alone took over 300 s at load 12-15; a hang guard, not a
#: speed target.
HANG = 1800


class _TinyRun:
    """One tiny run of some benchmarks: a real subprocess in its own session (so a hang is
    ended with every worker it started), its output in a file (a pipe nobody reads could
    fill and block it)."""

    def __init__(self, benchmarks: tuple[str, ...], out: Path) -> None:
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("XLA_FLAGS", None)
        self.benchmarks, self.out = benchmarks, out
        self.log = out / "output.txt"
        self.started = time.monotonic()
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks", "--tiny", "--only", ",".join(benchmarks), "--out", str(out)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            )

    def results(self) -> tuple[dict, str]:
        """``results.json`` (as a dict) and ``results.md``, once the run has exited 0; the
        test fails (and the run is ended) when it has not exited ``HANG - 60`` s after it started."""
        try:
            code = self.process.wait(timeout=max(0.0, self.started + HANG - 60 - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the tiny run of {', '.join(self.benchmarks)} hung: {self.log.read_text()[-3000:]}")
        assert code == 0, self.log.read_text()[-3000:]
        return json.loads((self.out / "results.json").read_text()), (self.out / "results.md").read_text()

    def stop(self) -> None:
        """End the run and every process it started, if it still runs."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Iterator[dict[str, _TinyRun]]:
    """Every tiny run of :data:`TINY`, started together; a test reads its own."""
    runs = {name: _TinyRun(benchmarks, tmp_path_factory.mktemp(name)) for name, benchmarks in TINY.items()}
    yield runs
    for run in runs.values():
        run.stop()


@pytest.mark.timeout(HANG)
@pytest.mark.slow
def test_the_tiny_mode_writes_results_json_and_a_markdown_table(tiny):
    results, md = tiny["format"].results()
    for key in (
        "reposition_ratio", "reposition_s_step10", "reposition_s_step1e6",
        "snapshot_restore_bw_over_memcpy", "checkpoint_restore_bw_over_memcpy", "memcpy_gib_s",
        "snapshot_restore_bw_over_host_to_device", "checkpoint_restore_bw_over_numpy_read",
        "checkpoint_restore_bw_over_read_then_copy",
        "preempt_save_s_16MB", "preempt_checkpoint_s_16MB", "save_bw_over_disk",
        "checkpoint_save_gcs_gib_s", "checkpoint_restore_gcs_gib_s", "checkpoint_save_gcs_over_disk",
    ):
        assert isinstance(results[key], float) and results[key] > 0, key
    assert results["mode"] == "tiny"
    assert results["machine"]["cores"] >= 1
    assert set(results["targets_met"]) == {
        "reposition_ratio", "snapshot_restore_bw_over_memcpy", "checkpoint_restore_bw_over_memcpy",
        "snapshot_restore_bw_over_host_to_device", "checkpoint_restore_bw_over_read_then_copy",
    }
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert rows[0] == "| metric | value | baseline | ratio | target | met |"
    assert all(line.count("|") == 7 for line in rows)
    assert any(line.startswith("| data reposition, step 1,000,000 / step 10 |") for line in rows)


def _step(step, start, end):
    return {"event": "step", "step": step, "examples": [start, end]}


def test_work_lost_counts_redone_steps_and_examples_skipped_or_seen_twice():
    clean = [
        {"event": "resume", "source": "fresh", "step": 1},
        _step(1, 0, 4), _step(2, 4, 8), _step(3, 8, 12),
        {"event": "stop", "reason": "slice_lost", "step": 3},
        {"event": "resume", "source": "snapshot", "step": 3},  # step 3 is redone
        _step(3, 8, 12), _step(4, 12, 16),
    ]
    assert work_lost(clean) == {
        "steps_recomputed_total": 1, "failures": 1, "examples_lost": 0, "examples_duplicated": 0,
    }
    gap_and_overlap = [_step(1, 0, 4), _step(2, 6, 10), _step(3, 8, 12)]
    lost = work_lost(gap_and_overlap)
    assert lost["examples_lost"] == 2 and lost["examples_duplicated"] == 2


def test_a_snapshot_overhead_met_by_skipping_snapshots_is_not_met():
    results = {"snapshot_overhead_pct_k1": 1.0, "snapshots_taken_fraction_k1": 0.5}
    assert verdicts(results)["snapshot_overhead_pct_k1"] is False
    results["snapshots_taken_fraction_k1"] = 1.0
    assert verdicts(results)["snapshot_overhead_pct_k1"] is True
    assert "| snapshot every step (fsdp): step-time overhead (%) | 1 |" in table(results)


def test_a_missed_target_is_marked_in_the_table():
    results = {"recovery_s_p50": 2.0, "restart_s_p50": 8.0, "recovery_speedup": 4.0}
    line = next(l for l in table(results).splitlines() if l.startswith("| recovery after a slice loss (fsdp), p50"))
    assert line.endswith("| >= 10x | **no** |")
    assert {row[1] for row in ROWS} >= {"recovery_s_p50", "goodput", "framework_overhead_pct", "reposition_ratio"}


def test_an_unknown_benchmark_name_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        parse(["--only", "recovery,warp_speed"])
    err = capsys.readouterr().err
    assert "warp_speed" in err and ", ".join(MODULES) in err


def test_the_plan_grid_is_chosen_by_case_name_and_an_unknown_case_is_refused_with_the_choices(capsys):
    args = parse(["--only", "plan_validation", "--plan-cases", "mlp_4x1,lm_4x2_x10", "--plan-schedules", "12"])
    assert args.plan_cases == ("mlp_4x1", "lm_4x2_x10") and args.plan_schedules == 12
    with pytest.raises(SystemExit):
        parse(["--plan-cases", "mlp_4x1,mlp_4x1_x100"])
    err = capsys.readouterr().err
    assert "mlp_4x1_x100" in err and "lm_4x2_x3" in err


@pytest.mark.timeout(HANG)
@pytest.mark.slow
def test_the_recovery_scaling_benchmark_measures_both_slice_counts_and_their_ratio(tiny):
    results, md = tiny["recovery_scaling"].results()
    for key in ("recovery_scaling_s_p50_4", "recovery_scaling_s_p50_32", "recovery_scaling_ratio",
                "recovery_scaling_ratio_in_steps"):
        assert isinstance(results[key], float) and results[key] > 0, key
    assert set(results["targets_met"]) == {"recovery_scaling_ratio"}
    assert "| recovery after one loss, 32 slices / 4 slices, warm p50 (s) |" in md


def _summary(processes, wall, productive, between):
    return {
        "processes": processes, "wall_seconds": wall, "productive_seconds": productive,
        "badput": {"infrastructure_recovery_from_disruption": between},
    }


def test_a_cluster_reschedule_lengthens_each_gap_between_processes_and_nothing_else():
    # Two restarts that took 1 s between them in all: at 60 s each the wall time grows by 119 s.
    faulted = _summary(processes=3, wall=50.0, productive=40.0, between=1.0)
    assert rescheduled_goodput(faulted, 60.0) == pytest.approx(40.0 / (50.0 - 1.0 + 120.0))
    # A gap already longer than asked is kept, and a single process has no gap to lengthen.
    assert rescheduled_goodput(_summary(3, 300.0, 40.0, 200.0), 60.0) == pytest.approx(40.0 / 300.0)
    assert rescheduled_goodput(_summary(1, 50.0, 40.0, 0.0), 60.0) == pytest.approx(0.8)


def test_a_reschedule_delay_that_is_not_a_number_of_seconds_is_refused_naming_the_variable():
    assert reschedule_delay({}) == 0.0
    assert reschedule_delay({"BENCH_RESCHEDULE_DELAY_S": "85"}) == 85.0
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match="BENCH_RESCHEDULE_DELAY_S"):
            reschedule_delay({"BENCH_RESCHEDULE_DELAY_S": bad})


def test_the_goodput_row_to_meet_is_the_share_of_fault_free_goodput_beside_the_restart_baselines():
    results = {
        "goodput_share_of_fault_free": 0.93, "goodput_restart_baseline_share_of_fault_free": 0.62,
        "goodput_share_over_restart_baseline": 1.5, "goodput": 0.5, "goodput_restart_baseline": 0.33,
    }
    lines = table(results).splitlines()
    row = next(l for l in lines if l.startswith("| goodput under the fault schedule / without faults |"))
    assert row == "| goodput under the fault schedule / without faults | 0.93 | 0.62 | 1.5 | >= 0.9 | yes |"
    assert verdicts(dict(results, goodput_share_of_fault_free=0.85))["goodput_share_of_fault_free"] is False
    assert "goodput" not in TARGETS  # the absolute goodput is shown, not judged
    assert any(f"{CLUSTER_RESCHEDULE_S:.0f} s reschedule" in label for label, *_ in ROWS)


def test_the_recovery_scaling_rows_and_target_live_in_common_with_the_others():
    assert TARGETS["recovery_scaling_ratio"][1](2.0) and not TARGETS["recovery_scaling_ratio"][1](2.1)
    keys = [row[1] for row in ROWS]
    assert {"recovery_scaling_s_p50_32", "recovery_scaling_steps_p50_32"} <= set(keys)
    assert len(keys) == len(set(keys)), "a row is registered twice"


@pytest.mark.timeout(HANG)
@pytest.mark.slow
def test_the_issue_11_benchmarks_run_under_fsdp_and_report_their_rows(tiny):
    """snapshot_cost, overhead and first_save: every key their rows read is written, and the
    snapshot's host memory (counted from the snapshot's own arrays, not timed) is one copy per
    slice under fsdp."""
    results, md = tiny["issue_11"].results()
    for key in (
        "snapshot_overhead_pct_k1", "snapshots_taken_fraction_k1", "snapshot_host_memory_ratio",
        "snapshot_host_memory_ratio_replicated", "framework_step_s_trainer", "framework_step_s_bare",
        "framework_overhead_pct", "first_save_s", "first_save_unprepared_s", "first_save_over_later",
        "host_cpu_ms_per_step_added", "host_cpu_ms_per_step_trainer", "host_cpu_ms_per_step_bare",
        "host_cpu_ms_per_step_own_threads",
    ):
        assert isinstance(results[key], float), key
    assert results["host_cpu_ms_per_step_bare"] > 0 and results["host_cpu_ms_per_step_own_threads"] >= 0
    assert results["snapshot_host_memory_ratio"] <= 1.1
    assert results["snapshot_host_bytes_per_device"] > 0
    assert set(results["targets_met"]) == {"snapshot_host_memory_ratio", "framework_overhead_pct",
                                           "first_save_over_later", "snapshot_overhead_pct_k1",
                                           "host_cpu_ms_per_step_added"}
    assert "| snapshot host memory per device / (state bytes / devices per slice), fsdp" in md
    assert "| framework overhead vs a bare jitted loop, same fsdp shardings and lagged read (%) |" in md
    assert "| host CPU time elastic_dew adds per step, loop thread + its own threads, p50 (ms) |" in md


def test_the_host_memory_row_is_met_at_one_copy_per_slice_and_not_at_two():
    assert verdicts({"snapshot_host_memory_ratio": 1.0})["snapshot_host_memory_ratio"] is True
    assert verdicts({"snapshot_host_memory_ratio": 2.0})["snapshot_host_memory_ratio"] is False


@pytest.mark.slow
def test_the_soak_reports_its_rate_each_failures_replay_the_work_lost_and_what_the_runs_left(tmp_path, monkeypatch):
    """One real schedule from the soak's seed range, run and checked in this process; the
    checker is made to find a problem so that the failure's report can be read."""
    import elastic_dew.testing as chaos
    from benchmarks.soak import FIRST_SEED, soak

    real_check = chaos.check
    monkeypatch.setattr(chaos, "check", lambda outcome, expected: real_check(outcome, expected) + ["a planted problem"])
    results = soak(1, tmp_path)
    assert results["soak_schedules"] == 1 and results["soak_success_rate"] == 0.0
    [failure] = results["soak_failures"]
    assert failure["seed"] == FIRST_SEED and failure["problems"] == ["a planted problem"]
    assert failure["replay"] == f"python -m elastic_dew.chaos --seed {FIRST_SEED}"
    assert results["soak_faults_fired"] >= 1 and results["soak_steps_rerun_per_fault"] >= 0
    assert results["soak_threads_growth"] == results["soak_threads_end"] - results["soak_threads_start"]
    assert results["soak_rss_mb_end"] > 0 and results["soak_s"] > 0
    assert "| chaos soak: schedules keeping every invariant, one process (%) | 0 |" in table(results)
    assert not verdicts(results)["soak_success_rate"]


@pytest.mark.slow
@pytest.mark.timeout(HANG)
def test_the_plan_validation_predicts_before_it_runs_and_reports_each_policy_beside_its_prediction(tiny):
    results, md = tiny["plan_validation"].results()
    for policy in ("restart", "pause_resume", "replica_resize"):
        key = f"plan_{policy}_mlp_4x1"
        predicted, measured = results[f"{key}_predicted"], results[f"{key}_measured"]
        assert 0 < predicted < 1 and 0 < measured <= 1, policy
        assert results[f"{key}_points"] == pytest.approx(100 * (measured - predicted))
        assert results[f"{key}_gave_up"] == 0
        assert set(results["plan_validation_costs_mlp_4x1"][policy]) >= {"step_seconds", "recovery_seconds"}
        if policy != "restart":  # the elastic policies' runs train with the plan's retry budget
            assert results[f"{key}_budget"]["max_attempts"] >= 10
    assert results["plan_model_vs_des_points"] >= 0
    assert set(results["targets_met"]) >= {"plan_validation_worst_points", "plan_model_vs_des_points"}
    assert "| plan: the model against real runs, worst gap of mean measured goodput from predicted (points) |" in md


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_host_time_figure_counts_a_thread_that_ended_between_two_readings_once_and_no_foreign_thread():
    """A thread of elastic_dew's that starts and ends between two readings (as a bounded
    storage call's does within a step) is counted; a live one's time is not counted twice;
    a thread without the prefix (Grain's, XLA's) is not counted."""
    import threading

    from benchmarks.overhead import OwnThreads

    with OwnThreads() as own:
        own()
        short = threading.Thread(target=_spin, args=(0.05,), name="elastic-dew-storage-read")
        foreign = threading.Thread(target=_spin, args=(0.05,), name="grain-read")
        for thread in (short, foreign):
            thread.start()
            thread.join()
        assert 0.05 <= own() < 0.09
        go, half = threading.Event(), threading.Event()

        def twice() -> None:
            _spin(0.05)
            half.set()
            go.wait(30)
            _spin(0.05)

        live = threading.Thread(target=twice, name="elastic-dew-read")
        live.start()
        half.wait(30)
        first = own()
        go.set()
        live.join()
        second = own()
        assert 0.05 <= first < 0.09 and 0.05 <= second < 0.09 and own() < 0.01


def test_every_thread_elastic_dew_starts_carries_the_prefix_the_host_time_figure_counts():
    """Each ``threading.Thread(...)`` in the package is named ``elastic-dew-*`` and each
    ``ThreadPoolExecutor(...)`` has that ``thread_name_prefix`` (``benchmarks/overhead.py``
    counts the threads by that name)."""
    import ast

    from benchmarks.overhead import OwnThreads

    def prefixed(node: ast.expr) -> bool:
        if isinstance(node, ast.JoinedStr) and node.values:
            node = node.values[0]
        return isinstance(node, ast.Constant) and str(node.value).startswith(OwnThreads.PREFIX)

    unnamed = []
    for path in sorted((REPO / "elastic_dew").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            keyword = {"Thread": "name", "ThreadPoolExecutor": "thread_name_prefix"}.get(called or "")
            if keyword is None:
                continue
            given = {k.arg: k.value for k in node.keywords}
            if keyword not in given or not prefixed(given[keyword]):
                unnamed.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert unnamed == []


def test_the_snapshot_worker_orbax_starts_for_tier_1_carries_the_prefix_too():
    """Orbax's Snapshotter starts its worker itself (unnamed); tier 1's runs elastic_dew's
    worker loop, so it is elastic_dew's thread and is named as one."""
    from benchmarks.overhead import OwnThreads
    from elastic_dew._compat.orbax import HostSnapshotter

    snapshotter = HostSnapshotter()
    try:
        assert snapshotter._worker_thread.name.startswith(OwnThreads.PREFIX)
    finally:
        snapshotter.stop()
    assert snapshotter.stopped()
