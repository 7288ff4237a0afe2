"""``elastic-dew train``, ``report`` and ``demo`` end to end, as a person runs them.

Trainings run as real subprocesses (``python -m elastic_dew train ...``): preemption is a
real SIGTERM from the simulator's schedule, and a restart is the same command run again.
The slices are simulated on CPU devices (TPU slices cannot exist here); nothing else is mocked.
Argument checks run in-process: they must fail before anything is touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_dew import cli, console, record, rundir
from elastic_dew._compat.argparse import actions
from elastic_dew import run as runs
from elastic_dew.run import execution
from elastic_dew.run import planning
from elastic_dew.commands import train
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.state.orbax_step import committed_checkpoint_steps
from elastic_dew.simulate.diagnosis import diagnose, fault_record

REPO = Path(__file__).resolve().parent.parent
STEPS = "30"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("JOBSET_NAME", None)
    env.update(extra)
    return env


def _train(run_dir: Path, *args: str, cwd: Path | None = None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "elastic_dew", "train", "mlp", "--steps", STEPS,
         "--run-dir", str(run_dir), *args],
        capture_output=True, text=True, timeout=240, cwd=cwd or run_dir.parent, env=env or _env(),
    )


def _ok(proc: subprocess.CompletedProcess, status: int = 0) -> subprocess.CompletedProcess:
    assert proc.returncode == status, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """mlp for 30 steps on 4 slices of 2 devices with no fault: the reference run."""
    run_dir = tmp_path_factory.mktemp("cli") / "uninterrupted"
    proc = _ok(_train(run_dir))
    assert "final step" in proc.stdout and "timeline:" in proc.stdout
    return run_dir


# ----------------------------------------------------------------- arguments checked first

def test_simulator_options_are_refused_on_real_slices(tmp_path, monkeypatch, capsys):
    """JAX_PLATFORMS=proxy (Pathways) is only named, never started: the check comes first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JAX_PLATFORMS", "proxy")
    assert cli.main(["train", "mlp", "--schedule", "preempt@3", "--slices", "2"]) == 2
    assert "--slices, --schedule only apply to simulated slices" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train.configure(parser)
    return parser.parse_args(list(argv))


def test_the_run_is_named_by_name_else_jobset_name_else_a_fresh_timestamp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JOBSET_NAME", raising=False)
    assert train.plan(_args("mlp", "--name", "mine")).run_dir == Path("runs/mine")
    monkeypatch.setenv("JOBSET_NAME", "trainer-js")
    assert train.plan(_args("mlp")).run_dir == Path("runs/trainer-js")
    monkeypatch.delenv("JOBSET_NAME")
    monkeypatch.setattr("elastic_dew.runtime.run_timestamp", lambda: "2026-01-02_03:04:05")
    unnamed = train.plan(_args("mlp"))
    assert unnamed.run_dir is None
    assert planning.choose_run_dir(unnamed) == Path("runs/2026-01-02_03:04:05")
    (tmp_path / "runs" / "2026-01-02_03:04:05").mkdir(parents=True)
    with pytest.raises(runs.UsageError, match="already exists"):
        planning.choose_run_dir(unnamed)


# ----------------------------------------------------------------- end to end

@pytest.mark.slow
def test_the_summary_has_every_field_and_badput_category_and_they_add_up_to_the_wall_time(uninterrupted):
    summary = json.loads((uninterrupted / "summary.json").read_text())
    assert summary["final_step"] == 30
    assert summary["examples_consumed"] == 30 * 24
    assert len(summary["state_digest"]) == 64
    assert 0 < summary["goodput"] < 1
    assert tuple(summary["badput"]) == record.BADPUT_CATEGORIES
    assert summary["productive_seconds"] + sum(summary["badput"].values()) == pytest.approx(
        summary["wall_seconds"], abs=1e-3
    )
    assert summary["state_digest"] == record.state_digest(record.load_params(uninterrupted))
    assert (uninterrupted / "timeline.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_recipes_own_main_prepares_the_process_before_jax_starts(tmp_path):
    """Without XLA_FLAGS in the environment, only prepare_process can give JAX 8 devices."""
    env = _env()
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew.recipes.mlp", "--steps", "3", "--run-dir", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env,
    )
    _ok(proc)
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["final_step"] == 3
    assert "4 simulated slices of 2 devices" in proc.stderr


