"""Every fault at every phase: slice loss, preemption, all slices lost, retry exhausted.

Each scenario trains a small linear model for 12 steps through the real ``Trainer`` on
4 simulated slices of 2 CPU devices (TPU slices cannot exist here; the simulator makes CPU
devices fail as Pathways slices do), with a fault schedule in the simulator's grammar. A
preemption is a real SIGTERM to this process; the run is then restarted on the same run
directory and fault log, as a JobSet restarts the controller. :func:`elastic_dew.testing.check`
asserts the invariants of every scenario:

* exactly-once data relative to the committed steps (the run record's commit rule);
* final parameters equal to the failure-free run's: bitwise when every committed step ran
  on all four slices, ``allclose(rtol=1e-5, atol=1e-6)`` where the mesh changed;
* no committed checkpoint deleted or damaged (hashed at every phase and at the end);
* a run record consistent with what happened (one start per process, each restart
  resuming at the checkpoint its preemption wrote, the summary matching the record).

Each test also asserts that its faults fired and the stops and resumes they must cause.
"""

from __future__ import annotations

import pytest
from pathwaysutils.elastic.manager import ElasticRuntimeError

from elastic_dew import record
from elastic_dew import testing as chaos
from elastic_dew.commands.report import report

from faultlib import assert_all_fired, assert_invariants, events, kinds


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    """The failure-free run's final parameters (12 steps)."""
    return chaos.reference(12, tmp_path_factory.mktemp("reference"))


def _run(tmp_path, schedule, **settings) -> chaos.ScenarioOutcome:
    return chaos.run(chaos.Scenario(schedule=schedule, **settings), tmp_path / "run")


def _losses(outcome) -> list[int]:
    return [k[2] for k in kinds(outcome) if k[:2] == ("stop", "slice_lost")]


# ------------------------------------------------------------------ a slice lost at each phase

SLICE_LOSS_AT_EVERY_PHASE = {
    # phase: schedule (steps 1-12, snapshots every 2, checkpoints every 4)
    "step": "lose:1@5",
    "snapshot": "lose:1@6/snapshot",
    "snapshot_load": "lose:1@5,lose:2@5/snapshot_load",
    "snapshot_load_then_preempted": "lose:1@5,lose:2@5/snapshot_load,preempt@5/snapshot_load,lose:3@8",
    "checkpoint_restore": "preempt@6,lose:1@6/checkpoint_restore",
    "compile_after_resize": "lose:1@5,lose:2@5/compile",
    "checkpoint": "lose:1@8/checkpoint",
    "scale_up": "lose:1@3,restore:1@5,lose:2@5/scale_up",
    "stop": "preempt@6,lose:1@6/stop",
}


@pytest.mark.parametrize("phase", sorted(SLICE_LOSS_AT_EVERY_PHASE))
@pytest.mark.slow
def test_a_slice_lost_at_any_phase_keeps_every_invariant(phase, tmp_path, expected):
    outcome = _run(tmp_path, SLICE_LOSS_AT_EVERY_PHASE[phase])
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    assert _losses(outcome), kinds(outcome)
    committed = record.committed_step_lines(events(outcome))
    if phase == "stop":
        # The notice is pending when the wait for slices begins: it ends the wait at once
        # (issue 12), so the run stops there and its re-run goes on every slice.
        assert outcome.processes == 2 and ("stop", "preempted", outcome.preempted_at[0]) in kinds(outcome)
        return
    assert any(e["slices"] < chaos.TOTAL_SLICES for e in committed), "the run never went on fewer slices"


def test_two_losses_in_a_row_continue_on_two_slices(tmp_path, expected):
    outcome = _run(tmp_path, "lose:1@5,lose:2@6")
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    assert len(_losses(outcome)) == 2
    assert record.committed_step_lines(events(outcome))[-1]["slices"] == 2


