"""The simulator diagnoses the program: what each fault cost it, and its mistakes by name.

The gallery is ``tests/programs/guide_loop.py``, a loop written as pathwaysutils'
resilience guide shows it (one ``Manager``, one Orbax ``Snapshotter``, ``elastic_retry``,
Grain's ``ElasticIterator``) that makes one mistake on request (``--mistake NAME``, the
name of the problem it must be diagnosed as). It imports nothing of elastic_dew. The
issue's three cases run through ``elastic-dew simulate`` as a user runs them (exit status,
verdict, ``--report``); the other mistakes run in this process under
:class:`SimulatedSlices` and its :meth:`~SimulatedSlices.diagnose`, the same rules on the
same records. TPU slices cannot exist here: the simulator stands in for them on CPU devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter

from functools import partial

from conftest import REPO
from elastic_dew.commands import simulate as simulate_command
from elastic_dew.run import SimConfig
from elastic_dew.simulate import SimulatedSlices
from elastic_dew.simulate.diagnosis import PROBLEMS, diagnose
from programs import guide_loop

PROGRAM = REPO / "tests" / "programs" / "guide_loop.py"
#: The issue's schedule: slice 2 lost at step 9 and back at step 17.
SCHEDULE = "lose:2@9,restore:2@17"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _simulate(tmp_path: Path, *args: str, schedule: str = SCHEDULE, slices: int = 4, boundary: str = "in-process"):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "simulate", "--run-dir", str(tmp_path / "run"), "--report", str(report),
         "--slices", str(slices), "--schedule", schedule, "--boundary", boundary,
         "--", sys.executable, str(PROGRAM), *args],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env(),
    )
    return proc, json.loads(report.read_text()) if report.exists() else None


def _explain(proc) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-5000:]}"


def _kinds(problems) -> list[str]:
    return [p["kind"] if isinstance(p, dict) else p.kind for p in problems]


# --------------------------------------------------------------------------- the three cases


@pytest.mark.slow
def test_the_guide_shaped_loop_exits_0_with_no_problem_resumes_from_its_snapshot_and_takes_the_slice_back(tmp_path):
    proc, verdict = _simulate(tmp_path)
    assert proc.returncode == 0, _explain(proc)
    assert verdict["problems"] == []
    lose, restore = verdict["costs"]
    assert (lose["fault"], lose["resumed_from"], lose["resumed_step"], lose["detected"]) == (
        "lose:2@9/step", "snapshot", 8, "read")
    assert lose["redone_steps"] <= 1 and lose["recovery_seconds"] >= 0
    assert restore["fault"] == "restore:2@17/step" and restore["taken_up_after_steps"] == 0
    assert verdict["totals"]["redone_steps"] == 1 and verdict["totals"]["steps"] == 25
    assert "resumed from the snapshot of step 8, 1 steps redone" in proc.stderr


@pytest.mark.slow
def test_a_loop_that_recreates_its_snapshotter_keeps_its_states_and_ignores_the_returned_slice_fails_naming_each(
        tmp_path):
    proc, verdict = _simulate(tmp_path, "--mistake", "case1")
    assert "done at step 24" in proc.stdout  # the program itself ends well
    assert proc.returncode == 1, _explain(proc)
    assert _kinds(verdict["problems"]) == ["recreated_per_attempt", "held_across_attempts", "returned_slice_ignored"]
    held = verdict["problems"][1]
    assert "16 device arrays" in held["detail"] and "KEPT" in held["detail"]
    lose, restore = verdict["costs"]
    assert (lose["resumed_from"], lose["redone_steps"]) == ("nothing", 9)
    assert restore["taken_up_after_steps"] is None and restore["steps_short"] == 16
    assert "PROBLEM held_across_attempts" in proc.stderr and "NEVER taken up" in proc.stderr
    # --allow accepts what it names (the same run's records, judged again): the others still fail it
    run_dir = tmp_path / "run"
    again = partial(simulate_command.verdict, verdict["command"], SimConfig(), SCHEDULE, run_dir,
                    run_dir / "faults.jsonl", [0], [1.0])
    assert again(allow=("held_across_attempts", "recreated_per_attempt")).exit == 1
    accepted = again(allow=tuple(_kinds(verdict["problems"])))
    assert accepted.exit == 0 and all(p["allowed"] for p in accepted.to_json()["problems"])


@pytest.mark.slow
def test_a_loop_that_builds_its_mesh_from_jax_devices_fails_naming_mesh_on_lost_slice_and_slice_2(tmp_path):
    proc, verdict = _simulate(tmp_path, "--mistake", "mesh_on_lost_slice")
    assert proc.returncode == 1, _explain(proc)
    assert set(_kinds(verdict["problems"])) == {"mesh_on_lost_slice"}
    detail = verdict["problems"][0]["detail"]
    assert "slice 2" in detail and "active slices [0,1,3]" in detail and "guide_loop.py" in detail
    assert "down at that moment" in detail
    assert "PROBLEM mesh_on_lost_slice" in proc.stderr and "manager.active_slice_indices" in proc.stderr


# --------------------------------------------------------------------------- the gallery, in process


def _run(mistake: str | None, schedule: str = SCHEDULE, steps: int = 24):
    argv = ["--steps", str(steps)] + (["--mistake", mistake] if mistake else [])
    with SimulatedSlices(4, 2, schedule=schedule) as sim:
        try:
            guide_loop.main(argv)
        except (RuntimeError, ValueError):
            pass  # a program that fails: its diagnosis says why
        finally:
            guide_loop.KEPT.clear()
    return sim.diagnose()


@pytest.mark.libraries
@pytest.mark.parametrize("mistake", ["restored_nothing", "recreated_per_attempt", "held_across_attempts",
                                     "data_not_rewound", "returned_slice_ignored", "batch_not_divisible"])
def test_each_mistake_of_the_gallery_is_diagnosed_by_its_name_and_nothing_else(mistake):
    found = _run(mistake)
    assert _kinds(found.problems) and set(_kinds(found.problems)) == {mistake}


@pytest.mark.libraries
def test_the_clean_loop_in_process_has_no_problem_and_the_costs_the_command_reports():
    found = _run(None)
    assert found.problems == ()
    assert [(c.fault, c.resumed_from, c.redone_steps, c.taken_up_after_steps) for c in found.costs] == [
        ("lose:2@9/step", "snapshot", 1, None), ("restore:2@17/step", "snapshot", 0, 0)]


@pytest.mark.libraries
def test_a_loss_at_a_dispatch_is_detected_there_and_the_failed_step_is_not_counted_as_redone():
    found = _run(None, schedule="lose:2@9/dispatch", steps=12)
    assert found.problems == ()
    (cost,) = found.costs
    assert (cost.detected, cost.resumed_from, cost.resumed_step, cost.redone_steps) == ("dispatch", "snapshot", 8, 0)


@pytest.mark.libraries
def test_a_snapshot_saved_while_the_previous_copy_cannot_finish_is_named_snapshot_skipped():
    """Orbax's real Snapshotter queues one save: while slice 1 is suspended its step results,
    and the snapshot copies split from them, wait; the first save's copy cannot land, the
    second queues behind it, the third is dropped. The wake lets every copy land."""

    @jax.jit
    def train_step(w):
        return w + 1

    with SimulatedSlices(2, 2) as sim:
        mesh = Mesh(np.asarray(sim.devices).reshape(2, 2), ("replica", "data"))
        w = jax.device_put(np.zeros(4, np.float32), NamedSharding(mesh, PartitionSpec()))
        snapshotter = Snapshotter(replica_axis_index=0)
        sim.suspend(1)
        try:
            for step in (1, 2, 3):
                w = train_step(w)
                snapshotter.save(step, {"w": w})
        finally:
            sim.wake(1)
        snapshotter.join()
    (problem,) = sim.diagnose().problems
    assert problem.kind == "snapshot_skipped" and "(steps 3)" in problem.detail
    assert snapshotter.latest.step == 2


@pytest.mark.slow
def test_a_preemption_that_ends_a_checkpointing_program_with_no_checkpoint_is_named_no_save_at_preemption(tmp_path):
    proc, verdict = _simulate(tmp_path, "--steps", "16", "--checkpoints", str(tmp_path / "checkpoints"),
                              "--mistake", "no_save_at_preemption", schedule="preempt@12", slices=2)
    assert "done at step 16" in proc.stdout and proc.returncode == 1, _explain(proc)
    assert [p["status"] for p in verdict["processes"]] == [-15, 0]  # Python died of the SIGTERM
    (problem,) = verdict["problems"]
    assert problem["kind"] == "no_save_at_preemption" and problem["process"] == 1
    (cost,) = verdict["costs"]
    assert (cost["detected"], cost["resumed_from"]) == ("signal", "checkpoint") and cost["redone_steps"] >= 2
    assert f"redid {cost['redone_steps']} steps" in problem["detail"]


def test_an_unknown_allowed_kind_is_refused_naming_the_kinds():
    with pytest.raises(ValueError, match="unknown problem kind held; the kinds are restored_nothing"):
        diagnose([], [], allow=["held"])
    assert len(PROBLEMS) >= 7


def test_the_watch_reads_placements_past_orbax_argument_objects_that_answer_unknown_attributes_with_key_error():
    """``CheckpointManager.restore(step, args=Composite(state=...))`` under the simulator: the
    Composite is a leaf whose ``__getattr__`` raises ``KeyError``; the watch looks inside it."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from elastic_dew.simulate.leaves import placed_leaves

    array = jax.numpy.asarray(np.arange(4.0))
    composite = ocp.args.Composite(state=ocp.args.StandardRestore({"w": array}))
    assert any(leaf is array for leaf in placed_leaves(((composite,), {})))