@pytest.mark.slow
def test_report_prints_the_summary_table_and_redraws_the_timeline(uninterrupted, capsys):
    (uninterrupted / "timeline.png").unlink()
    assert cli.main(["report", str(uninterrupted)]) == 0
    out = capsys.readouterr().out
    digest = json.loads((uninterrupted / "summary.json").read_text())["state_digest"]
    assert digest in out
    for category in record.BADPUT_CATEGORIES:
        assert category in out
    assert (uninterrupted / "timeline.png").exists()


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_the_quick_demo_survives_a_slice_loss_its_return_and_a_preemption_with_exactly_once_data(tmp_path):
    """Two training processes: under a minute on an idle machine, several minutes on one
    loaded many times over, so the limit only catches a hang. The parameters' equality with
    a fault-free run, under every fault, is the fault matrix's (tests/test_fault_matrix.py)."""
    run_dir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "demo", "--quick", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=840, cwd=tmp_path, env=_env(),
    )
    _ok(proc)
    assert "restarting the same command, as a JobSet restarts the pod" in proc.stdout
    assert f"timeline: {run_dir / 'timeline.png'}" in proc.stdout
    events = record.read_events(run_dir)
    summary = record.summarize(events)
    assert summary["final_step"] == 40
    assert summary["faults"] == {"lose": 1, "restore": 1, "preempt": 1}
    assert summary["stops"]["slice_lost"] == 1 and summary["stops"]["preempted"] == 1
    assert summary["processes"] == 2
    assert (run_dir / "timeline.png").exists()
    # --min-slices 3 carried on with three slices; every example once, in order.
    committed = record.committed_step_lines(events)
    assert ("slice_lost", 9) in [(e["reason"], e["step"]) for e in events if e["event"] == "stop"]
    assert 3 in {e["slices"] for e in committed} and [e["step"] for e in committed] == list(range(1, 41))
    ranges = [tuple(e["examples"]) for e in committed]
    assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges
    assert ranges[-1][1] == summary["examples_consumed"] == 40 * 24
    # The simulator's diagnosis of elastic_dew's own loop names no problem (watch.jsonl of both processes).
    faults = [fault_record(f) for f in rundir.FaultLog(run_dir / rundir.FAULTS_FILE).entries()]
    found = diagnose(faults, rundir.read_records(run_dir / rundir.WATCH_FILE))
    assert found.problems == (), found.lines()
    assert [c.action for c in found.costs] == ["lose", "restore", "preempt"]
    assert found.costs[0].resumed_from in ("snapshot", "live") and found.costs[2].resumed_from == "checkpoint"


@pytest.mark.slow
def test_a_simulated_multi_tier_run_checkpoints_through_the_replicator_stand_in_in_its_run_directory(tmp_path):
    """Orbax's real multi-tier manager, with the simulator's stand-in for GKE's replicator
    (planned from the command line's options and executed in this process, whose 8 CPU
    devices are 4 slices of 2)."""
    run_dir = tmp_path / "mtc"
    parser = argparse.ArgumentParser()
    console.add_options(parser)
    args = parser.parse_args(["mlp", "--checkpoint-kind", "multi_tier", "--steps", "6", "--checkpoint-every", "3",
                              "--snapshot-every", "0", "--mtc-backup-minutes", "5", "--run-dir", str(run_dir)])
    plan = planning.plan_run(console.config_of(args))
    assert plan.elastic.mtc_backup_minutes == 5
    assert execution.execute(plan).status == 0
    saves = [e["step"] for e in record.read_events(run_dir) if e["event"] == "save" and e["tier"] == "checkpoint"]
    assert saves == [3, 6]
    backup = run_dir / rundir.REPLICATOR_DIR / "backup" / run_dir.name
    assert sorted(int(p.name) for p in backup.iterdir()) == [3, 6]
    assert not (run_dir / rundir.CHECKPOINTS_DIR).exists()


