"""The verdict on correct programs: every fault fired, no problem, and costs that say what the program did.

The corpus is ``tests/programs/corpus/``: one correct program a file, each a shape a user of
pathwaysutils writes (the resilience guide's example completed to run, taking a returned
slice up in place; a loop that scales up by ``ScaleUpSignalError``; a pause-resume loop; a
loop restoring from an Orbax ``CheckpointManager`` made per attempt; a loop checkpointing as
MaxText's pre-training program does (a v1 ``training.Checkpointer`` per attempt, its
``load_checkpointables``, asynchronous saves, a data generator dispatched before each step); a loop
of two float32 scalars that calls ``pathwaysutils.initialize()``; pathwaysutils' own
``extras.simple_model`` workload; the own-loop page's example). None imports elastic_dew
except the own-loop page's, which is elastic_dew's own loop. Each runs here in this process
under :class:`SimulatedSlices` (the simulator stands in for TPU slices on CPU devices, the
only mock: slices cannot exist here) and under the schedules its docstring names; a
preemption needs a process that ends and one that restarts, so those run through
``elastic-dew simulate`` as a user runs it. Each test pins the costs: where each recovery
resumed from (tier and the program's own step number), the steps redone, and the step a
returned slice was taken up.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from elastic_dew.simulate import SimulatedSlices

CORPUS = REPO / "tests" / "programs" / "corpus"

#: (program, schedule, costs): each cost as ``(resumed_from, resumed_step, redone_steps)``
#: for a fault that stops work, ``("part of", FAULT)`` for one whose recovery another
#: carries, ``("taken up after", STEPS)`` for a returned slice (``("taken up after", STEPS,
#: REDONE)`` when the attempt that took it up redid steps since the newest checkpoint).
CASES = [
    ("guide_example", "lose:2@9,restore:2@17", [("snapshot", 7, 1), ("taken up after", 0)]),
    ("guide_example", "lose:1@4,lose:2@8", [("snapshot", 2, 1), ("snapshot", 5, 1)]),
    ("guide_example", "hang:1@5,lose:1@+2", [("snapshot", 3, 1), ("part of", "hang:1@5/step")]),
    ("scale_up_signal", "lose:2@9,restore:2@17", [("snapshot", 8, 1), ("taken up after", 0)]),
    ("scale_up_signal", "lose:1@4,lose:2@8", [("snapshot", 3, 1), ("snapshot", 6, 1)]),
    ("pause_resume", "lose:2@9,restore:2@+3", [("snapshot", 8, 1), ("taken up after", 0)]),
    ("pause_resume", "hang:1@5,lose:1@+2,restore:1@+1",
     [("snapshot", 4, 1), ("part of", "hang:1@5/step"), ("taken up after", 0)]),
    ("orbax_per_attempt", "lose:2@9,restore:2@17", [("checkpoint", 8, 1), ("taken up after", 0)]),
    ("orbax_per_attempt", "lose:1@4,lose:2@8", [("checkpoint", 2, 2), ("checkpoint", 4, 2)]),
    ("orbax_per_attempt", "hang:1@5,lose:1@+2", [("checkpoint", 4, 1), ("part of", "hang:1@5/step")]),
    ("orbax_v1_checkpointer", "lose:1@5", [("checkpoint", 4, 1)]),
    ("orbax_v1_checkpointer", "lose:1@4,lose:2@8", [("checkpoint", 2, 2), ("checkpoint", 4, 2)]),
    ("tiny_state", "lose:1@6,restore:1@12", [("snapshot", 5, 1), ("taken up after", 0)]),
    ("tiny_state", "hang:1@5,lose:1@+2", [("snapshot", 4, 1), ("part of", "hang:1@5/step")]),
    ("own_loop_page", "lose:3@8,restore:3@16", [("snapshot", 5, 3), ("taken up after", 0)]),
    ("own_loop_page", "lose:1@4,lose:2@8", [("nothing", None, 4), ("snapshot", 5, 3)]),
    ("pathwaysutils_simple_model", "lose:2@3,restore:2@5", [("snapshot", 2, 1), ("taken up after", 0)]),
    ("boundary_two_scalars", "lose:1@6,restore:1@12", [("snapshot", 5, 1), ("taken up after", 0)]),
    ("boundary_two_scalars", "hang:1@5,lose:1@+2", [("snapshot", 4, 1), ("part of", "hang:1@5/step")]),
    ("boundary_pause_resume", "lose:2@9,restore:2@+3", [("snapshot", 8, 1), ("taken up after", 0)]),
    ("maxtext_checkpointing", "lose:1@4,restore:1@7", [("checkpoint", 2, 1), ("taken up after", 0, 1)]),
    ("maxtext_checkpointing", "lose:1@4,lose:2@6,restore:1@8,restore:2@9",
     [("checkpoint", 2, 1), ("checkpoint", 2, 2), ("taken up after", 0), ("taken up after", 0, 1)]),
    ("maxtext_checkpointing", "hang:1@4,lose:1@+3,restore:1@7",
     [("checkpoint", 2, 1), ("part of", "hang:1@4/step"), ("taken up after", 0, 1)]),
    ("maxtext_checkpointing", "lose:1@4,restore:1@+3", [("checkpoint", 2, 1), ("taken up after", 0)]),  # pause-resume
]
#: The cases run with the program's pause-resume form (every slice or none).
ALL_SLICES = {("maxtext_checkpointing", "lose:1@4,restore:1@+3")}


def _schedules(path: Path) -> list[str]:
    (line,) = [line for line in path.read_text().splitlines() if line.startswith("Schedules: ")]
    return line.removeprefix("Schedules: ").split("; ")


def _cost(cost) -> tuple:
    if cost.part_of is not None:
        return ("part of", cost.part_of)
    if cost.action in ("restore", "wake"):  # with the steps its new attempt redid, if any
        return ("taken up after", cost.taken_up_after_steps) + ((cost.redone_steps,) if cost.redone_steps else ())
    return (cost.resumed_from, cost.resumed_step, cost.redone_steps)


def _first(case: tuple) -> bool:
    """The first case of each program (but pathwaysutils' model, which compiles for seconds)
    runs in the quick suite; the others are slow."""
    return case[0] != "pathwaysutils_simple_model" and next(c for c in CASES if c[0] == case[0]) is case


def test_every_corpus_program_names_the_schedules_it_is_meant_for_and_each_is_run_here():
    programs = sorted(p.stem for p in CORPUS.glob("*.py"))
    assert programs and programs == sorted({name for name, _, _ in CASES} | {"guide_example"})
    for name in programs:
        schedules = _schedules(CORPUS / f"{name}.py")
        assert schedules and all(re.fullmatch(r"[a-z]+(:\d+)?@\+?\d+(,[a-z]+(:\d+)?@\+?\d+)*", s) for s in schedules)
    for name, schedule, _ in CASES:
        assert schedule in _schedules(CORPUS / f"{name}.py"), (name, schedule)


@pytest.mark.libraries
@pytest.mark.parametrize(("name", "schedule", "costs"), [
    pytest.param(*case, marks=[] if _first(case) else [pytest.mark.slow], id=f"{case[0]}-{case[1]}")
    for case in CASES])
def test_a_correct_program_gets_every_fault_fired_no_problem_and_costs_of_what_it_did(name, schedule, costs, tmp_path):
    program = importlib.import_module(f"programs.corpus.{name}")
    argv = {"orbax_per_attempt": ["--checkpoints", str(tmp_path / "checkpoints")],
            "orbax_v1_checkpointer": ["--checkpoints", str(tmp_path / "checkpoints")]
            + (["--by-path"] if "," in schedule else []),  # both ways Orbax v1 loads
            "own_loop_page": [str(tmp_path / "own")],
            "maxtext_checkpointing": ["--checkpoints", str(tmp_path / "checkpoints")]
            + (["--by-path"] if schedule.count(",") == 3 else [])}.get(name, [])  # both ways Orbax v1 loads
    argv += ["--all-slices"] if (name, schedule) in ALL_SLICES else []
    with SimulatedSlices(4, 2, schedule=schedule) as sim:
        program.main(argv)  # returns: the program finished
    found = sim.diagnose()
    assert len(sim.fired) == len(schedule.split(","))
    assert found.problems == (), found.lines()
    assert [_cost(c) for c in found.costs] == costs, found.lines()
    assert found.totals.redone_steps == sum(c[2] for c in costs if len(c) == 3)


# --------------------------------------------------------------------------- preemption, restarted


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.mark.slow
@pytest.mark.parametrize(("name", "schedule", "statuses", "resumed"), [
    ("orbax_per_attempt", "preempt@6", [143, 0], ("checkpoint", 6, 0)),  # saved at the boundary after the signal
    ("scale_up_signal", "preempt@6", [-15, 0], ("nothing", None, 6)),  # no checkpoints: starts over
    ("maxtext_checkpointing", "preempt@5", [143, 0], ("checkpoint", 4, 0)),  # saved at the boundary after the signal
])
def test_a_preempted_correct_program_restarts_with_no_problem_and_resumes_where_its_state_allows(
        name, schedule, statuses, resumed, tmp_path):
    assert schedule in _schedules(CORPUS / f"{name}.py")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "simulate", "--run-dir", str(tmp_path / "run"), "--report", str(report),
         "--schedule", schedule, "--", sys.executable, str(CORPUS / f"{name}.py"), "--steps", "10"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env(),
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    verdict = json.loads(report.read_text())
    assert [p["status"] for p in verdict["processes"]] == statuses
    assert verdict["never_fired"] == [] and verdict["problems"] == []
    (cost,) = verdict["costs"]
    assert (cost["resumed_from"], cost["resumed_step"], cost["redone_steps"]) == resumed
    assert "done at step 10" in proc.stdout


@pytest.mark.slow
def test_the_guides_example_run_as_a_user_runs_it_exits_0_taking_the_returned_slice_up_in_place(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "simulate", "--run-dir", str(tmp_path / "run"), "--report", str(report),
         "--schedule", "lose:2@9,restore:2@17", "--", sys.executable, str(CORPUS / "guide_example.py")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env(),
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    verdict = json.loads(report.read_text())
    assert verdict["problems"] == [] and verdict["never_fired"] == []
    assert [p["attempts"] for p in verdict["processes"]] == [[[0, 1, 2, 3], [0, 1, 3]]]  # no attempt for the return
    lose, restore = verdict["costs"]
    assert (lose["resumed_from"], lose["resumed_step"], lose["redone_steps"]) == ("snapshot", 7, 1)
    assert restore["taken_up_after_steps"] == 0 and "slice 2 back, taken up after 0 steps" in proc.stderr
    assert "done at step 24" in proc.stdout


@pytest.mark.slow
def test_a_save_still_in_flight_when_the_process_is_killed_is_not_counted_saved_and_the_restart_names_what_landed(
        tmp_path):
    """MaxText's shape: a save requested without waiting for its commit, the process killed one
    step later (SIGKILL: nothing can be saved). The restart resumes from the newest checkpoint
    committed on storage; the cost names that step, and no rule counts the save in flight."""
    report, run = tmp_path / "report.json", tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "simulate", "--run-dir", str(run), "--report", str(report),
         "--schedule", "kill@4", "--", sys.executable, str(CORPUS / "maxtext_checkpointing.py"), "--steps", "8"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env(),
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    verdict = json.loads(report.read_text())
    assert [p["status"] for p in verdict["processes"]] == [-9, 0] and verdict["problems"] == []
    records = [json.loads(line) for line in (run / "watch.jsonl").read_text().splitlines()]
    first, restart = verdict["processes"][0]["pid"], verdict["processes"][1]["pid"]
    assert 2 in [r["step"] for r in records if r["e"] == "save" and r["pid"] == first]  # requested before the kill
    landed = [r["checkpoint"] for r in records if r["e"] == "landed" and r["pid"] == restart][-1]
    (cost,) = verdict["costs"]
    expected = ("checkpoint", landed, 3 - landed) if landed is not None else ("nothing", None, 4)
    assert (cost["resumed_from"], cost["resumed_step"], cost["redone_steps"]) == expected
    assert "done at step 8" in proc.stdout