@pytest.mark.libraries
def test_a_global_batch_that_does_not_divide_among_the_slices_left_is_named_with_its_fix():
    found = _run("batch_not_divisible")
    (problem,) = found.problems
    assert problem.kind == "batch_not_divisible" and problem.attempt == 2
    assert "slices [0,1,3]" in problem.detail and "partitioned 6 times" in problem.detail
    assert "divisible" in problem.fix and "per-replica batch" in problem.fix
    (lose,) = found.costs  # it died before step 17: the return never fired
    assert lose.resumed_from is None  # never resumed, and the problem says why


def test_a_cause_in_the_programs_error_output_is_named_once_and_only_when_the_output_names_it():
    from elastic_dew.simulate.diagnosis import with_output_causes

    output = ("Traceback (most recent call last):\n  ...\nRuntimeError: Unable to initialize backend 'proxy': "
              "Backend 'proxy' is not in the list of known backends: ['cpu', 'tpu'].\n")
    found = with_output_causes(None, output, 1)
    assert found is not None and [(p.kind, p.process) for p in found.problems] == [("not_initialized", 1)]
    assert "pathwaysutils.initialize()" in found.problems[0].fix and "before its first JAX call" in found.problems[0].fix
    assert with_output_causes(None, "Traceback ...\nValueError: something else\n", 1) is None
    indivisible = "jax._src.sharding.IndivisibleError: Sharding ... is partitioned 6 times, but the dimension size is 16"
    named = with_output_causes(found, indivisible, 2, allow=("batch_not_divisible",))
    assert [(p.kind, p.allowed) for p in named.problems] == [("not_initialized", False), ("batch_not_divisible", True)]
    assert [p.kind for p in with_output_causes(named, indivisible, 2).problems].count("batch_not_divisible") == 1