def test_a_checkpoint_directory_for_multi_tier_is_refused_on_simulated_slices(tmp_path, monkeypatch, capsys):
    """Simulated multi-tier checkpoints live in the replicator stand-in's directory of the run."""
    monkeypatch.chdir(tmp_path)
    args = ["train", "mlp", "--checkpoint-kind", "multi_tier", "--checkpoint-dir", str(tmp_path / "x")]
    assert cli.main(args) == 2
    assert "RUN_DIR/replicator/local: drop --checkpoint-dir " in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_run_directory_on_a_missing_mount_is_refused_on_real_slices(tmp_path, monkeypatch, capsys):
    """Without its volume the run directory would live in the pod's own filesystem and a
    restarted pod would start over; a top-level directory that does not exist says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JAX_PLATFORMS", "proxy")
    missing = "/elastic-dew-no-such-mount/runs/x"
    assert cli.main(["train", "mlp", "--run-dir", missing]) == 2
    assert "/elastic-dew-no-such-mount does not exist" in capsys.readouterr().err
    assert not Path("/elastic-dew-no-such-mount").exists()


def test_one_invocation_plans_its_run_once(tmp_path, monkeypatch, capsys):
    """prepare_process is replaced by a no-op: the test process's JAX backend has started, and
    its host device count cannot change. A recipe setting its build() refuses ends the run
    after the plan, before anything is written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("elastic_dew.runtime.prepare_process", lambda **options: None)
    planned = []
    from elastic_dew.run import execution

    real_plan = execution.plan_run
    monkeypatch.setattr(execution, "plan_run", lambda spec: planned.append(spec) or real_plan(spec))
    assert cli.main(["train", "mlp", "--run-dir", "r", "--set", "depth=3"]) == 2
    assert "--set: the mlp recipe has no setting depth" in capsys.readouterr().err
    assert len(planned) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_train_options_come_from_the_settings_own_declarations():
    """Each ElasticConfig setting the command line offers takes its default and range from
    the dataclass field and its flag from the field's name (or the console's override); the
    parser is built from them."""
    parser = argparse.ArgumentParser()
    train.configure(parser)
    text = parser.format_help()
    offered = console.RUN_FLAGS["elastic"][1]
    assert {console.flag_of(field) for field in offered} == {
        "--min-slices", "--poll-interval", "--global-batch", "--snapshot-every", "--checkpoint-every",
        "--checkpoint-dir", "--checkpoint-kind", "--model-axis", "--timeout", "--max-attempts", "--step-timeout",
        "--retry-reset-steps", "--mtc-backup-minutes", "--mtc-init-timeout", "--storage-timeout", "--grace-period",
        "--max-failed-saves", "--max-uncommitted-seconds", "--quarantine-damaged",
    }
    for field in offered:
        assert console.flag_of(field) in text
    assert "steps between in-memory snapshots (tier 1); 0 turns them off (default 10)" in " ".join(text.split())
    config = console.config_of(parser.parse_args(["mlp", "--snapshot-every", "3", "--set", "hidden=4"]))
    assert config.elastic == ElasticConfig(global_batch=24, snapshot_every=3)  # mlp's own batch
    assert config.overrides == {"hidden": 4} and config.sim is None


def test_demo_passes_its_log_format_to_every_training_process(tmp_path):
    from elastic_dew.commands import demo, train

    parser = argparse.ArgumentParser()
    demo.configure(parser)
    args = parser.parse_args(["--quick", "--log-format", "json"])
    cmd = demo.command(demo.QUICK, tmp_path / "d", console.observe_of(args).log_format)
    assert cmd[cmd.index("--log-format") + 1] == "json"
    assert demo.command(demo.QUICK, tmp_path / "d")[cmd.index("--log-format") + 1] == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-format", "yaml"])
    # One declaration: demo's choices and default are train's.
    trained = argparse.ArgumentParser()
    train.configure(trained)
    ours, theirs = (next(a for a in actions(p) if "--log-format" in a.option_strings) for p in (parser, trained))
    assert (ours.choices, ours.default, ours.help) == (theirs.choices, theirs.default, theirs.help)


