"""Issue 31: the planner's prediction against real elastic_dew runs under Poisson fault schedules.

Two checks of :mod:`elastic_dew.plan`:

1. **The analytic model against the discrete-event simulation** of the same cluster
   (:func:`elastic_dew.plan.des.simulate`), every policy, 1 to 10,000 slices, with and without
   spares, at costs the size of a real cluster's run: the largest gap in goodput, in points.
2. **The model against real runs.** For 4 and 8 simulated slices (one CPU device each), in a
   child process of that device count (``python -m benchmarks.plan_validation child ...``):
   a warm-up run (the ``mlp`` recipe under replica-resize, down to one slice and back, then a
   runtime error that ends the training and starts it again from its checkpoint) fills the
   compilation cache with every mesh and times a step. The cluster is set by its *rates*:
   the run loses a slice every :data:`LOSS_EVERY_S` seconds of running, a lost slice
   returns after :data:`RETURN_S` on average (the issue's compressed time; the notes state
   it again as a real cluster). Then, for each policy, a calibration run under a schedule
   drawn with :data:`CALIBRATION_SEED` measures the costs
   (:func:`elastic_dew.plan.measured_costs`: the step, its batch wait, the loop's own time
   between steps, the saves, the resumes and restarts), and from them and the rates alone
   the model predicts the policy's goodput. Only then the measured runs: schedules drawn by
   :func:`elastic_dew.plan.draw_schedule` with seeds 0, 1, ... (``elastic-dew plan
   --draw-schedule SEED --steps S --start-step 251`` prints the same), each run's steps set
   so it runs :attr:`Sizes.plan_stepping_s` seconds of steps after :data:`START_STEP`. Restart meets each slice loss
   as ``error`` (the training ends and an in-process supervisor starts it again, restoring
   the newest checkpoint; the new attempt has every slice, so the model is given returns
   at once); pause-resume and replica-resize (at the model's recommended ``min_slices``)
   ride ``lose``/``restore`` in process.

Measured goodput is the run record's, ``account``'s productive step time over the wall time,
taken from the schedule's anchor (the run's first announcement of :data:`START_STEP`, the
step after the first checkpoint) to the run's last step line: the model describes a run in
its steady state, so the start (JAX, the first compile, the state built from scratch, the
first checkpoint) and the end (the closing checkpoint, which waits for its write) are left
out of both, and every schedule counts from there. Every
run shares one JAX persistent compilation cache (the warm-up fills it), as ``elastic-dew
train`` keeps one, and precompiles smaller meshes (the default). What the in-process
restart leaves out: the interpreter's start and the reschedule of a pod.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, worker_env

__all__ = ["measure", "SLICE_COUNTS", "model_against_simulation"]

SLICE_COUNTS = (4, 8)
PER_SLICE_BATCH = 8
SNAPSHOT_EVERY = 25
CHECKPOINT_EVERY = 250
#: The compressed cluster: seconds of running between slice losses of the whole run, and a
#: lost slice's mean return time.
LOSS_EVERY_S = 2.0
RETURN_S = 1.0
#: The warm-up run (it fills the compilation cache and times a step): steps, and its
#: schedule on SLICES slices.
CALIBRATION_STEPS = CHECKPOINT_EVERY + 60
#: The seed of each policy's calibration schedule (the measured runs draw 0, 1, ...).
CALIBRATION_SEED = 1000
#: A calibration run steps this many times as long as a measured run after
#: :data:`START_STEP`, so its medians rest on several recoveries (one run's length met a
#: single restart in some calibrations, which then set the restart's cost alone).
CALIBRATION_LENGTH = 3
#: Every drawn schedule counts from this step, the first after the first checkpoint: the
#: start, the first compile and the first checkpoint meet no fault, and the run is measured
#: from there on (the model's steady state: on a cluster a run's first checkpoint is a
#: negligible share of it; here a restart before it would rebuild the state from scratch,
#: and redo every step since the start, in a run of a few thousand steps).
START_STEP = CHECKPOINT_EVERY + 1
#: How each policy meets a slice loss in its schedules.
_LOSS = {"restart": "error", "pause_resume": "lose", "replica_resize": "lose"}


def _calibration_schedule(slices: int) -> str:
    """Down to one slice and back, then a restart: every mesh the runs can meet is compiled
    (and kept in the compilation cache) before any run."""
    losses = ",".join(f"lose:{i}@{30 + 20 * n}" for n, i in enumerate(range(slices - 1, 0, -1)))
    returns = ",".join(f"restore:{i}@+0.3" for i in range(1, slices))
    return f"{losses},{returns},error@{CHECKPOINT_EVERY + 20}"


#: Costs the size of a real cluster's run (seconds), for the model-against-simulation check.
CLUSTER_COSTS = dict(step_seconds=2.0, loop_overhead_seconds=0.1, snapshot_seconds=0.5, checkpoint_seconds=5.0,
                     snapshot_restore_seconds=10.0, checkpoint_restore_seconds=60.0, recovery_seconds=60.0,
                     restart_seconds=300.0, scale_up_seconds=30.0)
DES_SLICES = (1, 4, 16, 64, 256, 1024, 4096, 10000)


def model_against_simulation(faults: int) -> dict[str, Any]:
    """The largest gap (points of goodput and of useful work) between the model and the
    discrete-event simulation, each policy at fixed cadences, over :data:`DES_SLICES`, with 0
    and 2 spares; and every row."""
    from elastic_dew.plan import Cluster, Costs, des, model

    costs = Costs(**CLUSTER_COSTS)
    rows = []
    for slices in DES_SLICES:
        for spares in (0, 2):
            cluster = Cluster(slices=slices, slice_mtbf_hours=790.0, preemptions_per_day=0.5, return_minutes=60.0,
                              spares=spares, reschedule_minutes=5.0)
            for policy in model.POLICIES:
                every_s = None if policy == "restart" else 20
                floor = max(1, slices // 2) if policy == "replica_resize" else None
                kwargs = dict(snapshot_every=every_s, checkpoint_every=500, min_slices=floor)
                predicted = model.evaluate(costs, cluster, policy, **kwargs)
                simulated = des.simulate(costs, cluster, policy, seed=slices + spares, faults=faults, **kwargs)
                rows.append({"slices": slices, "spares": spares, "policy": policy,
                             "model": round(predicted.goodput, 5), "des": round(simulated.goodput, 5),
                             "model_useful": round(predicted.useful_work, 5),
                             "des_useful": round(simulated.useful_work, 5)})
    gap = max(abs(r["model"] - r["des"]) for r in rows) * 100
    gap_useful = max(abs(r["model_useful"] - r["des_useful"]) for r in rows) * 100
    return {"plan_model_vs_des_points": gap, "plan_model_vs_des_useful_points": gap_useful,
            "plan_model_vs_des_rows": rows}


# --------------------------------------------------------------------------- the child


def _child(slices: int, schedules: int, stepping_s: float, workdir: str) -> int:
    from elastic_dew.runtime import prepare_process

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    prepare_process(xla_flags=f"--xla_force_host_platform_device_count={slices}")
    import logging

    logging.basicConfig(level=logging.CRITICAL)  # the runs lose slices on purpose
    import jax

    from elastic_dew.runtime import use_compilation_cache

    work = Path(workdir)
    use_compilation_cache(work / "compilation-cache", min_compile_time_s=0)
    from elastic_dew.plan import Cluster, draw_schedule, measured_costs, model

    started = time.monotonic()
    warmup = work / f"warmup-{slices}"
    _train(slices, "replica_resize", 1, _calibration_schedule(slices), CALIBRATION_STEPS, warmup)
    base = {name: figure.value for name, figure in measured_costs(warmup).items()}
    cluster = Cluster(slices=slices, slice_mtbf_hours=slices * LOSS_EVERY_S / 3600.0,
                      return_minutes=RETURN_S / 60.0, preemptions_per_day=0.0, spares=0, reschedule_minutes=0.0)
    steps = START_STEP + max(20, round(stepping_s / _steady_step(warmup)))
    cadence = {"snapshot_every": SNAPSHOT_EVERY, "checkpoint_every": CHECKPOINT_EVERY}
    floor = model.recommend_min_slices(
        lambda m: model.evaluate(_costs(base), cluster, "replica_resize", min_slices=m, **cadence).useful_work, slices)
    predicted, sources, costs_by_policy = {}, {}, {}
    for policy in model.POLICIES:
        # Each policy's own calibration run: a schedule drawn with a seed no measured run uses.
        calibration = work / f"calibration-{policy}-{slices}"
        schedule = draw_schedule(cluster, base["step_seconds"], CALIBRATION_LENGTH * steps, CALIBRATION_SEED,
                                 factor=1.0, loss=_LOSS[policy], start_step=START_STEP)
        _train(slices, policy, floor if policy == "replica_resize" else None, schedule,
               START_STEP + CALIBRATION_LENGTH * (steps - START_STEP), calibration)
        figures = measured_costs(calibration)
        if policy != "restart":  # no restart in it: its "restart" is the Python process's start
            figures.pop("restart_seconds", None)
        costs = _costs({**base, **{name: figure.value for name, figure in figures.items()}})
        costs_by_policy[policy] = dataclasses.asdict(costs)
        sources[policy] = {name: figure.source for name, figure in figures.items()}
        if policy == "restart":  # a restarted attempt has every slice: nothing to wait for
            predicted[policy] = model.evaluate(costs, dataclasses.replace(cluster, return_minutes=0.0), policy,
                                               snapshot_every=None, checkpoint_every=CHECKPOINT_EVERY).goodput
        else:
            predicted[policy] = model.evaluate(costs, cluster, policy, min_slices=floor, **cadence).goodput
    calibrated_s = time.monotonic() - started
    measured: dict[str, list[dict[str, Any]]] = {policy: [] for policy in predicted}
    for policy in predicted:
        for seed in range(schedules):
            schedule = draw_schedule(cluster, base["step_seconds"], steps, seed, factor=1.0, loss=_LOSS[policy],
                                     start_step=START_STEP)
            run_dir = work / f"{policy}-{slices}-{seed}"
            t = time.monotonic()
            _train(slices, policy, floor if policy == "replica_resize" else None, schedule, steps, run_dir)
            result = _goodput(run_dir)
            result.update(seed=seed, seconds=round(time.monotonic() - t, 2))
            measured[policy].append(result)
            print(f"  plan_validation {slices} slices {policy} seed {seed}: goodput {result['goodput']:.3f} "
                  f"({result['faults']} faults, {result['seconds']:.0f} s)", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({
        "costs": costs_by_policy, "sources": sources,
        "steps": steps, "min_slices": floor, "predicted": predicted, "measured": measured,
        "calibration_s": calibrated_s, "jax": jax.__version__,
    }), flush=True)
    return 0


def _steady_step(run_dir: Path) -> float:
    """The median step of a run on every slice: what sets the runs' lengths (a mean would
    let a few slow steps of a loaded machine shorten every run)."""
    from elastic_dew import record
    from elastic_dew.elastic import events as ev

    steps = [e for e in record.as_events(record.read_events(run_dir)) if isinstance(e, ev.Step)]
    widest = max(e.slices for e in steps)
    return statistics.median(e.seconds for e in steps if e.slices == widest)


def _costs(values):
    from elastic_dew.plan import Costs

    missing = [name for name in ("step_seconds", "data_wait_seconds", "loop_overhead_seconds", "snapshot_seconds",
                                 "checkpoint_seconds", "snapshot_restore_seconds", "checkpoint_restore_seconds",
                                 "recovery_seconds", "restart_seconds", "scale_up_seconds") if name not in values]
    if missing:
        raise RuntimeError(f"the calibration runs measured no {', '.join(missing)}: {values}")
    return Costs(**values)


def _train(slices: int, policy: str, floor: int | None, schedule: str, steps: int, run_dir: Path) -> None:
    """``Trainer.fit`` of ``mlp`` on ``slices`` simulated slices under ``schedule``, started
    again in this process after a runtime error (a restart) or a preemption."""
    import jax

    from elastic_dew import rundir
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.slices.retry import make_manager
    from elastic_dew.runtime import Preempted
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.supervisor import supervise_in_process
    from elastic_dew.trainer import Trainer, TrainConfig
    from recipes import mlp

    parts = {name: part for name, part in mlp.build().items() if name != "eval_dataset"}
    config = ElasticConfig(
        minimum_slice_count=None if policy in ("pause_resume", "restart") else floor,
        poll_interval=0.05, timeout=120, max_attempts=None, global_batch=PER_SLICE_BATCH * slices,
        batch_policy="scale_by_active_slices", snapshot_every=0 if policy == "restart" else SNAPSHOT_EVERY,
        checkpoint_every=CHECKPOINT_EVERY,
    )
    run_dir.mkdir(parents=True, exist_ok=True)

    def process(number: int) -> None:
        with SimulatedSlices(slices, 1, schedule=schedule, fault_log=run_dir / rundir.FAULTS_FILE):
            trainer = Trainer(**parts, config=config, run_dir=run_dir, manager=make_manager(),
                              train=TrainConfig(log_every=10**9))
            trainer.fit(steps)

    outcomes = supervise_in_process(process, max_processes=500, restart_on=(Preempted, jax.errors.JaxRuntimeError))
    if outcomes[-1] is not None:
        raise RuntimeError(f"{run_dir.name} did not finish in 500 attempts: {outcomes[-1]}")


def _goodput(run_dir: Path) -> dict[str, Any]:
    """The run's goodput from its schedule's anchor (the first fault event: the run's first
    announcement of :data:`START_STEP`) to its last step line, and the faults it met
    between."""
    from elastic_dew import record
    from elastic_dew.elastic import events as ev

    events = record.as_events(record.read_events(run_dir))
    anchor = next(i for i, e in enumerate(events) if isinstance(e, ev.Fault))
    # Nothing before the anchor is ever undone (every restore point the runs go back to is
    # at or after the first checkpoint), so the productive time after it is the difference.
    productive = record.account(events).productive_seconds - record.account(events[:anchor]).productive_seconds
    # The steady state ends at the last step: the run's closing checkpoint (it waits for its
    # write, 0.05 to 2.9 s on this machine) and its stop are the run's end, as its start is.
    end = max(i for i, e in enumerate(events) if isinstance(e, ev.Step))
    wall = events[end].wall - events[anchor].wall
    faults = sum(isinstance(e, ev.Fault) for e in events[anchor + 1:end])
    summary = record.summarize(events)
    return {"goodput": productive / wall, "wall_s": round(wall, 3),
            "productive_s": round(productive, 3), "faults": faults,
            "final_step": summary["final_step"], "resumes": summary["resumes"]}


# --------------------------------------------------------------------------- the parent


def _run_child(slices: int, schedules: int, stepping_s: float, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"child-{slices}.log"
    with open(log, "w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.plan_validation", "child", str(slices), str(schedules),
             str(stepping_s), str(workdir)],
            cwd=REPO, env=worker_env(devices=slices), stdout=subprocess.PIPE, stderr=err, text=True, timeout=3600,
        )
    result = next((line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode != 0 or result is None:
        raise RuntimeError(f"plan_validation on {slices} slices exited {done.returncode}: {log.read_text()[-3000:]}")
    return json.loads(result)


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    t = time.monotonic()
    results.update(model_against_simulation(sizes.plan_des_faults))
    des_s = time.monotonic() - t
    worst = 0.0
    for slices in sizes.plan_slice_counts:
        run = _run_child(slices, sizes.plan_schedules, sizes.plan_stepping_s, workdir / f"slices-{slices}")
        results[f"plan_validation_costs_{slices}"] = run["costs"]
        results[f"plan_validation_steps_{slices}"] = run["steps"]
        results[f"plan_validation_min_slices_{slices}"] = run["min_slices"]
        for policy, predicted in run["predicted"].items():
            values = [r["goodput"] for r in run["measured"][policy]]
            faults = [r["faults"] for r in run["measured"][policy]]
            mean = statistics.fmean(values)
            key = f"plan_{policy}_{slices}"
            results[f"{key}_predicted"] = predicted
            results[f"{key}_measured"] = mean
            results[f"{key}_points"] = 100 * (mean - predicted)
            results[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else math.nan
            results[f"{key}_all"] = [round(v, 4) for v in values]
            results[f"{key}_faults_mean"] = statistics.fmean(faults)
            worst = max(worst, abs(results[f"{key}_points"]))
    results["plan_validation_worst_points"] = worst
    mtbf_h = 790.0
    factor = mtbf_h * 3600 / (4 * LOSS_EVERY_S)
    notes.append(
        f"Plan validation: the model against {sizes.plan_schedules} real runs per policy and slice count "
        f"({', '.join(map(str, sizes.plan_slice_counts))} simulated slices of one CPU device, mlp, "
        f"snapshot every {SNAPSHOT_EVERY} steps, checkpoint every {CHECKPOINT_EVERY}, {PER_SLICE_BATCH} "
        f"examples per slice, about {sizes.plan_stepping_s:g} s of steps per run), each run's Poisson "
        f"schedule drawn by elastic_dew.plan.draw_schedule (seeds 0..{sizes.plan_schedules - 1}): a slice "
        f"lost every {LOSS_EVERY_S:g} s of running, returning after {RETURN_S:g} s on average (on 4 slices: a "
        f"cluster of {mtbf_h:g} h slice MTBF and {RETURN_S * factor / 60:.0f} min returns, compressed "
        f"{factor:.3g}x). The prediction comes first, from each policy's own calibration run (seed "
        f"{CALIBRATION_SEED}; its costs in results.json) and the rates alone. Measured goodput: the run record's productive "
        f"time over the wall time from the run's first announcement of step {START_STEP}, the step after "
        "its first checkpoint, where every schedule starts, to its last step (steady state: start-up and "
        "the closing checkpoint left out of both); "
        "restart meets each loss as a runtime error and an in-process restart from the newest "
        "checkpoint (no interpreter start, no reschedule). Model against the discrete-event "
        f"simulation: {len(DES_SLICES)} slice counts from 1 to 10,000, 0 and 2 spares, three policies, "
        f"{sizes.plan_des_faults} faults each ({des_s:.0f} s)."
    )
    return results


if __name__ == "__main__":
    if sys.argv[1:2] != ["child"] or len(sys.argv) != 6:
        sys.exit("usage: python -m benchmarks.plan_validation child SLICES SCHEDULES STEPPING_S WORKDIR")
    sys.exit(_child(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]))