@pytest.mark.slow
def test_a_program_that_never_initializes_pathwaysutils_is_named_not_initialized_through_the_proxy(tmp_path):
    import jax

    proc, verdict = _simulate(tmp_path, "--mistake", "not_initialized", schedule="lose:2@9", boundary="proxy")
    if jax.__version_info__ >= (0, 12):
        # JAX 0.12 registers the proxy backend itself: the program reaches it uninitialised,
        # survives the loss, and the rule, which reads JAX's refusal, stays silent.
        assert proc.returncode == 0 and verdict["problems"] == [], _explain(proc)
        return
    assert proc.returncode == 1, _explain(proc)
    assert _kinds(verdict["problems"]) == ["not_initialized"]
    assert "PROBLEM not_initialized" in proc.stderr and "pathwaysutils.initialize()" in proc.stderr
    assert "Backend 'proxy' is not in the list of known backends" in proc.stderr  # its own output, passed through


def _records_of_a_snapshot_interrupted_by_a_loss(landed):
    """A loss as the snapshot of step 3 was saved, and the attempt after it starting over;
    ``landed``: what the watch read as landed before that attempt's first step."""
    faults = [{"scheduled": "lose:2@3/snapshot", "action": "lose", "slice": 2, "phase": "snapshot", "step": 3,
               "pid": 1, "wall": 10.5}]
    events = [{"e": "attempt", "pid": 1, "n": 1, "w": 1.0, "active": [0, 1, 2, 3]},
              *({"e": "step", "pid": 1, "n": 1, "w": 8.0 + i, "p": i + 1} for i in range(3)),
              {"e": "save", "pid": 1, "n": 1, "w": 10.4, "kind": "snapshot", "step": 3, "p": 3, "skipped": False},
              {"e": "attempt_end", "pid": 1, "n": 1, "w": 11.0, "error": "slice_down"},
              {"e": "attempt", "pid": 1, "n": 2, "w": 12.0, "active": [0, 1, 3]},
              {"e": "landed", "pid": 1, "n": 2, "w": 13.0, "snapshot": landed},
              {"e": "resume", "pid": 1, "n": 2, "w": 13.0, "origin": "nothing", "step": None, "p": 0},
              {"e": "step", "pid": 1, "n": 2, "w": 13.0, "p": 1}]
    return faults, events