def test_a_slice_that_flaps_is_added_back_every_time_without_exhausting_the_retry_policy(tmp_path, expected):
    """Four losses of the same slice, each followed by its return: ``max_attempts=5`` allows
    exactly four slice losses, so a policy that also counted the four scale-ups would give up."""
    schedule = ",".join(f"lose:1@{s},restore:1@{s + 1}" for s in (2, 4, 6, 8))
    outcome = _run(tmp_path, schedule, max_attempts=5)
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    assert len(_losses(outcome)) == 4
    scale_ups = [k for k in kinds(outcome) if k[:2] == ("stop", "scale_up")]
    assert len(scale_ups) == 4
    assert ("resume", "live", scale_ups[-1][2] + 1) in kinds(outcome)
    assert record.committed_step_lines(events(outcome))[-1]["slices"] == chaos.TOTAL_SLICES


def test_every_slice_lost_waits_then_times_out_with_a_clear_error_and_the_newest_checkpoint_intact(tmp_path, expected):
    outcome = _run(tmp_path, "lose:0@6,lose:1@6,lose:2@6,lose:3@6", timeout=1.0)
    assert_all_fired(outcome)
    assert isinstance(outcome.error, TimeoutError), repr(outcome.error)
    message = str(outcome.error)
    assert "1 healthy slice" in message and "timeout=1.0 s" in message, message
    assert "checkpoint 4" in message and "run the same command again" in message, message
    assert_invariants(outcome, expected, expect_error=TimeoutError)
    assert sorted(outcome.checkpoints_seen) == [4]
    assert chaos.committed_checkpoints(outcome.checkpoint_dir)[4] == outcome.checkpoints_seen[4]
    assert kinds(outcome)[-1] == ("stop", "slice_lost", 5)


def test_the_retry_policy_exhausted_surfaces_elastic_runtime_error_and_leaves_the_record_intact(tmp_path, expected):
    """``max_attempts=2`` allows one slice loss; the second ends the run."""
    outcome = _run(tmp_path, "lose:1@5,lose:2@8", max_attempts=2)
    assert_all_fired(outcome)
    assert isinstance(outcome.error, ElasticRuntimeError), repr(outcome.error)
    message = str(outcome.error)
    assert "gave up after step 7: slice losses reached max_attempts=2" in message, message
    assert "the newest committed checkpoint 4" in message and "run the same command again" in message, message
    assert_invariants(outcome, expected, expect_error=ElasticRuntimeError)
    assert _losses(outcome) == [4, 7]
    # The record is whole: every line parses, and the report reads it.
    lines = (outcome.run_dir / record.EVENTS_FILE).read_text().splitlines()
    assert len(lines) == len(events(outcome))
    summary, _, table = report(outcome.run_dir, timeline=False)
    assert summary["final_step"] == 7 and summary["examples_consumed"] == 7 * chaos.GLOBAL_BATCH
    assert "slice_lost 2" in table


@pytest.mark.parametrize(("reset_steps", "finishes"), [(3, True), (0, False)])
@pytest.mark.slow
def test_the_retry_budget_starts_again_after_a_stretch_of_progress_and_counts_over_the_run_when_it_is_zero(
    reset_steps, finishes, tmp_path, expected
):
    """``max_attempts=2`` survives one loss in a row. Three losses of slice 1, each 3 steps
    of progress after the one before (and each followed by its return): with
    ``retry_reset_steps=3`` every loss starts a new count and the run finishes on four
    slices; with 0 (pathwaysutils' ``ElasticRetryLimit`` over the whole run) the second
    loss ends it."""
    schedule = "lose:1@3,restore:1@4,lose:1@6,restore:1@7,lose:1@9,restore:1@10"
    outcome = _run(tmp_path, schedule, max_attempts=2, retry_reset_steps=reset_steps)
    if finishes:
        assert_all_fired(outcome)
        assert_invariants(outcome, expected)
        assert _losses(outcome) == [2, 5, 8]
        assert record.committed_step_lines(events(outcome))[-1]["slices"] == chaos.TOTAL_SLICES
        return
    assert isinstance(outcome.error, ElasticRuntimeError), repr(outcome.error)
    assert "slice losses reached max_attempts=2 (counted over the whole run)" in str(outcome.error)
    assert_invariants(outcome, expected, expect_error=ElasticRuntimeError)
    assert _losses(outcome) == [2, 5]


