"""What the local Pathways backend sees of a program's state becomes the in-process watch's records.

:class:`elastic_dew.proxy.records.StateRecords` is driven here as the backend drives it (a
step's inputs, copies into and out of pinned host memory, reads to and sends from the host),
and its records go through the verdict's own costs and rules
(:func:`elastic_dew.simulate.diagnosis.diagnose`). The end-to-end comparison with the
in-process boundary on real programs is ``tests/test_proxy_differential.py``.
"""

from __future__ import annotations

import json

import numpy as np

from elastic_dew.proxy.records import UNSEEN, StateRecords, charged_to_programs, unmet_losses
from elastic_dew.simulate.diagnosis import PROBLEMS, diagnose


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _fault(action, slice_index, step, wall, pid=999):
    return {"scheduled": f"{action}:{slice_index}@{step}/step", "action": action, "slice": slice_index,
            "phase": "step", "step": step, "pid": pid, "wall": wall}


def _loop(records, steps, state=None, held=lambda pid: None):
    for _ in range(steps):
        state = records.stepped([state], held)
    return state


def test_a_recovery_from_a_snapshot_costs_the_steps_since_the_state_it_copied_back(tmp_path):
    path = tmp_path / "watch.jsonl"
    records = StateRecords(path)
    records.process_started(41)
    records.attempt_started({0, 1})
    state = _loop(records, 3)
    pinned = records.copied(state, None, "pinned_host")  # the snapshot of the state after 3 steps
    state = _loop(records, 2, state)
    lost_at = _records(path)[-1]["w"] + 1e-6
    back = records.copied(pinned, "pinned_host", None)
    records.attempt_started({0})
    records.stepped([back], lambda pid: 3)
    events = _records(path)
    resume = next(e for e in events if e["e"] == "resume" and e["n"] == 2)
    assert (resume["origin"], resume["p"], resume["step"]) == ("snapshot", 3, None)
    assert [e["p"] for e in events if e["e"] == "step"] == [1, 2, 3, 4, 5, 4]
    diagnosis = diagnose([{**_fault("lose", 1, 5, lost_at), "pid": 41}], events)
    (cost,) = diagnosis.costs
    assert (cost.resumed_from, cost.redone_steps, cost.resumed_step) == ("snapshot", 2, None)
    assert "resumed from a snapshot (its step number is the program's" in cost.line()
    assert diagnosis.problems == ()


def test_a_fresh_state_after_a_snapshot_the_backend_still_holds_is_restored_nothing(tmp_path):
    path = tmp_path / "watch.jsonl"
    records = StateRecords(path)
    records.process_started(41)
    records.attempt_started({0, 1})
    state = _loop(records, 4)
    records.copied(state, None, "pinned_host")
    records.attempt_started({0})
    records.stepped([None], lambda pid: 4)
    (problem,) = diagnose([], _records(path)).problems
    assert (problem.kind, problem.attempt) == ("restored_nothing", 2)


def test_a_fresh_state_is_restored_nothing_only_while_the_snapshot_is_still_held(tmp_path):
    path = tmp_path / "watch.jsonl"
    records = StateRecords(path)
    records.process_started(41)
    records.attempt_started({0, 1})
    records.copied(_loop(records, 4), None, "pinned_host")
    records.attempt_started({0})
    records.stepped([None], lambda pid: None)  # its copies deleted or lost: nothing had landed
    assert diagnose([], _records(path)).problems == ()


def test_a_state_sent_back_with_the_bytes_read_before_is_a_checkpoint_restored_in_the_next_process(tmp_path):
    path = tmp_path / "watch.jsonl"
    records = StateRecords(path)
    records.process_started(41)
    records.attempt_started({0, 1})
    state = _loop(records, 4)
    saved = np.arange(8, dtype=np.float32)
    records.read(state, saved.tobytes())
    assert records.sent(np.zeros(8, np.float32).tobytes()) is None  # a fresh state is no checkpoint
    records.process_started(42)
    restored = records.sent(saved.tobytes())
    records.attempt_started({0, 1})
    records.stepped([restored], lambda pid: None)
    resume = [e for e in _records(path) if e["e"] == "resume"][-1]
    assert (resume["pid"], resume["origin"], resume["p"]) == (42, "checkpoint", 4)


def test_a_state_carried_over_resumes_live_and_a_slice_taken_up_in_place_is_no_new_attempt(tmp_path):
    path = tmp_path / "watch.jsonl"
    records = StateRecords(path)
    records.process_started(41)
    records.attempt_started({0})
    state = _loop(records, 2)
    back_at = _records(path)[-1]["w"] + 1e-6
    records.taken_up({0, 1}, {1})
    records.stepped([records.copied(state, None, None)], lambda pid: None)
    events = _records(path)
    assert [e["origin"] for e in events if e["e"] == "resume"] == ["nothing"]
    (cost,) = diagnose([{**_fault("restore", 1, 2, back_at), "pid": 41}], events).costs
    assert (cost.taken_up_after_steps, cost.resumed_from) == (0, "live")