def test_a_snapshot_a_loss_kept_from_landing_is_not_counted_saved_and_one_that_landed_is():
    assert diagnose(*_records_of_a_snapshot_interrupted_by_a_loss(None)).problems == ()
    (problem,) = diagnose(*_records_of_a_snapshot_interrupted_by_a_loss(3)).problems
    assert problem.kind == "restored_nothing" and "snapshot of step 3" in problem.detail


def _claiming_loop(claim_down: bool):
    """After slice 2 is lost, each attempt claims every slice (``claim_down``), or only
    those pathwaysutils found up, builds its mesh from the claimed ones and steps on it."""
    from pathwaysutils.elastic import manager as pw_manager

    manager = pw_manager.Manager()

    @manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=30,
                           retry_policy=pw_manager.ElasticRetryLimit(max_attempts=3))
    def train():
        if claim_down and manager.active_slice_count < manager.total_slice_count:
            manager.active_slice_indices = manager.all_slice_indices  # slice 2 is down
        devices = [d for i in sorted(manager.active_slice_indices) for d in manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices).reshape(manager.active_slice_count, -1), ("replica", "data"))
        w = jax.device_put(np.zeros(4, np.float32), NamedSharding(mesh, PartitionSpec()))
        for _ in range(6):
            w = jax.jit(lambda v: v + 1)(w)
            float(w[0])

    train()


@pytest.mark.libraries
@pytest.mark.parametrize("claim_down", [True, False])
def test_work_placed_on_a_slice_the_program_claimed_while_it_was_down_is_mesh_on_lost_slice(claim_down):
    with SimulatedSlices(4, 2, schedule="lose:2@3") as sim:
        try:
            _claiming_loop(claim_down)
        except Exception:  # noqa: BLE001 - the claiming loop fails every attempt: its diagnosis says why
            assert claim_down
    kinds = set(_kinds(sim.diagnose().problems))
    assert kinds == ({"mesh_on_lost_slice"} if claim_down else set())


