"""The fault schedule: its grammar, firing once per phase, and the durable fault log.

Preempt and kill are real signals, so the restart test runs real subprocesses: SIGTERM and
SIGKILL go to them, and each is started again with the same command and fault log, as a
JobSet restarts a pod.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastic_dew.elastic import hooks
from elastic_dew.simulate import ScheduledFault, Schedule, SimulatedSlices, parse_schedule
from elastic_dew.simulate.runner import ScheduleRunner

REPO = Path(__file__).resolve().parent.parent


def test_the_issue_example_parses_with_step_as_the_default_phase():
    schedule = parse_schedule("lose:1@20,restore:1@40,preempt@60,kill@80")
    assert schedule.faults == (
        ScheduledFault("lose", 1, 20, "step"),
        ScheduledFault("restore", 1, 40, "step"),
        ScheduledFault("preempt", None, 60, "step"),
        ScheduledFault("kill", None, 80, "step"),
    )
    assert str(schedule) == "lose:1@20/step,restore:1@40/step,preempt@60/step,kill@80/step"
    assert parse_schedule(str(schedule)) == schedule


def test_every_phase_parses_and_whitespace_is_tolerated():
    text = " lose:0@1/snapshot , restore:0@2/snapshot_load,lose:2@3/checkpoint,restore:2@4/checkpoint_restore,preempt@5/compile,kill@6/scale_up,preempt@7/stop,lose:3@8/dispatch,kill@9/wait,restore:2@10/eval,lose:1@0/step "
    phases = [fault.phase for fault in parse_schedule(text)]
    assert phases == list(hooks.PHASES[1:]) + ["step"]


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_schedule_has_no_faults(text):
    assert parse_schedule(text) == Schedule()


@pytest.mark.parametrize(
    ("text", "bad_token", "problem"),
    [
        ("lose@3", "lose@3", "lose needs a slice, e.g. lose:1@3"),
        ("explode:1@3", "explode:1@3", "unknown action 'explode'; actions are lose, restore, hang, suspend, wake, error, preempt, kill"),
        ("lose:x@3", "lose:x@3", "slice 'x' is not a whole number >= 0"),
        ("lose:1@", "lose:1@", "step '' is not a whole number"),
        ("lose:1@-2", "lose:1@-2", "step '-2' is not a whole number >= 0"),
        ("lose:1@3/lunch", "lose:1@3/lunch", "unknown phase 'lunch'; phases are step, snapshot"),
        ("preempt:1@3", "preempt:1@3", "preempt acts on the whole process and takes no slice; write preempt@3"),
        ("lose:1@3,,kill@4", "", "empty token (a stray comma?)"),
        ("lose:1@3,restore:1", "restore:1", "expected ACTION[:SLICE]@STEP[/PHASE]"),
    ],
)
def test_a_syntax_error_names_the_bad_token_and_what_is_wrong(text, bad_token, problem):
    with pytest.raises(ValueError) as caught:
        parse_schedule(text)
    message = str(caught.value)
    assert f"bad fault {bad_token!r}" in message
    assert problem in message
    assert "grammar: ACTION[:SLICE]@STEP[/PHASE]" in message


def test_a_fault_fires_once_at_the_first_announcement_of_its_phase_at_or_after_its_step(tmp_path, caplog):
    caplog.set_level("WARNING", logger="elastic_dew.simulate.runner")
    log = tmp_path / "faults.jsonl"
    with SimulatedSlices(4, 2, schedule="lose:1@3,restore:1@5/snapshot,lose:2@4/checkpoint", fault_log=log) as sim:
        hooks.phase("step", 2)
        hooks.phase("snapshot", 3)
        assert sim.lost == frozenset()
        hooks.phase("step", 4)  # first step announcement at or after 3
        assert sim.lost == {1}
        hooks.phase("snapshot", 4)
        assert sim.lost == {1}
        hooks.phase("snapshot", 6)
        assert sim.lost == frozenset()
        hooks.phase("step", 7)  # lose:1@3 already fired: it does not fire again
        hooks.phase("snapshot", 8)
        assert sim.lost == frozenset()
        hooks.phase("checkpoint", 4)
        assert sim.lost == {2}
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["scheduled"], r["phase"], r["step"]) for r in records] == [
        ("lose:1@3/step", "step", 4),
        ("restore:1@5/snapshot", "snapshot", 6),
        ("lose:2@4/checkpoint", "checkpoint", 4),
    ]
    assert [r.getMessage() for r in caplog.records if r.name == "elastic_dew.simulate.runner"] == [
        "firing scheduled fault lose:1@3/step at step 4 (phase step)",
        "firing scheduled fault restore:1@5/snapshot at step 6 (phase snapshot)",
        "firing scheduled fault lose:2@4/checkpoint at step 4 (phase checkpoint)",
    ]


class _Slices:
    """The simulator's side of a fired slice fault, recorded instead of acted on."""

    def __init__(self):
        self.lost, self.hung = [], frozenset()

    def lose(self, index, code=None):
        self.lost.append(index)

    def restore(self, index):
        self.lost.remove(index)


