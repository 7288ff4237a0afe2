"""The planner's model (its invariants, its agreement with the event-by-event simulation), the
schedules it draws, the costs it reads from a run record, and ``elastic-dew plan``'s refusals.

The model's agreement over 1 to 10,000 slices and its check against real simulated runs
are benchmarks (``python -m benchmarks --only plan_validation``); here each property once,
in a few seconds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import pytest

from elastic_dew import cli
from elastic_dew.plan import check, des, faults, inputs, model, planner, pool, retry, validity
from elastic_dew.plan.inputs import Cluster, Costs
from elastic_dew.plan.policy import POLICIES, PolicySettings, efficiency
from elastic_dew.plan.policy import running_per_step as policy_running

#: Costs of the size a real cluster's run has (seconds).
COSTS = Costs(step_seconds=2.0, loop_overhead_seconds=0.1, snapshot_seconds=0.5, checkpoint_seconds=5.0,
              snapshot_restore_seconds=10.0, checkpoint_restore_seconds=60.0, recovery_seconds=60.0,
              restart_seconds=300.0, scale_up_seconds=30.0)
CADENCES = {"restart": (None, 500), "pause_resume": (20, 500), "replica_resize": (20, 500)}


def _outcome(policy, cluster, costs=COSTS, floor=None):
    every_s, every_c = CADENCES[policy]
    return model.evaluate(costs, cluster, _settings(policy, floor))


def _settings(policy, floor=None):
    every_s, every_c = CADENCES[policy]
    return PolicySettings(policy, every_s, every_c, floor if policy == "replica_resize" else None)


@pytest.mark.parametrize("policy", POLICIES)
def test_goodput_and_useful_work_stay_between_0_and_1_from_one_slice_to_a_failing_multitude(policy):
    for slices in (1, 7, 1000, 10000):
        for mtbf in (0.01, 1.0, 790.0, 1e7):
            for spares in (0, 3):
                cluster = Cluster(slices=slices, slice_mtbf_hours=mtbf, preemptions_per_day=2.0,
                                  return_minutes=30.0, spares=spares, reschedule_minutes=5.0)
                out = _outcome(policy, cluster, floor=max(1, slices // 2))
                assert 0.0 <= out.goodput <= 1.0 and 0.0 <= out.useful_work <= 1.0, (slices, mtbf, spares, out)
                assert out.useful_work <= out.goodput + 1e-12


@pytest.mark.parametrize("policy", POLICIES)
def test_goodput_and_useful_work_never_grow_as_slices_fail_more_often(policy):
    for slices in (1, 64, 4096):
        previous = None
        for mtbf in (1e6, 5000.0, 790.0, 100.0, 10.0, 1.0):
            cluster = Cluster(slices=slices, slice_mtbf_hours=mtbf, preemptions_per_day=0.5, return_minutes=60.0)
            out = _outcome(policy, cluster, floor=max(1, slices * 3 // 4))
            if previous is not None:
                assert out.goodput <= previous.goodput + 1e-12, (slices, mtbf)
                assert out.useful_work <= previous.useful_work + 1e-12, (slices, mtbf)
            previous = out
        assert previous.goodput < 0.9  # the rates span the range that matters


@pytest.mark.parametrize("policy", POLICIES)
def test_the_loops_time_between_steps_and_the_batch_wait_are_running_time_that_trains_nothing(policy):
    costs = dataclasses.replace(COSTS, data_wait_seconds=0.3)
    every_s, every_c = CADENCES[policy]
    running = 2.0 + 0.3 + 0.1 + (0.5 / every_s if every_s else 0.0) + 5.0 / every_c
    faultless = Cluster(slices=4, slice_mtbf_hours=1e9, return_minutes=0.0)
    assert _outcome(policy, faultless, costs, floor=4).goodput == pytest.approx(2.0 / running, abs=1e-6)


def test_the_recommended_snapshot_cadence_is_where_the_derivative_of_useful_work_changes_sign():
    cluster = Cluster(slices=256, slice_mtbf_hours=790.0, return_minutes=60.0)
    row = planner.plan_policy(COSTS, cluster, "pause_resume")

    def useful(k):
        return model.evaluate(COSTS, cluster, PolicySettings("pause_resume", k, row.checkpoint_every)).useful_work

    k = row.snapshot_every
    assert useful(k + 1) - useful(k) <= 0 <= useful(k) - useful(k - 1)
    # Far from the optimum the derivative is steep on both sides: the search did not stop early.
    assert useful(k) - useful(max(1, k // 4)) > 1e-4 and useful(k) - useful(k * 4) > 1e-4
    # Young's first-order optimum is close when the save is cheap beside the time between losses.
    assert abs(k - row.young_snapshot_every) <= 0.1 * row.young_snapshot_every


def test_the_recommended_checkpoint_cadence_of_a_restart_is_the_models_optimum():
    cluster = Cluster(slices=64, slice_mtbf_hours=790.0, return_minutes=60.0)
    row = planner.plan_policy(COSTS, cluster, "restart")

    def goodput(k):
        return model.evaluate(COSTS, cluster, PolicySettings("restart", checkpoint_every=k)).goodput

    k = row.checkpoint_every
    assert goodput(k) >= max(goodput(k - 1), goodput(k + 1))
    assert row.snapshot_every is None and row.min_slices is None


def test_replica_resize_never_trains_less_than_restart_when_a_lost_slice_returns_within_the_restarts_downtime():
    for slices in (1, 64, 10000):
        for mtbf in (50.0, 790.0):
            for spares in (0, 2):
                # The restart's own downtime is at least its reschedule, 5 minutes, plus its restart.
                cluster = Cluster(slices=slices, slice_mtbf_hours=mtbf, preemptions_per_day=1.0, return_minutes=5.0,
                                  spares=spares, reschedule_minutes=5.0)
                restart = planner.plan_policy(COSTS, cluster, "restart")
                every_c = restart.checkpoint_every  # the same costs: the same checkpoints

                def useful(k, floor):
                    return model.evaluate(COSTS, cluster,
                                          PolicySettings("replica_resize", k, every_c, floor)).useful_work

                k = model.best_cadence(lambda k: useful(k, 1), 20)
                floor = model.recommend_min_slices(lambda m: useful(k, m), slices)
                assert useful(k, floor) >= restart.useful_work, (slices, mtbf, spares)


def test_the_recommended_floor_is_the_highest_that_costs_no_useful_work():
    cluster = Cluster(slices=1024, slice_mtbf_hours=790.0, return_minutes=60.0)
    row = planner.plan_policy(COSTS, cluster, "replica_resize")

    def useful(m):
        return _outcome("replica_resize", cluster, floor=m).useful_work

    assert 1 < row.min_slices < 1024
    assert useful(row.min_slices) >= useful(1) - model.MIN_SLICES_TOLERANCE
    assert useful(row.min_slices + 1) < useful(1) - model.MIN_SLICES_TOLERANCE


@pytest.mark.parametrize("policy", POLICIES)
def test_the_model_agrees_with_the_event_by_event_simulation_within_a_point(policy):
    for slices, spares in ((4, 0), (512, 0), (512, 2)):
        cluster = Cluster(slices=slices, slice_mtbf_hours=790.0, preemptions_per_day=1.0, return_minutes=60.0,
                          spares=spares, reschedule_minutes=5.0)
        floor = slices // 2 if policy == "replica_resize" else None
        predicted = _outcome(policy, cluster, floor=floor)
        simulated = des.simulate(COSTS, cluster, _settings(policy, floor), seed=3, faults=4000)
        assert abs(predicted.goodput - simulated.goodput) < 0.01, (slices, spares, predicted, simulated)
        assert abs(predicted.useful_work - simulated.useful_work) < 0.01, (slices, spares)


def test_the_simulation_is_deterministic_and_its_seed_matters():
    cluster = Cluster(slices=16, slice_mtbf_hours=100.0, return_minutes=30.0)
    run = lambda seed: des.simulate(COSTS, cluster, PolicySettings("replica_resize", 20, 500, 8),  # noqa: E731
                                    seed=seed, faults=500)
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_a_drawn_schedule_is_the_simulators_grammar_repeatable_and_meets_the_rate():
    from elastic_dew.simulate.reachability import unreachable
    from elastic_dew.simulate.schedule import parse_schedule

    cluster = Cluster(slices=8, slice_mtbf_hours=790.0, return_minutes=60.0, preemptions_per_day=0.0)
    factor = faults.compression(cluster, 0.1, 400)
    text = faults.draw_schedule(cluster, 0.1, 400, 7, factor=factor)
    assert text == faults.draw_schedule(cluster, 0.1, 400, 7, factor=factor)
    assert text != faults.draw_schedule(cluster, 0.1, 400, 8, factor=factor)
    schedule = parse_schedule(text)
    assert unreachable(schedule, 8) is None
    down: set[int] = set()
    elapsed = 0.0
    for fault in schedule:
        assert fault.timed
        elapsed += fault.after
        if fault.action == "lose":
            assert fault.slice not in down
            down.add(fault.slice)
        else:
            assert fault.action == "restore" and fault.slice in down
            down.remove(fault.slice)
    assert not down  # every slice lost comes back
    losses = sum(fault.action == "lose" for fault in schedule)
    # About TARGET_FAULTS in the steps' own time; the schedule spans HORIZON times as long.
    assert 0.5 * faults.HORIZON * faults.TARGET_FAULTS < losses < 1.5 * faults.HORIZON * faults.TARGET_FAULTS
    killed = parse_schedule(faults.draw_schedule(cluster, 0.1, 400, 7, factor=factor, loss="kill"))
    assert {fault.action for fault in killed} == {"kill"}
    # Counted from a step: an anchor that changes nothing (slice 0 is healthy then) opens it.
    anchored = faults.draw_schedule(cluster, 0.1, 400, 7, factor=factor, start_step=1)
    assert anchored == "restore:0@1," + text


def _record(tmp_path):
    lines = [
        {"event": "start", "wall": 100.0, "process_start": 90.0, "pid": 1},
        {"event": "resume", "wall": 110.0, "source": "fresh", "step": 0,
         "durations": {"detection": 0, "wait_for_slices": 0, "mesh_and_compile": 4.0, "restore": 1.0}},
        *[{"event": "step", "wall": 110.0 + i, "step": i, "slices": 4, "loss": 1.0, "examples": [i, i + 1],
           "seconds": 0.5, "data_seconds": 0.1} for i in range(1, 3)],
        {"event": "save", "wall": 112.1, "tier": "snapshot", "step": 2, "taken": True, "seconds": 0.02},
        *[{"event": "step", "wall": 110.0 + i, "step": i, "slices": 4, "loss": 1.0, "examples": [i, i + 1],
           "seconds": 0.5, "data_seconds": 0.1} for i in range(3, 6)],
        {"event": "save", "wall": 116.5, "tier": "checkpoint", "step": 5, "taken": True, "seconds": 0.3},
        {"event": "stop", "wall": 117.0, "reason": "slice_lost", "step": 6},
        # A slice returns during the recovery's wait: that wait was for the cluster.
        {"event": "fault", "wall": 119.0, "action": "restore", "slice": 3, "step": 6, "phase": "step",
         "scheduled": "restore:3@+2/step"},
        {"event": "resume", "wall": 120.0, "source": "snapshot", "step": 6,
         "durations": {"detection": 0.5, "wait_for_slices": 2.0, "mesh_and_compile": 1.5, "restore": 0.25}},
        {"event": "step", "wall": 121.0, "step": 6, "slices": 3, "loss": 1.0, "examples": [6, 7], "seconds": 0.9},
        {"event": "save", "wall": 123.0, "tier": "checkpoint", "step": 6, "taken": True, "seconds": 2.0},
        {"event": "stop", "wall": 123.1, "reason": "done", "step": 6},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path


def test_a_recovery_s_own_wait_for_slices_is_part_of_it_and_a_wait_for_a_returning_slice_is_not(tmp_path):
    def resume(wall, wait):
        return {"event": "resume", "wall": wall, "source": "snapshot", "step": 1,
                "durations": {"detection": 0.1, "wait_for_slices": wait, "mesh_and_compile": 0.2, "restore": 0.05}}

    def fault(wall, action):
        return {"event": "fault", "wall": wall, "action": action, "slice": 1, "step": 1, "phase": "step",
                "scheduled": f"{action}:1@+1/step"}

    def stop(wall):
        return {"event": "stop", "wall": wall, "reason": "slice_lost", "step": 1}

    lines = [
        {"event": "start", "wall": 0.0, "process_start": 0.0, "pid": 1},
        {"event": "resume", "wall": 1.0, "source": "fresh", "step": 0,
         "durations": {"detection": 0, "wait_for_slices": 0, "mesh_and_compile": 0.5, "restore": 0.1}},
        {"event": "step", "wall": 1.5, "step": 1, "slices": 2, "loss": 1.0, "examples": [0, 1], "seconds": 0.4},
        # Three recoveries that waited for nothing but the report of the loss: their wait is theirs.
        fault(2.0, "lose"), stop(2.1), resume(2.6, 0.1), fault(3.0, "restore"),
        fault(4.0, "lose"), stop(4.1), resume(4.6, 0.1), fault(5.0, "restore"),
        fault(6.0, "lose"), stop(6.1), resume(6.6, 0.1), fault(7.0, "restore"),
        # Two that waited for a slice to return: that wait is the cluster's, not the recovery's.
        fault(8.0, "lose"), stop(8.1), fault(9.0, "restore"), resume(9.5, 1.2),
        fault(10.0, "lose"), stop(10.1), fault(11.0, "restore"), resume(11.5, 1.2),
        {"event": "step", "wall": 12.0, "step": 1, "slices": 2, "loss": 1.0, "examples": [0, 1], "seconds": 0.4},
        {"event": "stop", "wall": 12.1, "reason": "done", "step": 1},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    measured = inputs.measured_costs(tmp_path)["recovery_seconds"]
    # The median of 0.4, 0.4, 0.4, 0.3, 0.3: detection and mesh with the own wait of 0.1.
    assert measured.value == pytest.approx(0.4)
    assert "median of 5 snapshot resumes' detection, mesh and compile, and their wait where no slice returned" in (
        measured.source)


def test_the_costs_a_run_record_measures_name_their_origin(tmp_path):
    measured = inputs.measured_costs(_record(tmp_path))
    assert measured["step_seconds"].value == 0.4  # the widest slice count's steps, less the batch wait
    assert measured["data_wait_seconds"].value == 0.1
    # A step's line to the next's, less that step and a save between them; not across the stop.
    assert measured["loop_overhead_seconds"].value == pytest.approx((0.5 + 0.48 + 0.5 + 0.5) / 4)
    assert "mean of 4 gaps between consecutive steps on 4 slices" in measured["loop_overhead_seconds"].source
    assert "mean of 5 steps on 4 slices" in measured["step_seconds"].source
    # The cadence's saves; not the closing checkpoint, which waits for its write before the stop.
    assert measured["snapshot_seconds"].value == 0.02 and measured["checkpoint_seconds"].value == 0.3
    assert measured["snapshot_restore_seconds"].value == 0.25
    assert measured["recovery_seconds"].value == 2.0  # detection and mesh; the wait, for a return, is the cluster's
    assert "checkpoint_restore_seconds" not in measured and "scale_up_seconds" not in measured
    assert measured["restart_seconds"].value == 19.0  # process start to the first resume, less its restore
    # A restart inside the same Python process shares the first's process start: it is timed
    # from the last event before it.
    lines = (tmp_path / "events.jsonl").read_text()
    again = [{"event": "start", "wall": 130.0, "process_start": 90.0, "pid": 1},
             {"event": "resume", "wall": 133.0, "source": "checkpoint", "step": 5,
              "durations": {"detection": 0, "wait_for_slices": 0, "mesh_and_compile": 1.0, "restore": 0.5}}]
    (tmp_path / "events.jsonl").write_text(lines + "".join(json.dumps(line) + "\n" for line in again))
    measured = inputs.measured_costs(tmp_path)
    assert measured["restart_seconds"].value == pytest.approx(133.0 - 123.1 - 0.5)
    assert measured["checkpoint_restore_seconds"].value == 0.5


def test_the_loop_costs_a_run_measures_are_its_steady_state_after_the_first_checkpoint(tmp_path):
    """A short calibration's start-up (the data pipeline's first batches) is not spread over
    every step of the plan: the steps before the first checkpoint at the cadence are left out."""
    def step(i, data):
        return {"event": "step", "wall": 10.0 + i, "step": i, "slices": 4, "loss": 1.0, "examples": [i, i + 1],
                "seconds": 0.5, "data_seconds": data}

    lines = [{"event": "start", "wall": 1.0, "process_start": 0.0, "pid": 1},
             {"event": "resume", "wall": 2.0, "source": "fresh", "step": 0,
              "durations": {"detection": 0, "wait_for_slices": 0, "mesh_and_compile": 1.0, "restore": 0.0}},
             step(1, 0.4), step(2, 0.3),
             {"event": "save", "wall": 12.2, "tier": "checkpoint", "step": 2, "taken": True, "seconds": 0.1},
             *[step(i, 0.1) for i in range(3, 7)],
             {"event": "save", "wall": 16.6, "tier": "checkpoint", "step": 6, "taken": True, "seconds": 0.2},
             {"event": "stop", "wall": 16.7, "reason": "done", "step": 6}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    measured = inputs.measured_costs(tmp_path)
    assert measured["data_wait_seconds"].value == pytest.approx(0.1)  # not (0.4 + 0.3 + 4 * 0.1) / 6
    assert measured["step_seconds"].value == pytest.approx(0.4)
    assert "mean of 4 steps on 4 slices after the first checkpoint" in measured["data_wait_seconds"].source
    assert measured["loop_overhead_seconds"].value == pytest.approx(0.5)  # steps 4-6, each 1 s after the last


def _plan(argv, capsys):
    code = cli.main(["plan", *argv])
    return code, capsys.readouterr()


GIVEN = ["--step-seconds", "2", "--snapshot-seconds", "0.5", "--checkpoint-seconds", "5", "--snapshot-restore-seconds",
         "10", "--restore-seconds", "60", "--recovery-seconds", "60", "--restart-seconds", "300",
         "--scale-up-seconds", "30"]


def test_plan_prints_each_input_with_its_origin_and_writes_the_json_it_promises(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, printed = _plan(["--from", str(_record(tmp_path)), *GIVEN[2:], "--loop-overhead-seconds", "0.05",
                           "--slices", "64", "--json", str(out)], capsys)
    assert code == 0, printed.err
    assert "measured: " in printed.out and "given" in printed.out and "default: " in printed.out
    data = json.loads(out.read_text())
    assert data["inputs"]["step_seconds"]["source"].startswith("measured: ")
    assert data["inputs"]["snapshot_seconds"] == {"value": 0.5, "source": "given"}
    assert data["inputs"]["loop_overhead_seconds"] == {"value": 0.05, "source": "given"}  # over the measured 0.495
    assert {row["policy"] for row in data["policies"]} == set(POLICIES)
    assert {"goodput", "useful_work", "snapshot_every", "checkpoint_every", "min_slices", "spares"} <= set(
        data["policies"][0])
    assert {row["slices"] for row in data["by_slices"]} == set(planner.SLICE_GRID)


@pytest.mark.parametrize("argv, named", [
    (["--slices", "0", *GIVEN], "--slices 0 must be >= 1"),
    (["--slices", "8", "--slice-mtbf-hours", "0", *GIVEN], "--slice-mtbf-hours 0.0 must be > 0 hours"),
    (["--slices", "8", "--return-minutes", "-1", *GIVEN], "--return-minutes -1"),
    (["--slices", "8", "--step-seconds", "0", *GIVEN[2:]], "--step-seconds 0.0 must be > 0 seconds"),
    (["--slices", "8", "--loop-overhead-seconds", "-0.1", *GIVEN], "--loop-overhead-seconds -0.1 must be >= 0"),
    (["--slices", "8", "--step-seconds", "2"], "--snapshot-seconds"),
    (["--slices", "8", "--from", "/nonexistent/run", *GIVEN], "--from /nonexistent/run"),
    (["--slices", "8", "--start-step", "100", *GIVEN], "--start-step goes with --draw-schedule"),
    (["--slices", "8", "--max-give-up", "2", *GIVEN], "--max-give-up 2.0 must be between 0 and 1"),
    (["--slices", "8", "--compress", "0", *GIVEN], "--compress 0.0 must be a number > 0"),
    (["--slices", "8", "--draw-schedule", "1", *GIVEN], "--draw-schedule needs --steps"),
    (["--slices", "8", "--plot", "/nonexistent/dir/p.png", *GIVEN], "/nonexistent/dir does not exist"),
])
def test_plan_refuses_an_impossible_input_naming_it_before_writing_anything(argv, named, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, printed = _plan([*argv, "--json", str(out)] if "--draw-schedule" not in argv else argv, capsys)
    assert code == 2
    assert named in printed.err
    assert not out.exists()


def test_plan_without_matplotlib_refuses_the_plot_saying_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "plan.json"
    code, printed = _plan(["--slices", "8", *GIVEN, "--json", str(out), "--plot", str(tmp_path / "p.png")], capsys)
    assert code == 2 and "elastic-dew[plot]" in printed.err
    assert not out.exists()


def test_plan_draws_a_schedule_stating_its_compression(capsys):
    code, printed = _plan(["--slices", "4", *GIVEN, "--draw-schedule", "3", "--steps", "200"], capsys)
    assert code == 0, printed.err
    header, text = printed.out.strip().splitlines()
    assert "compressed" in header and text.startswith("lose:")
    cluster = Cluster(slices=4)
    factor = faults.compression(cluster, 2.0, 200)
    assert text == faults.draw_schedule(cluster, 2.0, 200, 3, factor=factor)


def test_a_cost_that_is_not_finite_is_refused_as_the_configuration_is_built():
    with pytest.raises(ValueError, match="snapshot_seconds=inf"):
        dataclasses.replace(COSTS, snapshot_seconds=float("inf"))


#: A CPU program's costs on a compressed cluster: the validation's frame, where a slice is
#: lost every 3 s of running on 4 slices and returns after 3 s.
CPU_COSTS = Costs(step_seconds=0.08, data_wait_seconds=0.016, loop_overhead_seconds=0.009, snapshot_seconds=0.02,
                  checkpoint_seconds=0.09, snapshot_restore_seconds=0.1, checkpoint_restore_seconds=0.3,
                  recovery_seconds=0.4, restart_seconds=3.0, scale_up_seconds=0.3)
COMPRESSED = Cluster(slices=4, slice_mtbf_hours=12 / 3600, return_minutes=3 / 60, reschedule_minutes=0.0)


@pytest.mark.parametrize("policy, floor", [("pause_resume", None), ("replica_resize", 1)])
def test_the_retry_budgets_give_up_probability_is_what_the_simulation_counting_as_the_retry_policy_finds(
        policy, floor):
    settings = PolicySettings(policy, 7, 250, floor)
    for attempts in (6, 8):
        budget = retry.RetryRule(max_attempts=attempts, retry_reset_steps=50, steps=300)
        rule = retry.give_up_probability(CPU_COSTS, COMPRESSED, settings, budget)
        runs = 4000
        simulated = des.give_up_share(CPU_COSTS, COMPRESSED, settings, budget, runs=runs, seed=11)
        noise = 4 * (simulated * (1 - simulated) / runs) ** 0.5 + 2 / runs
        assert 0.005 < simulated < 0.6, (attempts, simulated)  # the rates make the tail matter
        if policy == "pause_resume":  # every loss counted falls while all N slices work: the rule is exact
            assert abs(rule - simulated) < noise + 0.1 * simulated, (attempts, rule, simulated)
        else:  # losses take slices away and slow the losses after them: the rule is an upper bound
            assert simulated - noise < rule < 5 * simulated + noise, (attempts, rule, simulated)


def test_the_recommended_budget_is_the_fewest_attempts_within_max_give_up_and_never_below_the_default():
    settings = PolicySettings("pause_resume", 7, 250)
    budget = retry.recommend(CPU_COSTS, COMPRESSED, settings, steps=300)
    assert budget.max_attempts > retry.DEFAULT_MAX_ATTEMPTS and budget.defaults_too_low

    def gives_up(m):
        return retry.give_up_probability(CPU_COSTS, COMPRESSED, settings, retry.RetryRule(m, 300, 50))

    assert gives_up(budget.max_attempts) <= retry.MAX_GIVE_UP < gives_up(budget.max_attempts - 1)
    assert budget.default_give_up_probability == pytest.approx(gives_up(retry.DEFAULT_MAX_ATTEMPTS))
    assert budget.crash_loop_seconds == pytest.approx(budget.max_attempts * 0.5)  # recovery and restore, each
    # A real cluster's rates: the defaults hold, and the budget stays the guide's.
    real = planner.plan(COSTS, Cluster(slices=64, slice_mtbf_hours=790.0, return_minutes=60.0))
    for row in real.policies:
        assert (row.retry is None) == (row.policy == "restart")
        if row.retry is not None:
            assert row.retry.max_attempts == retry.DEFAULT_MAX_ATTEMPTS and not row.retry.defaults_too_low
    with pytest.raises(ValueError, match="no in-process retry budget"):
        retry.recommend(CPU_COSTS, COMPRESSED, PolicySettings("restart", 7, 250), steps=300)


def test_elastic_dew_train_with_the_flags_a_plan_prints_runs_with_the_plans_settings(tmp_path, capsys):
    import argparse

    from elastic_dew import console
    from elastic_dew.commands.plan import train_flags

    out = tmp_path / "plan.json"
    given = [word for name, value in dataclasses.asdict(CPU_COSTS).items()
             for word in (f"--{name.replace('_', '-')}".replace("checkpoint-restore", "restore"), str(value))]
    code, printed = _plan(["--slices", "4", *given, "--slice-mtbf-hours", str(12 / 3600), "--return-minutes",
                           "0.05", "--reschedule-minutes", "0", "--spares", "1", "--steps", "300", "--json", str(out)],
                          capsys)
    assert code == 0, printed.err
    data = json.loads(out.read_text())
    best = data["recommended"]
    assert best["retry"]["max_attempts"] == best["elastic_settings"]["max_attempts"] > retry.DEFAULT_MAX_ATTEMPTS
    row = next(r for r in planner.plan(CPU_COSTS, dataclasses.replace(COMPRESSED, spares=1), steps=300).policies
               if r.policy == best["policy"] and r.spares == best["spares"])
    flags = train_flags(row)
    assert f"elastic-dew train ... {flags}" in printed.out
    parser = argparse.ArgumentParser()
    console.add_options(parser)
    config = console.config_of(parser.parse_args(["mlp", *flags.split()]))
    for name, value in best["elastic_settings"].items():
        assert getattr(config.elastic, name) == value, name
    assert "retry budget" in printed.out and ": too low" in printed.out


def test_compress_plans_the_schedules_frame_beside_the_clusters_own(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code, printed = _plan(["--slices", "4", *GIVEN, "--compress", "300", "--steps", "300", "--json", str(out)],
                          capsys)
    assert code == 0, printed.err
    data = json.loads(out.read_text())
    frame = faults.compressed(Cluster(slices=4), 300)
    assert data["compressed"]["cluster"]["slice_mtbf_hours"] == pytest.approx(790.0 / 300)
    expected = planner.plan(dataclasses.replace(COSTS, loop_overhead_seconds=0.0), frame, steps=300)
    assert [row["goodput"] for row in data["compressed"]["policies"]] == pytest.approx(
        [row.goodput for row in expected.policies])
    assert all(c["goodput"] < r["goodput"] for c, r in zip(data["compressed"]["policies"], data["policies"]))
    assert "in the frame of a schedule drawn with --compress 300 " in printed.out
    # The schedule drawn with that factor is the compressed cluster's.
    assert faults.draw_schedule(Cluster(slices=4), 2.0, 300, 5, factor=300.0) == faults.draw_schedule(
        frame, 2.0, 300, 5, factor=1.0)


def _finished_run(tmp_path, losses_at=(117.2,)):
    run = _record(tmp_path)
    lines = run.joinpath("events.jsonl").read_text().splitlines()
    faults_lines = [json.dumps({"event": "fault", "wall": wall, "action": "lose", "slice": 1, "step": 6,
                                "phase": "step", "scheduled": "lose:1@+1", "index": i})
                    for i, wall in enumerate(losses_at)]
    stop = next(i for i, line in enumerate(lines) if '"slice_lost"' in line)
    run.joinpath("events.jsonl").write_text("\n".join(lines[:stop] + faults_lines + lines[stop:]) + "\n")
    return run


def test_check_measures_a_finished_runs_steady_goodput_beside_the_prediction(tmp_path, capsys):
    measured = check.measure(_finished_run(tmp_path))
    # From the first checkpoint at the cadence (wall 116.5) to the last step (121.0): one step of 0.9 s.
    assert measured.wall_seconds == pytest.approx(4.5) and measured.goodput == pytest.approx(0.9 / 4.5)
    assert measured.losses == 1 and measured.policy == "replica_resize" and measured.min_slices == 3
    assert measured.snapshot_every is None or measured.snapshot_every >= 1
    rates = ["--slice-mtbf-hours", str(4 * 4.5 / 3600), "--return-minutes", "0.02"]
    code, printed = _plan(["--slices", "4", *GIVEN, *rates, "--check", str(tmp_path), str(tmp_path)], capsys)
    assert code == 0, printed.err
    row = next(line for line in printed.out.splitlines() if line.strip().startswith("replica_resize"))
    assert " 2 " in row and "20.0%" in row and "0.0" in row  # two runs, their mean, a standard error of 0
    comparison = check.compare([measured], COSTS, Cluster(slices=4, slice_mtbf_hours=4 * 4.5 / 3600,
                                                          return_minutes=0.02))
    assert f"{100 * comparison.predicted:.1f}%" in row


def test_check_refuses_runs_whose_losses_came_from_another_time_frame(tmp_path, capsys):
    run = _finished_run(tmp_path, losses_at=tuple(116.6 + 0.1 * i for i in range(6)))
    code, printed = _plan(["--slices", "4", *GIVEN, "--check", str(run)], capsys)
    assert code == 2
    assert "describe different clusters" in printed.err and "--compress" in printed.err
    # In the frame the schedule was drawn in, the same runs are checked.
    code, printed = _plan(["--slices", "4", *GIVEN, "--compress", "5e5", "--check", str(run)], capsys)
    assert code == 0, printed.err
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "events.jsonl").write_text(
        "".join(line + "\n" for line in (run / "events.jsonl").read_text().splitlines()[:-1]))
    code, printed = _plan(["--slices", "4", *GIVEN, "--check", str(unfinished)], capsys)
    assert code == 2 and "did not finish" in printed.err


def test_replica_resize_pays_a_compile_for_each_set_of_slices_a_run_meets_first():
    cluster = Cluster(slices=4, slice_mtbf_hours=10 / 3600, return_minutes=2.5 / 60, reschedule_minutes=0.0)
    r = pool.rates(cluster)
    # Few sets (14 of 1 to 3 slices of 4): a long run meets them all, a short one some.
    assert pool.new_meshes(cluster, r, 1, 1e6) == pytest.approx(14, abs=1e-6)
    assert 0 < pool.new_meshes(cluster, r, 1, 5.0) < pool.new_meshes(cluster, r, 1, 30.0) < 14
    assert pool.new_meshes(cluster, r, 3, 1e6) == pytest.approx(4, abs=1e-6)  # only the sets of 3
    # Many slices: nearly every recovery and scale-up lands on a set never met before.
    big = Cluster(slices=1024, slice_mtbf_hours=790.0, return_minutes=60.0)
    rb = pool.rates(big)
    landings = pool.new_meshes(big, rb, 1, 3600.0)
    assert landings == pytest.approx(pool.new_meshes(big, rb, 1, 7200.0) / 2, rel=1e-3)
    costs = dataclasses.replace(CPU_COSTS, new_mesh_seconds=0.7)
    settings = PolicySettings("replica_resize", 7, 50, 1)
    steady = model.evaluate(costs, cluster, settings)
    short = model.evaluate(costs, cluster, settings, steps=150)
    long = model.evaluate(costs, cluster, settings, steps=10**6)
    assert short.goodput < long.goodput < steady.goodput
    assert long.goodput == pytest.approx(steady.goodput, abs=1e-3)  # 14 compiles over a long run: nothing
    assert model.evaluate(CPU_COSTS, cluster, settings, steps=150) == model.evaluate(
        CPU_COSTS, cluster, settings)  # no new-mesh cost measured: the steady state


def test_a_run_record_measures_what_a_resume_onto_a_new_set_of_slices_costs(tmp_path):
    def resume(wall, source, compile_s):
        return {"event": "resume", "wall": wall, "source": source, "step": 1 if source == "fresh" else 2,
                "durations": {"detection": 0.1, "wait_for_slices": 5.0, "mesh_and_compile": compile_s, "restore": 0.1}}

    def fault(wall, action, index):
        return {"event": "fault", "wall": wall, "action": action, "slice": index, "step": 1, "phase": "step",
                "scheduled": f"{action}:{index}@1"}

    lines = [{"event": "start", "wall": 1.0, "process_start": 0.0, "pid": 1}, resume(2.0, "fresh", 3.0),
             {"event": "step", "wall": 3.0, "step": 1, "slices": 4, "loss": 1.0, "examples": [0, 1], "seconds": 0.5},
             fault(4.0, "lose", 1), resume(5.0, "snapshot", 2.0),  # {0, 2, 3}: new
             fault(6.0, "restore", 1), resume(7.0, "live", 0.3),  # every slice again: the start's set
             fault(8.0, "lose", 1), resume(9.0, "snapshot", 0.3),  # {0, 2, 3} again
             fault(10.0, "restore", 1), resume(11.0, "live", 0.3),
             fault(12.0, "lose", 2), resume(13.0, "snapshot", 1.5),  # {0, 1, 3}: new
             {"event": "step", "wall": 13.5, "step": 2, "slices": 3, "loss": 1.0, "examples": [1, 2], "seconds": 0.5},
             {"event": "stop", "wall": 14.0, "reason": "done", "step": 2}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    measured = inputs.measured_costs(tmp_path)
    # New: 2.2 and 1.7 s (the wait for slices is the cluster's); again: 0.5, 0.5, 0.5 s.
    assert measured["new_mesh_seconds"].value == pytest.approx((2.2 + 1.7) / 2 - 0.5)
    assert "2 resumes onto a set of slices new to the process" in measured["new_mesh_seconds"].source


def test_a_pause_that_loses_every_holder_of_the_snapshot_is_as_likely_as_a_simulation_of_the_pause_finds():
    import random

    def simulated(n, spares, alpha, mu, trials=20000, seed=5):
        rng, gone = random.Random(seed), 0
        for _ in range(trials):
            down, holders, pool = spares + 1, n - 1, n + spares
            while down > spares and holders > 0:
                others = pool - down - holders
                rates = (holders * alpha, others * alpha, down * mu)
                pick = rng.random() * sum(rates)
                if pick < rates[0]:
                    holders, down = holders - 1, down + 1
                elif pick < rates[0] + rates[1]:
                    down += 1
                else:
                    down -= 1
            gone += holders == 0
        return gone / trials

    for n, spares, alpha, mu in ((4, 0, 0.1, 0.4), (3, 1, 0.2, 0.3), (8, 0, 0.1, 0.2)):
        r = pool.Rates(alpha=alpha, mu=mu, preempt=0.0, q=alpha / (alpha + mu), reschedule=0.0)
        assert pool.snapshot_lost(n, spares, r) == pytest.approx(simulated(n, spares, alpha, mu), abs=0.01)
    slow = pool.Rates(alpha=0.1, mu=0.1, preempt=0.0, q=0.5, reschedule=0.0)
    fast = pool.Rates(alpha=0.1, mu=1.0, preempt=0.0, q=1 / 11, reschedule=0.0)
    assert pool.snapshot_lost(4, 0, fast) < pool.snapshot_lost(4, 0, slow)
    # Pause-resume pays for it: the steps since the checkpoint, not since the snapshot.
    cluster = Cluster(slices=4, slice_mtbf_hours=10 / 3600, return_minutes=2.5 / 60, reschedule_minutes=0.0)
    assert model.evaluate(CPU_COSTS, cluster, PolicySettings("pause_resume", 7, 500)).goodput < model.evaluate(
        CPU_COSTS, cluster, PolicySettings("pause_resume", 7, 50)).goodput


def _replica_resize_snapshot_losses(n, alpha, mu, tau_s, scale_up, seconds, seed=7):
    """Replica-resize at a floor of one slice, event by event: the slices fail and return; a
    slice that returns joins the run after ``scale_up`` seconds and holds the snapshot from the
    next one on (every ``tau_s`` seconds of running); a loss that leaves no slice of the run
    holding it is a checkpoint restore. Returns such restores per second of running."""
    import random

    rng = random.Random(seed)
    up = [True] * n
    holder_from = [0.0] * n  # running time from which each working slice holds the snapshot
    t = running = 0.0
    restores = 0
    while t < seconds:
        down = up.count(False)
        rate = (n - down) * alpha + down * mu
        dt = rng.expovariate(rate)
        if down < n:
            running += dt
        t += dt
        if rng.random() < (n - down) * alpha / rate:
            lost = rng.choice([i for i in range(n) if up[i]])
            up[lost] = False
            holders = [i for i in range(n) if up[i] and holder_from[i] <= running]
            if not holders:  # every copy gone: restore the checkpoint onto the slices left
                restores += 1
                for i in range(n):
                    holder_from[i] = running
        else:
            back = rng.choice([i for i in range(n) if not up[i]])
            up[back] = True
            if up.count(True) == 1:  # the run was waiting: it restores onto this slice
                holder_from[back] = running
            else:  # scaled up, holding the snapshot from the next one on
                holder_from[back] = (math.floor((running + scale_up) / tau_s) + 1) * tau_s
    return restores / running


def test_replica_resize_counts_the_losses_that_take_every_copy_of_the_snapshot_back_to_the_checkpoint():
    # A slice lost every 10 s, back after 3 s, on 4 slices down to one: the run often steps
    # on one slice (its loss takes the snapshot) or on two, one just scaled up (no copy yet).
    cluster = Cluster(slices=4, slice_mtbf_hours=10 / 3600, return_minutes=3 / 60, reschedule_minutes=0.0)
    costs = dataclasses.replace(CPU_COSTS, scale_up_seconds=0.2)
    settings = PolicySettings("replica_resize", 5, 2000, 1)
    _, tau_s, _ = efficiency(costs, settings)
    gone = model.snapshot_gone(costs, cluster, 1, tau_s)
    assert gone[3] == 1.0 and gone[0] == gone[1] == 0.0 and 0 < gone[2] < 0.2
    rate = model.checkpoint_restores(costs, cluster, settings)
    simulated = _replica_resize_snapshot_losses(4, 0.1, 1 / 3, tau_s, 0.2, seconds=200_000)
    assert rate == pytest.approx(simulated, rel=0.15)
    # It costs the steps since the newest checkpoint: a run that checkpoints trains more.
    rarely = model.evaluate(costs, cluster, settings, steps=450).goodput
    often = model.evaluate(costs, cluster, dataclasses.replace(settings, checkpoint_every=40), steps=450).goodput
    assert often > rarely + 0.02
    # A floor of two keeps a copy on the slice left while the run waits, unless it goes too.
    floor_two = model.checkpoint_restores(costs, cluster, dataclasses.replace(settings, min_slices=2))
    assert 0 < floor_two < rate
    # On a real cluster's rates nothing changes: the run never comes down to one slice.
    real = Cluster(slices=64, slice_mtbf_hours=790.0, return_minutes=60.0)
    assert model.checkpoint_restores(COSTS, real, PolicySettings("replica_resize", 20, 500, 1)) < 1e-12
    # The plan checkpoints more often for it, against these losses as well as preemptions.
    row = planner.plan_policy(costs, cluster, "replica_resize", steps=450)
    assert row.checkpoint_every < planner.plan_policy(costs, Cluster(slices=4, slice_mtbf_hours=1e6), "replica_resize",
                                                      steps=450).checkpoint_every


def test_a_plan_flags_rates_outside_the_range_the_model_was_checked_over_and_says_why(tmp_path, capsys):
    # A slice lost every 10 s on 4 slices whose loop steps in 0.11 s with its saves: a loss every 22.5 steps.
    fast = Cluster(slices=4, slice_mtbf_hours=10 / 3600, return_minutes=3 / 60, reschedule_minutes=0.0)
    settings = PolicySettings("replica_resize", 5, 40, 1)
    assert validity.steps_between_losses(CPU_COSTS, fast, settings) == pytest.approx(
        2.5 / policy_running(CPU_COSTS, settings))
    reasons = validity.outside(CPU_COSTS, fast, settings)
    assert len(reasons) == 1 and "every 22.5 steps" in reasons[0] and "45 steps or more" in reasons[0]
    slow_recovery = dataclasses.replace(CPU_COSTS, recovery_seconds=2.0)
    assert any("(h c)" in reason for reason in validity.outside(slow_recovery, fast, settings))
    # A real cluster's rates are inside it: nothing is flagged.
    real = planner.plan(COSTS, Cluster(slices=64, slice_mtbf_hours=790.0, return_minutes=60.0))
    assert all(not row.outside_checked_range for row in real.policies)
    # The command line marks each figure outside it, says why, and so does its JSON.
    out = tmp_path / "plan.json"
    given = [word for name, value in dataclasses.asdict(CPU_COSTS).items()
             for word in (f"--{name.replace('_', '-')}".replace("checkpoint-restore", "restore"), str(value))]
    rates = ["--slice-mtbf-hours", str(10 / 3600), "--return-minutes", "0.05", "--reschedule-minutes", "0"]
    code, printed = _plan(["--slices", "4", *given, *rates, "--steps", "450", "--json", str(out)], capsys)
    assert code == 0, printed.err
    rows = [line for line in printed.out.splitlines() if line.strip().startswith("replica_resize ") and "%" in line]
    assert rows and all(line.endswith(" *") for line in rows)
    assert "* outside the range the model was checked over against real runs" in printed.out
    assert "; outside the checked range (*)" in printed.out
    data = json.loads(out.read_text())
    assert all(row["outside_checked_range"] for row in data["policies"])
    # So does --check, beside the prediction for the runs' settings.
    run = _finished_run(tmp_path)
    code, printed = _plan(["--slices", "4", *GIVEN, "--slice-mtbf-hours", str(4 * 4.5 / 3600), "--return-minutes",
                           "0.02", "--check", str(run)], capsys)
    assert code == 0, printed.err
    row = next(line for line in printed.out.splitlines() if line.strip().startswith("replica_resize"))
    assert row.endswith(" *") and "the model was checked against runs that met one every 45 steps" in printed.out
