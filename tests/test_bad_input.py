"""Every parameter a user gives is checked before anything is touched, with the fix in the message.

The Python API (``ElasticConfig``, ``Trainer``, ``SimulatedSlices``, the schedule), the CLI
(``train``, ``demo``, ``report``, ``launch``, ``k8s render``) and what a run directory holds
(a checkpoint from a model of another shape, a checkpoint damaged by hand). Each case asserts
the message names what was wrong and how to fix it, and that nothing was created or changed.
Slices are simulated on CPU devices (TPU slices cannot exist here).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from elastic_dew import cli, record
from elastic_dew import testing as chaos
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.simulate import SimulatedSlices
from elastic_dew.trainer import Trainer, TrainConfig

from faultlib import tree_digest

# ------------------------------------------------------------------ ElasticConfig


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("global_batch", 0, "global_batch=0 must be >= 1"),
        ("minimum_slice_count", 0, "minimum_slice_count=0 must be >= 1, or None for pause-resume"),
        ("poll_interval", 0, "poll_interval=0 must be > 0 seconds"),
        ("poll_interval", -1.0, "poll_interval=-1.0 must be > 0 seconds"),
        ("timeout", 0, "timeout=0 must be > 0 seconds, or None"),
        ("max_attempts", 0, "max_attempts=0 must be >= 1, or None"),
        ("retry_reset_steps", -1, "retry_reset_steps=-1 must be >= 0 steps (0 turns it off)"),
        ("snapshot_every", -1, "snapshot_every=-1 must be >= 0 steps (0 turns it off)"),
        ("checkpoint_every", -5, "checkpoint_every=-5 must be >= 0 steps (0 turns it off)"),
        ("model_axis", 0, "model_axis=0 must be >= 1, or None"),
        ("max_to_keep", 0, "max_to_keep=0 must be >= 1"),
        ("batch_policy", "linear", "batch_policy='linear' must be one of constant, scale_by_active_slices"),
        ("checkpoint_kind", "zip", "checkpoint_kind='zip' must be one of orbax, multi_tier"),
    ],
)
def test_an_elastic_config_field_out_of_range_is_refused_naming_the_field_and_the_range(field, value, message):
    with pytest.raises(ValueError) as refused:
        ElasticConfig(**{field: value})
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("log_every", 0, "log_every=0 must be a whole number >= 1"),
    ],
)
def test_a_train_config_field_out_of_range_is_refused_naming_the_field_and_the_range(field, value, message):
    with pytest.raises(ValueError) as refused:
        TrainConfig(**{field: value})
    assert message in str(refused.value)


# ------------------------------------------------------------------ Trainer


def _config(**overrides) -> ElasticConfig:
    return dataclasses.replace(chaos.Scenario().config(), **overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            dict(global_batch=20),
            "global_batch=20 (policy 'constant') gives a batch of 20 on 3 active slices, which their 6 "
            "data-parallel devices cannot divide; choose a global batch divisible by 6",
        ),
        (dict(model_axis=3), "model_axis=3 does not divide the 2 devices of a slice"),
    ],
)
def test_a_configuration_the_slices_cannot_run_is_refused_before_the_run_directory_exists(overrides, message, tmp_path):
    with SimulatedSlices(4, 2):
        trainer = Trainer(**chaos.model(), config=_config(**overrides), run_dir=tmp_path / "run")
        with pytest.raises(ValueError) as refused:
            trainer.fit(4)
    assert message in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_a_foreign_run_directory_is_refused_and_left_as_it_was(tmp_path):
    home = tmp_path / "thesis"
    home.mkdir()
    (home / "chapter1.tex").write_text("\\section{Intro}")
    before = tree_digest(home)
    with pytest.raises(ValueError) as refused:
        Trainer(**chaos.model(), config=_config(), run_dir=home)
    assert "is not an elastic_dew run (no events.jsonl, and it holds chapter1.tex)" in str(refused.value)
    assert "give a new or empty directory" in str(refused.value)
    assert tree_digest(home) == before


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: (tmp / "afile").write_text("x") and tmp / "afile", "exists and is not a directory; choose another path"),
        (
            lambda tmp: (tmp / "afile").write_text("x") and tmp / "afile" / "run",
            "cannot be created: {tmp}/afile is not a directory; choose a run directory under a writable directory",
        ),
    ],
    ids=["a_file", "under_a_file"],
)
def test_a_run_directory_that_cannot_be_written_is_refused(make, message, tmp_path):
    run_dir = make(tmp_path)
    with pytest.raises(ValueError) as refused:
        Trainer(**chaos.model(), config=_config(), run_dir=run_dir)
    assert message.format(tmp=tmp_path) in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(config={"global_batch": 24}), "config must be an ElasticConfig, not dict"),
        (dict(train={"log_every": 5}), "train must be a TrainConfig, not dict"),
    ],
)
def test_bad_trainer_arguments_name_the_argument(arguments, message, tmp_path):
    values = dict(chaos.model(), config=_config(), run_dir=tmp_path / "run")
    values.update(arguments)
    with pytest.raises((ValueError, TypeError)) as refused:
        Trainer(**values)
    assert message in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_a_non_positive_step_count_is_refused_before_the_run_directory_exists(tmp_path):
    with pytest.raises(ValueError, match="steps=0 must be >= 1"):
        Trainer(**chaos.model(), config=_config(), run_dir=tmp_path / "run").fit(0)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ a run directory's contents


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """An 8-step run with committed checkpoints 4 and 8 (copied by each test that changes it)."""
    outcome = chaos.run(chaos.Scenario(steps=8), tmp_path_factory.mktemp("finished") / "run")
    assert outcome.error is None and sorted(outcome.checkpoints_seen) == [4, 8]
    return outcome.run_dir


def test_a_checkpoint_from_a_model_of_another_shape_is_refused_naming_the_leaf_and_left_intact(finished_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    before = chaos.committed_checkpoints(run_dir / "checkpoints")
    wider = chaos.model()
    wider["init"] = lambda key: {"w": jax.random.normal(key, (4,)), "b": jnp.zeros((1,))}
    with SimulatedSlices(4, 2):
        with pytest.raises(ValueError) as refused:
            Trainer(**wider, config=_config(), run_dir=run_dir).fit(12)
    message = str(refused.value)
    assert "checkpoint step 8 in" in message and "was written by a model of another shape" in message
    assert "params/b is () there and (1,) in the model" in message
    assert "resume it with the model that wrote it, or train this model in a new run directory" in message
    assert chaos.committed_checkpoints(run_dir / "checkpoints") == before


# Orbax's restore of a damaged checkpoint leaves a TensorStore read whose completion calls
# call_soon_threadsafe on the event loop Orbax's run_sync has already closed ("Event loop is
# closed", unraisable). It is Orbax's and TensorStore's alone: StandardCheckpointer().restore
# of a checkpoint with flipped bytes does the same with no elastic_dew code (orbax-checkpoint
# 0.12.8); the failed restore itself is what this test checks.
@pytest.mark.filterwarnings("ignore:Exception ignored in. None:pytest.PytestUnraisableExceptionWarning")
def test_a_checkpoint_damaged_by_hand_is_quarantined_and_the_previous_one_resumes_exactly_once_or_refused_if_asked(
    finished_run, tmp_path
):
    """Orbax checksums the arrays: flipped bytes in the newest checkpoint are found at restore.
    With ``quarantine_damaged=False`` the run refuses it with the fix and touches nothing; by
    default the step is moved aside (``8.damaged``, every byte kept), a ``storage`` event says
    so, and the run resumes from the previous committed step 4, every example once."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    for data in (run_dir / "checkpoints" / "8" / "state" / "d").iterdir():
        data.write_bytes(bytes(b ^ 0xFF for b in data.read_bytes()))
    before = chaos.committed_checkpoints(run_dir / "checkpoints")
    outcome = chaos.run(chaos.Scenario(steps=12, quarantine_damaged=False), run_dir)
    message = str(outcome.error)
    assert isinstance(outcome.error, ValueError), repr(outcome.error)
    assert "checkpoint step 8 in" in message and "is committed but cannot be read" in message
    damaged = run_dir / "checkpoints" / "8"
    assert f"move it aside (mv {damaged} {damaged}.damaged) to resume from the previous committed checkpoint 4" in message
    assert chaos.committed_checkpoints(run_dir / "checkpoints") == before  # nothing deleted

    bytes_before = {p.relative_to(damaged): p.read_bytes() for p in damaged.rglob("*") if p.is_file()}
    outcome = chaos.run(chaos.Scenario(steps=12), run_dir)
    assert outcome.error is None
    moved = damaged.with_name("8.damaged")
    assert {p.relative_to(moved): p.read_bytes() for p in moved.rglob("*") if p.is_file()} == bytes_before
    events = record.read_events(run_dir)
    quarantined = [e for e in events if e["event"] == "storage"]
    assert [(e["outcome"], e["step"], e["moved_to"]) for e in quarantined] == [("quarantined", 8, str(moved))]
    committed = record.committed_step_lines(events)
    assert sorted(e["step"] for e in committed) == list(range(1, 13))
    assert [e["examples"] for e in sorted(committed, key=lambda e: e["step"])] == [
        [i * chaos.GLOBAL_BATCH, (i + 1) * chaos.GLOBAL_BATCH] for i in range(12)
    ]
    resumes = [e for e in events if e["event"] == "resume"]
    assert (resumes[-1]["source"], resumes[-1]["step"]) == ("checkpoint", 5)