def test_work_in_flight_is_landed_before_a_phase_that_meets_it_and_before_a_step_keyed_fault_unless_a_slice_hangs():
    slices = _Slices()
    landed = []
    runner = ScheduleRunner(parse_schedule("lose:1@3,restore:1@+0/dispatch"), slices, None,
                            land=lambda: landed.append(list(slices.lost)))
    meeting = []
    for phase in hooks.PHASES:  # nothing is due at step 1: the phase alone decides
        before = len(landed)
        runner.on_phase(phase, 1)
        meeting += [phase] * (len(landed) - before)
    assert meeting == [name for name, entry in hooks.PHASE_TABLE.items() if entry.meets_in_flight]
    assert "snapshot" in meeting  # a snapshot save is skipped while the previous copy runs
    landed.clear()
    runner.on_phase("step", 3)  # landed, then lose:1 fired
    runner.on_phase("dispatch", 4)  # only a time-keyed fault is due: nothing to land for
    assert landed == [[]] and slices.lost == []
    slices.hung = frozenset({2})
    runner.on_phase("snapshot", 5)  # the work in flight may wait on the hung slice
    assert landed == [[]]


def test_the_listener_is_removed_on_exit():
    with SimulatedSlices(2, 2, schedule="lose:0@0") as sim:
        pass
    hooks.phase("step", 5)
    assert sim.fired == frozenset()


def test_a_fault_log_from_another_schedule_is_refused(tmp_path):
    log = tmp_path / "faults.jsonl"
    log.write_text(json.dumps({"event": "fault", "index": 0, "scheduled": "lose:1@3/step", "action": "lose",
                               "slice": 1, "step": 3, "phase": "step", "wall": 1.0}) + "\n")
    with pytest.raises(ValueError, match="belongs to another run"):
        SimulatedSlices(2, 2, schedule="kill@3", fault_log=log)


_RUN = textwrap.dedent(
    """
    import os, signal, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    from elastic_dew.elastic import hooks
    from elastic_dew.simulate import SimulatedSlices

    progress = open(sys.argv[2], "a")
    def on_sigterm(signum, frame):
        progress.write("SIGTERM\\n"); progress.flush()
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_sigterm)

    with SimulatedSlices(2, 1, schedule="lose:1@1,preempt@3,kill@6,restore:1@7", fault_log=sys.argv[1]) as sim:
        for step in range(10):
            progress.write(f"{step}\\n"); progress.flush()
            hooks.phase("step", step)
        progress.write(f"done lost={sorted(sim.lost)}\\n")
    """
)


@pytest.mark.slow
def test_faults_fire_once_per_run_across_a_sigterm_and_a_sigkill_restart(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(_RUN)
    log, progress = tmp_path / "faults.jsonl", tmp_path / "progress.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(script), str(log), str(progress)]

    codes = [subprocess.run(command, env=env, timeout=120).returncode for _ in range(3)]

    assert codes == [143, -signal.SIGKILL, 0]
    lines = progress.read_text().split()
    # run 1: SIGTERM at step 3; run 2: killed at step 6; run 3: no faults left but the restore.
    assert lines == (
        ["0", "1", "2", "3", "SIGTERM"]
        + ["0", "1", "2", "3", "4", "5", "6"]
        + ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "done", "lost=[]"]
    )
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["scheduled"] for r in records] == [
        "lose:1@1/step",
        "preempt@3/step",
        "kill@6/step",  # recorded before the SIGKILL that ended its process
        "restore:1@7/step",
    ]
    assert len({r["pid"] for r in records}) == 3


def test_the_grammar_and_the_firing_read_one_action_table(monkeypatch):
    """A new action is one table entry: it parses (with or without a slice) and fires once."""
    from elastic_dew.simulate import schedule as schedule_module

    fired = []
    extra = schedule_module.Action("nudge", takes_slice=True, ends_process=False, fire=lambda target, fault: fired.append(fault))
    monkeypatch.setattr(schedule_module, "ACTION_TABLE", {**schedule_module.ACTION_TABLE, "nudge": extra})
    monkeypatch.setattr(schedule_module, "ACTIONS", tuple(schedule_module.ACTION_TABLE))
    assert parse_schedule("nudge:1@2") == Schedule((ScheduledFault("nudge", 1, 2, "step"),))
    with pytest.raises(ValueError, match="nudge needs a slice"):
        parse_schedule("nudge@2")
    with SimulatedSlices(2, 2, schedule="nudge:1@2"):
        hooks.phase("step", 2)
        hooks.phase("step", 3)
    assert fired == [ScheduledFault("nudge", 1, 2, "step")]