# ------------------------------------------------------------------ preemption

PREEMPTION_AT = {
    "mid_step": "preempt@6",
    "snapshot": "preempt@6/snapshot",
    "checkpoint_save": "preempt@8/checkpoint",
    "recovery_snapshot_load": "lose:1@5,preempt@5/snapshot_load",
    "recovery_compile": "lose:1@5,preempt@5/compile",
    "scale_up": "lose:1@3,restore:1@5,preempt@5/scale_up",
    "last_step": "preempt@12",
}


@pytest.mark.parametrize("when", sorted(PREEMPTION_AT))
@pytest.mark.slow
def test_a_preemption_at_any_moment_stops_at_a_committed_checkpoint_and_the_rerun_finishes(when, tmp_path, expected):
    outcome = _run(tmp_path, PREEMPTION_AT[when])
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    assert len(outcome.preempted_at) == 1 and outcome.processes == 2
    stop = outcome.preempted_at[0]
    assert stop in outcome.checkpoints_seen
    assert ("stop", "preempted", stop) in kinds(outcome)


def test_a_second_sigterm_while_stopping_is_ignored_and_the_stop_is_written_once(tmp_path, expected):
    outcome = _run(tmp_path, "preempt@6,preempt@6/stop")
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    assert outcome.preempted_at == [6] and outcome.processes == 2 and 6 in outcome.checkpoints_seen
    assert [k for k in kinds(outcome) if k[:2] == ("stop", "preempted")] == [("stop", "preempted", 6)]
    saves = [e for e in events(outcome) if e["event"] == "save" and e["tier"] == "checkpoint" and e["step"] == 6]
    assert len(saves) == 1


def test_a_slice_lost_while_restoring_a_finished_runs_state_is_retried_not_raised_to_the_caller(tmp_path, expected):
    """Found by chaos seed 26: preempted at the last step, the restarted run has no step to
    do, so nothing read its restored state inside the retry and the loss surfaced in the
    trainer's final read as a crash. The loss now surfaces while the resume prepares the
    saves on the restored state, before the resume is recorded; its stop names the
    restored step."""
    outcome = _run(tmp_path, "preempt@12,lose:1@12/checkpoint_restore")
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    assert kinds(outcome)[-4:] == [
        ("stop", "preempted", 12), ("stop", "slice_lost", 12), ("resume", "checkpoint", 13), ("stop", "done", 12),
    ]


# ------------------------------------------------------------------ compound faults (the soak's finds)


def test_a_preemption_during_a_slice_loss_recovery_with_nothing_persisted_stops_at_step_0(tmp_path, expected, caplog):
    """Found by the chaos soak: the second attempt loses a slice while step 5's checkpoint
    is written, and the preemption notice arrives in the same phase. No snapshots are
    taken and step 5's checkpoint died with the slice, so nothing of the run is persisted:
    the stop is of step 0 (it said step 5, and the re-run then silently started fresh),
    the log names the five steps lost, and the record counts them as wasted progress."""
    schedule = "lose:1@3/checkpoint,lose:2@5/step,preempt@5/checkpoint"
    with caplog.at_level("WARNING", logger="elastic_dew.elastic.loop.protocol"):
        outcome = _run(tmp_path, schedule, snapshot_every=0, checkpoint_every=5)
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    assert outcome.preempted_at == [0]
    turns = kinds(outcome)
    assert ("stop", "slice_lost", 5) in turns
    assert turns[turns.index(("stop", "preempted", 0)) + 1] == ("resume", "fresh", 1)
    assert "steps 1..5 (5) were not persisted and will be run again" in caplog.text
    summary = record.load_summary(outcome.run_dir)
    assert summary["badput"]["wasted_progress_from_disruption"] > 0