def test_a_partial_checkpoint_directory_left_by_hand_is_never_restored_and_is_replaced(finished_run, tmp_path):
    """A ``12`` directory without Orbax's commit metadata (a copy cut short) is not a checkpoint:
    the run resumes from 8, and writes step 12 over the partial directory."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    partial = run_dir / "checkpoints" / "12"
    shutil.copytree(run_dir / "checkpoints" / "8" / "state", partial / "state")
    before = chaos.committed_checkpoints(run_dir / "checkpoints")
    outcome = chaos.run(chaos.Scenario(steps=12), run_dir)
    assert outcome.error is None, outcome.error
    resumes = [e for e in record.read_events(run_dir) if e["event"] == "resume"]
    assert (resumes[-1]["source"], resumes[-1]["step"]) == ("checkpoint", 9)
    after = chaos.committed_checkpoints(run_dir / "checkpoints")
    assert {step: after[step] for step in before} == before
    assert 12 in after


# ------------------------------------------------------------------ SimulatedSlices and the schedule


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (dict(slices=0, devices_per_slice=2), ValueError, "slices=0 must be a whole number >= 1"),
        (dict(slices=4, devices_per_slice=-1), ValueError, "devices_per_slice=-1 must be a whole number >= 1"),
        (dict(slices=2.5, devices_per_slice=2), ValueError, "slices=2.5 must be a whole number >= 1"),
        (
            dict(slices=4, devices_per_slice=2, schedule="lose:4@3"),
            ValueError,
            "fault lose:4@3/step names slice 4, but there are 4 slices (0..3); fix the schedule or use more slices",
        ),
        (dict(slices=4, devices_per_slice=2, schedule=["lose:1@3"]), TypeError, "schedule must be text or a Schedule, not list"),
    ],
)
def test_bad_simulator_arguments_are_refused_at_construction(arguments, error, message):
    with pytest.raises(error) as refused:
        SimulatedSlices(**arguments)
    assert message in str(refused.value)


def test_more_simulated_devices_than_the_host_has_is_refused_with_the_flag_to_set():
    with pytest.raises(RuntimeError) as refused:
        with SimulatedSlices(5, 2):
            pass
    assert "needs 10 host devices, but JAX has 8" in str(refused.value)
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=10 before JAX starts" in str(refused.value)


# ------------------------------------------------------------------ the command line


def _cli(argv, capsys) -> tuple[int, str]:
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nosuch"], "unknown recipe 'nosuch'; the recipes are lm, mlp"),
        (["mlp", "--global-batch", "20", "--min-slices", "1"], "--global-batch 20 (policy 'constant') gives"),
        (["mlp", "--snapshot-every", "-1"], "--snapshot-every -1 must be >= 0 (0 turns it off)"),
        (["mlp", "--steps", "0"], "--steps 0 must be >= 1"),
        (["mlp", "--schedule", "lose:9@3"], "--schedule: fault lose:9@3/step names slice 9, but there are 4 slices (0..3); fix the schedule or use more slices"),
        (["mlp", "--name", "y"], "give --run-dir or --name, not both"),
        (["mlp", "--set", "hidden"], "--set 'hidden' is not KEY=VALUE"),
    ],
)
def test_a_bad_train_argument_exits_2_with_the_fix_and_creates_nothing(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, err = _cli(["train", *argv, "--run-dir", "run"], capsys)
    assert status == 2
    assert message in err
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_a_foreign_run_directory_and_one_it_cannot_create(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("photos").mkdir()
    Path("photos/cat.jpg").write_bytes(b"\xff\xd8")
    Path("afile").write_text("x")
    status, err = _cli(["train", "mlp", "--run-dir", "photos"], capsys)
    assert status == 2 and "run directory photos is not an elastic_dew run" in err
    assert "it holds cat.jpg); give a new or empty directory" in err
    status, err = _cli(["train", "mlp", "--run-dir", "afile/run"], capsys)
    assert status == 2 and "run directory afile/run cannot be created (afile is not a directory)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "photos"]
    assert [p.name for p in Path("photos").iterdir()] == ["cat.jpg"]


@pytest.mark.parametrize(
    ("identity", "argv", "difference"),
    [
        ({"recipe": "elastic_dew.recipes.lm", "global_batch": 48}, [], "recipe 'elastic_dew.recipes.lm' -> 'elastic_dew.recipes.mlp'"),
        ({}, ["--set", "hidden=64"], "overrides {} -> {'hidden': 64}"),
        ({"schedule": "preempt@12"}, ["--schedule", "preempt@13"], "schedule 'preempt@12' -> 'preempt@13'"),
    ],
    ids=["another_recipe", "another_model_shape", "another_fault_schedule"],
)
def test_train_refuses_to_resume_a_run_directory_that_holds_another_run_naming_the_difference(
    identity, argv, difference, tmp_path, monkeypatch, capsys
):
    """The run's command.json is its identity: ``--set hidden=64`` on a run started with the
    default 32 would restore checkpoints of another shape, and another schedule would be
    refused deep in the simulator (the fault log records faults by their place in it)."""
    monkeypatch.chdir(tmp_path)
    Path("run").mkdir()
    Path("run/command.json").write_text(json.dumps(
        {"recipe": "elastic_dew.recipes.mlp", "overrides": {}, "seed": 0, "global_batch": 24, **identity}
    ))
    status, err = _cli(["train", "mlp", "--run-dir", "run", *argv], capsys)
    assert status == 2
    assert f"elastic-dew train: error: run holds another run ({difference}" in err
    assert "resume it with its own settings, or start a new run with another --run-dir or --name" in err
    assert [p.name for p in Path("run").iterdir()] == ["command.json"]


def test_report_refuses_what_is_not_a_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    status, err = _cli(["report", str(tmp_path / "empty")], capsys)
    assert status == 2 and "has no events.jsonl; give a directory that a run wrote" in err
    status, err = _cli(["report", str(tmp_path / "missing")], capsys)
    assert status == 2 and "is not a directory; give a run directory" in err


def test_report_refuses_a_corrupted_run_record_naming_the_file_and_the_fix(finished_run, tmp_path, capsys):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / record.EVENTS_FILE).write_bytes(b"\x00\x13garbage\n[1, 2]\n")
    status, err = _cli(["report", "--no-timeline", str(garbage)], capsys)
    assert status == 2
    assert "events.jsonl holds no run-record event (every line is damaged or not an elastic_dew event)" in err

    damaged = tmp_path / "damaged"
    shutil.copytree(finished_run, damaged)
    (damaged / record.PARAMS_FILE).write_bytes(b"PK\x03\x04 cut short")
    status, err = _cli(["report", "--no-timeline", str(damaged)], capsys)
    assert status == 2
    assert f"{damaged / record.PARAMS_FILE} is not a parameters file elastic_dew wrote" in err
    assert "delete it and run the run's train command again, which rewrites it from the final checkpoint" in err


def test_a_torn_or_damaged_line_in_the_run_record_is_skipped_and_the_rest_kept(finished_run, tmp_path, capsys):
    """A killed writer leaves a torn line; the report skips it and keeps every other line."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    lines = (run_dir / record.EVENTS_FILE).read_text().splitlines()
    lines.insert(3, '{"event": "step", "step": 2, "exam')
    (run_dir / record.EVENTS_FILE).write_text("\n".join(lines) + "\n")
    status = cli.main(["report", "--no-timeline", str(run_dir)])
    out = capsys.readouterr().out
    assert status == 0
    assert "final step" in out and " 8" in out


def test_demo_refuses_a_foreign_run_directory_before_training(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    Path("notes").mkdir()
    Path("notes/todo.txt").write_text("buy milk")
    status = cli.main(["demo", "--quick", "--run-dir", "notes"])
    err = capfd.readouterr().err
    assert status != 0
    assert "run directory notes is not an elastic_dew run" in err
    assert [p.name for p in Path("notes").iterdir()] == ["todo.txt"]


def test_launch_refuses_a_pool_of_no_ranks(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        cli.main(["launch", "-n", "0", "--", "true"])
    assert exited.value.code == 2
    assert "--nprocs 0 must be >= 1" in capsys.readouterr().err


def test_k8s_render_refuses_a_bad_field_naming_it_and_the_fix(tmp_path, capsys):
    argv = ["k8s", "render", "--name", "dew", "--tpu-type", "v5e", "--topology", "4x8", "--slices", "2",
            "--elastic-slices", "3", "--image", "r/c:1", "--recipe", "gpt", "--bucket", "gs://b"]
    status, err = _cli([*argv, "--out", str(tmp_path / "js.yaml")], capsys)
    assert status == 2
    assert "error: --elastic-slices:" in err or "error: --recipe:" in err
    assert list(tmp_path.iterdir()) == []