def test_the_first_steps_the_rule_counts_late_are_each_recorded_with_their_positions(tmp_path):
    path = tmp_path / "watch.jsonl"
    records = StateRecords(path)
    records.process_started(41)
    records.attempt_started({0})
    mark = records.stepped([None], lambda pid: None, counted=2)
    assert mark.position == 2
    assert [e["p"] for e in _records(path) if e["e"] == "step"] == [1, 2]


def test_a_placement_is_recorded_once_per_attempt_and_slices_and_named_as_the_proxy_sees_it(tmp_path):
    path = tmp_path / "watch.jsonl"
    records = StateRecords(path)
    records.process_started(41)
    records.attempt_started({0, 1})
    records.placed({1}, "a copy")
    records.placed({1}, "a copy")
    (problem,) = diagnose([], _records(path)).problems
    assert problem.kind == "mesh_on_lost_slice"
    assert "after the program met the loss and probed the slices" in problem.detail


def test_faults_the_backend_fired_are_charged_to_the_program_process_that_ran_then():
    starts = [{"pid": 41, "start": True, "wall": 10.0}, {"pid": 42, "start": True, "wall": 20.0},
              {"pid": 42, "met": True, "wall": 25.0}]
    fired = [_fault("lose", 1, 3, 15.0), _fault("lose", 2, 4, 21.0), _fault("lose", 3, 5, 26.0)]
    assert [f["pid"] for f in charged_to_programs(fired, starts)] == [41, 42, 42]
    assert unmet_losses(fired, starts) == ("lose:3@5/step",)


def test_every_rule_the_proxy_cannot_see_is_a_problem_kind():
    assert set(UNSEEN) < set(PROBLEMS)
    assert {"restored_nothing", "mesh_on_lost_slice", "batch_not_divisible", "not_initialized"}.isdisjoint(UNSEEN)


def test_a_monitor_probe_of_a_slice_just_taken_up_that_lands_after_the_scale_up_starts_no_attempt():
    """``elastic_retry``'s health check probes every slice; the ``Manager``'s monitor probes the
    inactive ones, and one of its probes may land after the step that took that slice up."""
    from types import SimpleNamespace

    from elastic_dew.proxy.faults import StepSchedule, probe_programs

    schedule = StepSchedule("lose:2@100", step_function="train_step")
    schedule.runner = SimpleNamespace(on_dispatch=lambda phase, step: None)  # nothing due (no backend here)
    schedule.process_started(41)
    step, probe = SimpleNamespace(name="train_step"), SimpleNamespace(name=sorted(probe_programs())[0])

    def probes(*slices):
        for index in slices:
            assert schedule.before(probe, 4, 4, frozenset({index})) is None

    def steps(*slices, times=2):
        for _ in range(times):
            schedule.before(step, 64, 64, frozenset(slices), chained=64)

    probes(0, 1, 2, 3)
    steps(0, 1, 3)  # the first attempt, on three slices
    probes(2)  # the monitor: slice 2 is back
    steps(0, 1, 3)
    probes(0, 1, 2, 3)  # the retry's health check after ScaleUpSignalError
    steps(0, 1, 2, 3)
    probes(2)  # a monitor probe begun while slice 2 was inactive
    steps(0, 1, 2, 3)
    assert [attempt["active"] for attempt in schedule.attempts] == [[0, 1, 3], [0, 1, 2, 3]]


def test_a_monitor_probe_whose_input_reached_the_slice_before_its_return_does_not_count_as_the_monitor_seeing_it():
    """The hold after a return waits for the ``Manager``'s monitor to have seen the slice: a
    probe of it that succeeds, then the monitor's next probe (that check has finished and
    recorded the slice). A probe whose input was sent while the slice was lost and which is
    dispatched just after the return fails, as on Pathways, so its check records nothing: were
    it counted, the loop's read would be answered before its ``Manager`` knew of the slice, and
    the loop would take the slice up one step late."""
    from types import SimpleNamespace

    from elastic_dew.proxy.faults import StepSchedule, probe_programs
    from elastic_dew.proxy.slices import Slices

    schedule = StepSchedule("lose:2@2,restore:2@4", step_function="train_step")
    backend = SimpleNamespace(slices=Slices(4, 2), stepper=None)
    schedule.attach(backend)
    try:
        schedule.process_started(41)
        step, probe = SimpleNamespace(name="train_step"), SimpleNamespace(name=sorted(probe_programs())[0])

        def probes(*slices, dead=False):
            for index in slices:
                assert schedule.before(probe, 4, 4, frozenset({index}), marks=None if dead else ()) is None

        def steps(*slices, times=2):
            for _ in range(times):
                schedule.after(schedule.before(step, 64, 64, frozenset(slices), chained=64))

        probes(0, 1, 2, 3)
        steps(0, 1, 2, 3)  # slice 2 is lost after step 2
        probes(0, 1, 3)
        probes(2, dead=True)  # the retry's health check: slice 2 is down
        steps(0, 1, 3)  # slice 2 is back after step 4
        assert schedule.holding
        probes(2, dead=True)  # the monitor's probe, its input sent to slice 2 while it was lost
        probes(2)  # the monitor's next check sees the slice
        assert schedule.holding, "a failed probe counted as the monitor seeing the returned slice"
        probes(2)  # and the one after it begins only once that check recorded the slice
        assert not schedule.holding
    finally:
        schedule.close()