def _records_of_a_preemption_with_a_save_after_the_signal(landed):
    """A checkpointing process preempted at step 6 that requests a checkpoint of step 6 after
    the signal, and a restart; ``landed``: the restart's ``landed`` record (``None``: none)."""
    faults = [{"scheduled": "preempt@6/step", "action": "preempt", "slice": None, "phase": "step", "step": 6,
               "pid": 1, "wall": 16.5}]
    events = [{"e": "attempt", "pid": 1, "n": 1, "w": 1.0, "active": [0, 1, 2, 3]},
              *({"e": "step", "pid": 1, "n": 1, "w": 10.0 + i, "p": i + 1} for i in range(6)),
              {"e": "save", "pid": 1, "n": 1, "w": 12.5, "kind": "checkpoint", "step": 2, "p": 2, "skipped": False},
              {"e": "save", "pid": 1, "n": 1, "w": 16.6, "kind": "checkpoint", "step": 6, "p": 6, "skipped": False},
              {"e": "attempt", "pid": 2, "n": 1, "w": 20.0, "active": [0, 1, 2, 3]},
              *([{"e": "landed", "pid": 2, "n": 1, "w": 21.0, "checkpoint": landed}] if landed is not None else []),
              {"e": "resume", "pid": 2, "n": 1, "w": 21.0, "origin": "checkpoint", "step": landed or 2,
               "p": landed or 2},
              {"e": "step", "pid": 2, "n": 1, "w": 21.0, "p": (landed or 2) + 1}]
    return faults, events


def test_a_checkpoint_requested_after_the_signal_counts_only_once_committed_and_silence_when_it_cannot_be_told():
    (problem,) = diagnose(*_records_of_a_preemption_with_a_save_after_the_signal(2)).problems  # never committed
    assert problem.kind == "no_save_at_preemption" and "resumed from the checkpoint of step 2 and redid 4 steps" in (
        problem.detail)
    assert diagnose(*_records_of_a_preemption_with_a_save_after_the_signal(6)).problems == ()  # committed
    assert diagnose(*_records_of_a_preemption_with_a_save_after_the_signal(None)).problems == ()  # cannot tell


def _records_of_a_slice_back_and_lost_again(lost_again):
    """Slice 1 back at step 7 (and, ``lost_again``, lost again at once), then named in the
    Manager's available_inactive_slices, never read, and 6 more steps trained."""
    faults = [{"scheduled": "restore:1@7/step", "action": "restore", "slice": 1, "phase": "step", "step": 7,
               "pid": 1, "wall": 20.0}]
    if lost_again:
        faults.append({"scheduled": "lose:1@7/step", "action": "lose", "slice": 1, "phase": "step", "step": 7,
                       "pid": 1, "wall": 20.001})
    events = [{"e": "attempt", "pid": 1, "n": 1, "w": 1.0, "active": [0, 2]},
              {"e": "resume", "pid": 1, "n": 1, "w": 2.0, "origin": "nothing", "step": None, "p": 0},
              *({"e": "step", "pid": 1, "n": 1, "w": 13.0 + i, "p": i + 1} for i in range(7)),
              {"e": "available", "pid": 1, "n": 1, "w": 20.01, "slices": [1]},
              *({"e": "step", "pid": 1, "n": 1, "w": 21.0 + i, "p": i + 8} for i in range(6))]
    return faults, events


def test_a_slice_lost_again_as_it_came_back_is_not_a_returned_slice_ignored_and_one_that_stayed_is():
    found = diagnose(*_records_of_a_slice_back_and_lost_again(True))
    assert found.problems == () and found.costs[0].steps_short == 0
    (problem,) = diagnose(*_records_of_a_slice_back_and_lost_again(False)).problems
    assert problem.kind == "returned_slice_ignored" and "6 steps trained without it" in problem.detail


@pytest.mark.libraries
def test_a_loop_checkpointing_through_orbax_v1_that_never_loads_is_named_restored_nothing_and_nothing_else(tmp_path):
    """The corpus's MaxText-shaped loop with its one mistake: checkpoints committed, never loaded."""
    from programs.corpus import maxtext_checkpointing

    with SimulatedSlices(4, 2, schedule="lose:1@4,restore:1@7") as sim:
        maxtext_checkpointing.main(["--checkpoints", str(tmp_path / "c"), "--mistake", "restored_nothing"])
    problems = sim.diagnose().problems
    assert _kinds(problems) == ["restored_nothing", "restored_nothing"]
    assert "although the checkpoint of step 2 had been saved" in problems[0].detail