def test_a_command_finalises_the_garbage_it_leaves_then_spares_the_exits_final_collections(tmp_path):
    # A cycle with a finaliser, garbage before the command ends, with automatic collection
    # off: only the command's collection at exit finalises it. The handler registered before
    # the command runs after the command's own, so it sees the frozen objects.
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0, flush=True))\n"
        "gc.disable()\n"
        "class Cycle:\n"
        "    def __del__(self): print('finalised', flush=True)\n"
        "c = Cycle(); c.me = c; del c\n"
        "from elastic_dew.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    render = ["k8s", "render", "--name", "dew-cli", "--tpu-type", "v5e", "--topology", "4x8", "--slices", "2",
              "--elastic-slices", "2", "--image", "r/controller:1", "--recipe", "lm", "--bucket", "gs://dew-bucket"]
    proc = _ok(subprocess.run([sys.executable, "-c", code, *render], capture_output=True, text=True,
                              timeout=60, cwd=tmp_path, env=_env()))
    assert proc.stdout.splitlines()[-2:] == ["finalised", "frozen True"]


@pytest.mark.slow
@pytest.mark.parametrize("module, command", [("elastic_dew.cli", ["train", "mlp"]), ("elastic_dew.recipes.mlp", [])])
def test_a_preempted_command_exits_143_once_its_checkpoint_is_committed_and_its_record_closed_skipping_finalisation(
    tmp_path, module, command,
):
    """A real SIGTERM (the schedule's ``preempt``) to the command run as the program: it ends
    with 143 as soon as the stop is durable. The object the program keeps is never finalised
    (the interpreter's finalisation is skipped); the checkpoint the stop names is committed, and
    the run record is whole and ends with that stop."""
    code = (
        "import sys\n"
        "class Kept:\n"
        "    def __del__(self): print('finalised', flush=True)\n"
        "kept = Kept()\n"
        f"from {module} import main\n"
        "sys.exit(main())\n"
    )
    run_dir = tmp_path / "run"
    proc = _ok(subprocess.run(
        [sys.executable, "-c", code, *command, "--steps", STEPS, "--schedule", "preempt@8",
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env(),
    ), 143)
    assert "finalised" not in proc.stdout
    assert "preempted at step 8" in proc.stderr  # the log lines before the exit were flushed
    events = record.read_events(run_dir)  # every line whole
    assert (events[-1]["event"], events[-1]["reason"], events[-1]["step"]) == ("stop", "preempted", 8)
    assert 8 in committed_checkpoint_steps(run_dir / rundir.CHECKPOINTS_DIR)
    assert ("commit", 8) in [(e["event"], e.get("step")) for e in events]


def test_a_process_running_many_runs_that_leave_writers_behind_holds_one_diversion_of_their_errors(tmp_path, monkeypatch):
    """Each run that gave up on a write keeps the libraries' late error records out of the
    terminal; the next run's diversion takes that over, so runs in one process hold one
    diversion, not one each. (Every run here is made to look as if it left a writer.)"""
    import logging

    from elastic_dew.elastic.state import storage, storage_clients

    monkeypatch.setattr(storage, "left_since", lambda since: 1)
    monkeypatch.setattr(execution, "_HELD_DIVERSIONS", [])
    orbax = logging.getLogger("absl")
    before = list(orbax.filters)
    try:
        for name in ("one", "two", "three"):
            args = _args("mlp", "--steps", "2", "--snapshot-every", "0", "--checkpoint-every", "0",
                         "--run-dir", str(tmp_path / name))
            assert execution.execute(planning.plan_run(console.config_of(args))).status == 0
            assert len(execution._HELD_DIVERSIONS) == 1
        assert len([f for f in orbax.filters if f not in before]) == 1  # the last run's alone
    finally:
        execution.release_held_diversions()
    assert orbax.filters == before
    assert "absl" in storage_clients._LIBRARY_LOGGERS