def _records_of_a_restart_after_a_save_in_flight(landed):
    """A process checkpointing every 2 steps without waiting for the commit, killed at step 4
    after requesting step 2 (MaxText's steps: the checkpoint of step N holds N+1 steps), and
    its restart starting over; ``landed``: the newest committed step its ``landed`` record
    read (``None``: none)."""
    faults = [{"scheduled": "kill@4/step", "action": "kill", "slice": None, "phase": "step", "step": 4,
               "pid": 1, "wall": 14.5}]
    events = [{"e": "attempt", "pid": 1, "n": 1, "w": 1.0, "active": [0, 1]},
              *({"e": "step", "pid": 1, "n": 1, "w": 10.0 + i, "p": i + 1} for i in range(4)),
              {"e": "save", "pid": 1, "n": 1, "w": 10.1, "kind": "checkpoint", "step": 0, "p": 1, "skipped": False},
              {"e": "save", "pid": 1, "n": 1, "w": 12.1, "kind": "checkpoint", "step": 2, "p": 3, "skipped": False},
              {"e": "attempt", "pid": 2, "n": 1, "w": 20.0, "active": [0, 1]},
              {"e": "landed", "pid": 2, "n": 1, "w": 21.0, "checkpoint": landed},
              {"e": "resume", "pid": 2, "n": 1, "w": 21.0, "origin": "nothing", "step": None, "p": 0},
              {"e": "step", "pid": 2, "n": 1, "w": 21.0, "p": 1}]
    return faults, events


def test_a_save_still_in_flight_at_the_end_of_a_process_is_not_counted_saved_by_restored_nothing():
    assert diagnose(*_records_of_a_restart_after_a_save_in_flight(None)).problems == ()  # nothing had committed
    (problem,) = diagnose(*_records_of_a_restart_after_a_save_in_flight(0)).problems  # step 0 had, step 2 had not
    assert problem.kind == "restored_nothing" and "the checkpoint of step 0 had been saved" in problem.detail
    (problem,) = diagnose(*_records_of_a_restart_after_a_save_in_flight(2)).problems
    assert "the checkpoint of step 2 had been saved" in problem.detail


def test_steps_counted_before_the_simulator_started_its_count_again_are_no_steps_and_no_resume():
    """A restarted process whose data generator was counted as its first step until its step
    function, carrying more state, superseded it (MaxText's): the resume is the step
    function's first, from the checkpoint it restored, not the generator's, from nothing."""
    faults = [{"scheduled": "preempt@5/step", "action": "preempt", "slice": None, "phase": "step", "step": 5,
               "pid": 1, "wall": 15.5}]
    events = [{"e": "attempt", "pid": 1, "n": 1, "w": 1.0, "active": [0, 1]},
              {"e": "resume", "pid": 1, "n": 1, "w": 9.5, "origin": "nothing", "step": None, "p": 0},
              *({"e": "step", "pid": 1, "n": 1, "w": 10.0 + i, "p": i + 1} for i in range(6)),
              {"e": "save", "pid": 1, "n": 1, "w": 15.6, "kind": "checkpoint", "step": 4, "p": 5, "skipped": False},
              {"e": "attempt", "pid": 2, "n": 1, "w": 20.0, "active": [0, 1]},
              {"e": "restore", "pid": 2, "n": 1, "w": 20.5, "kind": "checkpoint", "step": 4, "p": 5},
              {"e": "landed", "pid": 2, "n": 1, "w": 21.0, "checkpoint": 4},
              {"e": "resume", "pid": 2, "n": 1, "w": 21.0, "origin": "nothing", "step": None, "p": 0},
              {"e": "step", "pid": 2, "n": 1, "w": 21.0, "p": 1},  # the generator's dispatch
              {"e": "superseded", "pid": 2, "n": 1, "w": 21.5},
              {"e": "landed", "pid": 2, "n": 1, "w": 21.6, "checkpoint": 4},
              {"e": "resume", "pid": 2, "n": 1, "w": 21.6, "origin": "checkpoint", "step": 4, "p": 5},
              *({"e": "step", "pid": 2, "n": 1, "w": 22.0 + i, "p": i + 6} for i in range(3))]
    found = diagnose(faults, events)
    assert found.problems == ()
    (cost,) = found.costs
    assert (cost.resumed_from, cost.resumed_step, cost.redone_steps) == ("checkpoint", 4, 1)
    assert found.totals.steps == 9
    assert diagnose(faults, [e for e in events if e["e"] != "superseded"]).problems  # counted, it would be one
