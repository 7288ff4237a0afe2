"""The planner's prediction against real elastic_dew runs under Poisson fault schedules.

Two checks of :mod:`elastic_dew.plan`:

1. **The analytic model against the discrete-event simulation** of the same cluster
   (:func:`elastic_dew.plan.des.simulate`), every policy, 1 to 10,000 slices, with and without
   spares, at costs the size of a real cluster's run: the largest gap in goodput, in points.
2. **The model against real runs**, for each :data:`CASES` entry (``mlp`` on slices of one
   CPU device, ``lm`` on 4 slices of 2 devices with its global batch kept constant), in a
   child process of that device count (``python -m benchmarks.plan_validation child CASE
   ...``): a warm-up run (replica-resize down to one slice and back, then a runtime error
   that ends the training and starts it again from its checkpoint) fills the compilation
   cache with every mesh and times a step. The cluster is set by its *rates*: the run loses
   a slice every ``loss_every_s`` seconds of running, a lost slice returns after
   ``return_s`` on average (a compressed cluster, ``h c`` 0.1-0.5). Then, for each policy, a
   calibration run under a schedule drawn with :data:`CALIBRATION_SEED` measures the costs
   (:func:`elastic_dew.plan.measured_costs`), and from them and the rates alone the model
   predicts the policy's goodput and :func:`elastic_dew.plan.retry.recommend` the retry
   budget for a run of the measured length. Only then the measured runs: schedules drawn by
   :func:`elastic_dew.plan.draw_schedule` with seeds 0, 1, ... from the step after the first
   checkpoint (``elastic-dew plan --draw-schedule SEED --steps S --start-step K`` prints the
   same), the elastic policies under the plan's retry budget (a run it ends is counted as
   given up, never started again). Restart meets each slice loss as ``error`` (the training
   ends and an in-process supervisor starts it again, restoring the newest checkpoint; the
   new attempt has every slice, so the model is given returns at once); pause-resume and
   replica-resize (at the model's recommended ``min_slices``) ride ``lose``/``restore`` in
   process.

Measured goodput is :func:`elastic_dew.plan.check.measure`'s, ``elastic-dew plan --check``'s
rule: the record's productive step time over the wall time from the end of the run's first
checkpoint at the cadence (where every schedule starts) to its last step line, the model's
steady state. Beside it, what the runs paid (:func:`_paid`: each resume's and scale-up's
mean cost, the step on each slice count) and the model's prediction with those costs,
which tells a cost the calibration misjudged from one the model misses. Every run shares
one JAX persistent compilation cache (the warm-up fills it), as ``elastic-dew train`` keeps
one, and precompiles smaller meshes (the default). What the in-process restart leaves
out: the interpreter's start and the reschedule of a pod.
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

__all__ = ["measure", "CASES", "Case", "summarize", "model_against_simulation"]

PER_SLICE_BATCH = 8


@dataclasses.dataclass(frozen=True)
class Case:
    """One program and cluster the plan is validated on.

    ``loss_every_s``: seconds of running between slice losses of the whole run (the
    compressed cluster's rate); ``return_s``: a lost slice's mean return. ``stepping_s``:
    seconds of steps each measured run makes after :attr:`start_step`. ``global_batch``:
    ``None`` scales the batch with the active slices (``PER_SLICE_BATCH`` a slice), a
    number keeps it constant (each slice takes more when slices are lost)."""

    recipe: str
    slices: int
    devices_per_slice: int
    loss_every_s: float
    return_s: float
    stepping_s: float
    policies: tuple[str, ...]
    snapshot_every: int
    checkpoint_every: int
    global_batch: int | None = None
    label: str = ""

    @property
    def start_step(self) -> int:
        """Every drawn schedule counts from this step, the first after the first checkpoint."""
        return self.checkpoint_every + 1

    @property
    def name(self) -> str:
        return f"{self.recipe}_{self.slices}x{self.devices_per_slice}{self.label}"


#: The validated cases: ``mlp`` on slices of one device (the project's own case, every
#: policy) and ``lm`` on 4 slices of 2 devices, its global batch kept constant (the recipe's
#: 48) as ``elastic-dew train lm`` keeps it, under pause-resume and replica-resize; rates
#: where ``h c`` (losses' rate times a recovery) is 0.1-0.5 and returns comparable to the
#: time between losses.
CASES = {
    "mlp_4x1": Case("mlp", 4, 1, loss_every_s=1.0, return_s=1.0, stepping_s=5.0,
                    policies=("restart", "pause_resume", "replica_resize"), snapshot_every=25, checkpoint_every=250),
    "mlp_8x1": Case("mlp", 8, 1, loss_every_s=1.0, return_s=1.0, stepping_s=5.0,
                    policies=("restart", "pause_resume", "replica_resize"), snapshot_every=25, checkpoint_every=250),
    "lm_4x2": Case("lm", 4, 2, loss_every_s=2.5, return_s=2.5, stepping_s=8.0,
                   policies=("pause_resume", "replica_resize"), snapshot_every=7, checkpoint_every=50,
                   global_batch=48),
}
#: The grid of failure rates: each validated case again with losses (and returns) three and
#: ten times as frequent, up to a loss every few dozen steps, snapshots closer together
#: (``lm``'s runs with 8 s of steps each, as its base case's). At ten times, replica-resize
#: alone: pause-resume would spend nearly all its time waiting for every slice at once.
CASES.update({
    f"{base}_x{times}": dataclasses.replace(
        CASES[base], loss_every_s=CASES[base].loss_every_s / times, return_s=CASES[base].return_s / times,
        policies=("pause_resume", "replica_resize") if times < 10 else ("replica_resize",),
        snapshot_every=snapshot_every, label=f"_x{times}",
        stepping_s=min(CASES[base].stepping_s, 8.0))
    for base, times, snapshot_every in (("mlp_4x1", 3, 10), ("mlp_4x1", 10, 5), ("lm_4x2", 3, 5), ("lm_4x2", 10, 3))
})
#: A calibration run steps this many times as long as a measured run after its start
#: step, so its medians rest on several recoveries.
CALIBRATION_LENGTH = 2
#: The seed of each policy's calibration schedule (the measured runs draw 0, 1, ...).
CALIBRATION_SEED = 1000
#: How each policy meets a slice loss in its schedules.
_LOSS = {"restart": "error", "pause_resume": "lose", "replica_resize": "lose"}


#: The warm-up visits every set of slices when there are at most this many.
WARM_SETS = 30


def _calibration_schedule(case: Case) -> str:
    """Every set of slices the runs can meet (or, with more than :data:`WARM_SETS` of them,
    down to one slice and back), then a restart: every mesh is compiled, and kept in the
    compilation cache, before any run, so the calibration's resumes onto a set new to its
    process load the step from the cache as every measured run's do (a set's first compile
    is once per cache; the runs would otherwise meet it only after the calibration had)."""
    import itertools

    slices = case.slices
    sets = [set(kept) for k in range(slices - 1, 0, -1) for kept in itertools.combinations(range(slices), k)]
    actions: list[tuple[str, int]] = []
    if len(sets) <= WARM_SETS:
        for kept in sets:
            gone = [i for i in range(slices) if i not in kept]
            actions += [("lose", i) for i in gone] + [("restore", i) for i in gone]
    else:
        actions += [("lose", i) for i in range(slices - 1, 0, -1)] + [("restore", i) for i in range(1, slices)]
    tokens = [f"{action}:{i}@{5 + 3 * n}" for n, (action, i) in enumerate(actions)]
    return ",".join(tokens) + f",error@{_warmup_steps(case) - 20}"


def _warmup_steps(case: Case) -> int:
    """The warm-up's steps: its faults (three steps apart), then a restart, then 20 more,
    and past the first checkpoint."""
    import math as _math

    sets = sum(_math.comb(case.slices, k) for k in range(1, case.slices))
    faults = 2 * sum(k * _math.comb(case.slices, k) for k in range(1, case.slices)) if sets <= WARM_SETS \
        else 2 * (case.slices - 1)
    return max(case.start_step + 40, 5 + 3 * faults + 40)


#: Costs the size of a real cluster's run (seconds), for the model-against-simulation check.
CLUSTER_COSTS = dict(step_seconds=2.0, loop_overhead_seconds=0.1, snapshot_seconds=0.5, checkpoint_seconds=5.0,
                     snapshot_restore_seconds=10.0, checkpoint_restore_seconds=60.0, recovery_seconds=60.0,
                     restart_seconds=300.0, scale_up_seconds=30.0)
DES_SLICES = (1, 4, 16, 64, 256, 1024, 4096, 10000)


def model_against_simulation(faults: int) -> dict[str, Any]:
    """The largest gap (points of goodput and of useful work) between the model and the
    discrete-event simulation, each policy at fixed cadences, over :data:`DES_SLICES`, with 0
    and 2 spares; and every row."""
    from elastic_dew.plan import Cluster, Costs, PolicySettings, des, model
    from elastic_dew.plan.policy import POLICIES

    costs = Costs(**CLUSTER_COSTS)
    rows = []
    for slices in DES_SLICES:
        for spares in (0, 2):
            cluster = Cluster(slices=slices, slice_mtbf_hours=790.0, preemptions_per_day=0.5, return_minutes=60.0,
                              spares=spares, reschedule_minutes=5.0)
            for policy in POLICIES:
                every_s = None if policy == "restart" else 20
                floor = max(1, slices // 2) if policy == "replica_resize" else None
                settings = PolicySettings(policy, every_s, 500, floor)
                predicted = model.evaluate(costs, cluster, settings)
                simulated = des.simulate(costs, cluster, settings, seed=slices + spares, faults=faults)
                rows.append({"slices": slices, "spares": spares, "policy": policy,
                             "model": round(predicted.goodput, 5), "des": round(simulated.goodput, 5),
                             "model_useful": round(predicted.useful_work, 5),
                             "des_useful": round(simulated.useful_work, 5)})
    gap = max(abs(r["model"] - r["des"]) for r in rows) * 100
    gap_useful = max(abs(r["model_useful"] - r["des_useful"]) for r in rows) * 100
    return {"plan_model_vs_des_points": gap, "plan_model_vs_des_useful_points": gap_useful,
            "plan_model_vs_des_rows": rows}


# --------------------------------------------------------------------------- the child


def _child(case_name: str, schedules: int, stepping_scale: float, workdir: str) -> int:
    from elastic_dew.runtime import prepare_process

    case = CASES[case_name]
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    prepare_process(xla_flags=f"--xla_force_host_platform_device_count={case.slices * case.devices_per_slice}")
    import logging

    logging.basicConfig(level=logging.CRITICAL)  # the runs lose slices on purpose
    import jax

    from elastic_dew.runtime import use_compilation_cache

    work = Path(workdir)
    use_compilation_cache(work / "compilation-cache", min_compile_time_s=0)
    from elastic_dew.plan import Cluster, PolicySettings, check, draw_schedule, measured_costs, model, retry

    started = time.monotonic()
    load = [os.getloadavg()[0]]
    warmup = work / f"warmup-{case.name}"
    _train(case, "replica_resize", 1, _calibration_schedule(case), _warmup_steps(case), warmup, None)
    # The warm-up compiles every mesh cold: its new sets' cost is no later process's.
    base = {name: figure.value for name, figure in measured_costs(warmup).items() if name != "new_mesh_seconds"}
    cluster = Cluster(slices=case.slices, slice_mtbf_hours=case.slices * case.loss_every_s / 3600.0,
                      return_minutes=case.return_s / 60.0, preemptions_per_day=0.0, spares=0, reschedule_minutes=0.0)
    steps = case.start_step + max(20, round(case.stepping_s * stepping_scale / _steady_step(warmup)))
    cadence = {"snapshot_every": case.snapshot_every, "checkpoint_every": case.checkpoint_every}
    predicted, sources, costs_by_policy, budgets = {}, {}, {}, {}
    # Replica-resize's calibration goes down to one slice (every count of slices the runs
    # may meet); the floor the runs take is the model's, from that calibration's costs (the
    # warm-up's compile every mesh for the first time, which no later recovery does).
    floor = 1
    for policy in sorted(case.policies, key=lambda name: name != "replica_resize"):
        # Each policy's own calibration run: a schedule drawn with a seed no measured run uses.
        calibration = work / f"calibration-{policy}-{case.name}"
        length = case.start_step + CALIBRATION_LENGTH * (steps - case.start_step)
        schedule = draw_schedule(cluster, base["step_seconds"], length, CALIBRATION_SEED, factor=1.0,
                                 loss=_LOSS[policy], start_step=case.start_step)
        _train(case, policy, floor if policy == "replica_resize" else None, schedule, length, calibration, None)
        figures = measured_costs(calibration)
        if policy != "restart":  # no restart in it: its "restart" is the Python process's start
            figures.pop("restart_seconds", None)
        costs = _costs({**base, **{name: figure.value for name, figure in figures.items()}})
        costs_by_policy[policy] = dataclasses.asdict(costs)
        sources[policy] = {name: figure.source for name, figure in figures.items()}
        if policy == "replica_resize":
            floor = model.recommend_min_slices(
                lambda m: model.evaluate(costs, cluster, PolicySettings("replica_resize", min_slices=m, **cadence))
                .useful_work,
                case.slices)
        if policy == "restart":  # a restarted attempt has every slice: nothing to wait for
            predicted[policy] = model.evaluate(costs, dataclasses.replace(cluster, return_minutes=0.0),
                                               PolicySettings(policy, checkpoint_every=case.checkpoint_every)).goodput
        else:
            settings = PolicySettings(policy, min_slices=floor if policy == "replica_resize" else None, **cadence)
            predicted[policy] = model.evaluate(costs, cluster, settings, steps=steps - case.start_step).goodput
            budget = retry.recommend(costs, cluster, settings, steps=steps)
            budgets[policy] = budget.to_json()
        load.append(os.getloadavg()[0])
    calibrated_s = time.monotonic() - started
    measured: dict[str, list[dict[str, Any]]] = {policy: [] for policy in predicted}
    paid: dict[str, dict[str, Any]] = {}
    for policy in predicted:
        budget = budgets.get(policy)
        for seed in range(schedules):
            schedule = draw_schedule(cluster, base["step_seconds"], steps, seed, factor=1.0, loss=_LOSS[policy],
                                     start_step=case.start_step)
            run_dir = work / f"{policy}-{case.name}-{seed}"
            t = time.monotonic()
            ended = _train(case, policy, floor if policy == "replica_resize" else None, schedule, steps, run_dir,
                           budget)
            if ended is None:
                result = _window(run_dir)
            else:
                result = {"gave_up": ended}
            result.update(seed=seed, seconds=round(time.monotonic() - t, 2), load=os.getloadavg()[0])
            load.append(result["load"])
            measured[policy].append(result)
            print(f"  plan_validation {case.name} {policy} seed {seed}: "
                  + (f"goodput {result['goodput']:.3f} ({result['losses']} losses" if ended is None
                     else f"GAVE UP: {ended[:200]} (") + f", {result['seconds']:.0f} s)", file=sys.stderr, flush=True)
        finished = [work / f"{policy}-{case.name}-{r['seed']}" for r in measured[policy] if "goodput" in r]
        if finished and policy != "restart":
            paid[policy] = _paid(finished, costs_by_policy[policy], cluster, policy, floor, cadence,
                                 steps - case.start_step)
    print("RESULT " + json.dumps({
        "case": dataclasses.asdict(case), "costs": costs_by_policy, "sources": sources, "budgets": budgets,
        "steps": steps, "min_slices": floor, "predicted": predicted, "measured": measured, "paid": paid,
        "calibration_s": calibrated_s, "load": load, "jax": jax.__version__,
    }), flush=True)
    return 0


def _window(run_dir: Path) -> dict[str, Any]:
    """A finished run's steady stretch (:func:`elastic_dew.plan.check.measure`, the rule
    ``elastic-dew plan --check`` reads runs by) and its badput by category over it."""
    from elastic_dew import record
    from elastic_dew.elastic import events as ev
    from elastic_dew.plan import check

    measured = check.measure(run_dir)
    events = record.as_events(record.read_events(run_dir))
    closing = _closing(events)
    saves = [i for i, e in enumerate(events) if isinstance(e, ev.Save) and e.taken and not closing[i]
             and e.tier == "checkpoint"]
    start = saves[0]
    whole, before = record.account(events), record.account(events[:start + 1])
    badput = {k: round(whole.badput.get(k, 0.0) - before.badput.get(k, 0.0), 3) for k in whole.badput}
    return {"goodput": measured.goodput, "wall_s": round(measured.wall_seconds, 3),
            "productive_s": round(measured.productive_seconds, 3), "losses": measured.losses, "badput": badput}


def _closing(events):
    from elastic_dew.plan.inputs import _closing_saves

    return _closing_saves(events)


def _paid(run_dirs: list[Path], costs: dict[str, Any], cluster, policy: str, floor: int,
          cadence: dict[str, int], steps: int) -> dict[str, Any]:
    """What the measured runs paid, as means (the calibration's resumes are medians): each
    snapshot resume's detection, mesh and compile and its restore, each scale-up, the
    steps' own time on every slice and on fewer; and the model's prediction with those
    costs in place of the calibration's. A gap that this closes is a cost the calibration
    misjudged; one it leaves is the model's."""
    import statistics as st

    from elastic_dew import record
    from elastic_dew.elastic import events as ev
    from elastic_dew.plan import Costs, PolicySettings, model

    recoveries, restores, scale_ups, first_compiles, waits = [], [], [], [], []
    steps_by_slices: dict[int, list[float]] = {}
    for run_dir in run_dirs:
        events = record.as_events(record.read_events(run_dir))
        for e in events:
            if isinstance(e, ev.Resume) and e.source == "snapshot":
                recoveries.append(e.durations["detection"] + e.durations["mesh_and_compile"])
                restores.append(e.durations["restore"])
                first_compiles.append(e.durations["mesh_and_compile"])
                waits.append(e.durations["wait_for_slices"])
            elif isinstance(e, ev.Resume) and e.source == "live":
                scale_ups.append(sum(e.durations.values()))
            elif isinstance(e, ev.Step):
                steps_by_slices.setdefault(e.slices, []).append(float(e.seconds) - min(float(e.data_seconds),
                                                                                        float(e.seconds)))
    out: dict[str, Any] = {
        "recovery_mean": st.fmean(recoveries) if recoveries else None,
        "recovery_median": st.median(recoveries) if recoveries else None,
        "recovery_max": max(recoveries) if recoveries else None,
        "restore_mean": st.fmean(restores) if restores else None,
        "wait_for_slices_mean": st.fmean(waits) if waits else None,
        "scale_up_mean": st.fmean(scale_ups) if scale_ups else None,
        "scale_up_median": st.median(scale_ups) if scale_ups else None,
        "resumes": len(recoveries), "scale_ups": len(scale_ups),
        "step_by_slices": {str(k): round(st.fmean(v), 5) for k, v in sorted(steps_by_slices.items())},
    }
    paid = dict(costs)
    if recoveries:
        paid["recovery_seconds"] = out["recovery_mean"]
        paid["snapshot_restore_seconds"] = out["restore_mean"]
    if scale_ups:
        paid["scale_up_seconds"] = out["scale_up_mean"]
    paid["new_mesh_seconds"] = 0.0  # the means hold the new sets' compiles already
    settings = PolicySettings(policy, min_slices=floor if policy == "replica_resize" else None, **cadence)
    out["predicted_with_paid_costs"] = model.evaluate(Costs(**paid), cluster, settings, steps=steps).goodput
    return out


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


def _train(case: Case, policy: str, floor: int | None, schedule: str, steps: int, run_dir: Path,
           budget: dict[str, Any] | None) -> str | None:
    """``Trainer.fit`` of the case's recipe on its simulated slices under ``schedule``;
    restart's program is started again in this process after a runtime error (the
    ``error`` its schedule writes) or a preemption. ``budget``: the plan's retry budget
    (``max_attempts``, ``retry_reset_steps``), else none. Returns ``None`` when the run
    finished, else why it ended (the retry budget gave up)."""
    import jax

    from elastic_dew import rundir
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.slices.retry import make_manager
    from elastic_dew.runtime import Preempted
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.supervisor import supervise_in_process
    from elastic_dew.trainer import Trainer, TrainConfig

    recipe = __import__(f"elastic_dew.recipes.{case.recipe}", fromlist=["build"])
    parts = recipe.build()
    batch = ({"global_batch": case.global_batch, "batch_policy": "constant"} if case.global_batch
             else {"global_batch": PER_SLICE_BATCH * case.slices, "batch_policy": "scale_by_active_slices"})
    retries = ({"max_attempts": budget["max_attempts"], "retry_reset_steps": budget["retry_reset_steps"]}
               if budget is not None else {"max_attempts": None})
    config = ElasticConfig(
        minimum_slice_count=None if policy in ("pause_resume", "restart") else floor,
        poll_interval=0.05, timeout=120, **retries, **batch,
        snapshot_every=0 if policy == "restart" else case.snapshot_every, checkpoint_every=case.checkpoint_every,
    )
    run_dir.mkdir(parents=True, exist_ok=True)

    def process(number: int) -> None:
        with SimulatedSlices(case.slices, case.devices_per_slice, schedule=schedule,
                             fault_log=run_dir / rundir.FAULTS_FILE):
            trainer = Trainer(**{name: parts[name] for name in ("init", "loss", "optimizer", "dataset")},
                              model_sharding=parts.get("model_sharding"), config=config, run_dir=run_dir,
                              manager=make_manager(), train=TrainConfig(log_every=10**9))
            trainer.fit(steps)

    # Under a retry budget only restart's program is started again after a runtime error:
    # under the elastic policies one is the budget giving up, and the run ends there.
    restarts = policy == "restart" or budget is None
    restart_on = (Preempted, jax.errors.JaxRuntimeError) if restarts else (Preempted,)
    from pathwaysutils.elastic.manager import ElasticRuntimeError

    try:
        outcomes = supervise_in_process(process, max_processes=500, restart_on=restart_on)
    except (jax.errors.JaxRuntimeError, ElasticRuntimeError) as error:  # the retry budget gave up
        if budget is None:
            raise
        return f"{type(error).__name__}: {error}"
    if outcomes[-1] is not None:
        raise RuntimeError(f"{run_dir.name} did not finish in 500 attempts: {outcomes[-1]}")
    return None


# --------------------------------------------------------------------------- the parent


def _run_child(case: str, schedules: int, stepping_scale: float, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"child-{case}.log"
    spec = CASES[case]
    with open(log, "w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.plan_validation", "child", case, str(schedules),
             str(stepping_scale), str(workdir)],
            cwd=REPO, env=worker_env(devices=spec.slices * spec.devices_per_slice), stdout=subprocess.PIPE,
            stderr=err, text=True, timeout=3600,
        )
    result = next((line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode != 0 or result is None:
        raise RuntimeError(f"plan_validation {case} exited {done.returncode}: {log.read_text()[-3000:]}")
    (workdir / f"result-{case}.json").write_text(result)
    return json.loads(result)


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """One case's figures: per policy the prediction, the finished runs' mean, its standard
    error and the gap, the runs that gave up, the retry budget, what the runs paid."""
    case = run["case"]
    name = f"{case['recipe']}_{case['slices']}x{case['devices_per_slice']}{case.get('label', '')}"
    out: dict[str, Any] = {f"plan_validation_costs_{name}": run["costs"], f"plan_validation_steps_{name}": run["steps"],
                           f"plan_validation_min_slices_{name}": run["min_slices"],
                           f"plan_validation_load_{name}": [round(x, 2) for x in run["load"]]}
    for policy, predicted in run["predicted"].items():
        results = run["measured"][policy]
        finished = [r for r in results if "goodput" in r]
        values = [r["goodput"] for r in finished]
        key = f"plan_{policy}_{name}"
        out[f"{key}_predicted"] = predicted
        out[f"{key}_gave_up"] = len(results) - len(finished)
        out[f"{key}_runs"] = len(results)
        if values:
            mean = statistics.fmean(values)
            out[f"{key}_measured"] = mean
            out[f"{key}_points"] = 100 * (mean - predicted)
            out[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else math.nan
            out[f"{key}_se_points"] = 100 * out[f"{key}_sd"] / math.sqrt(len(values)) if len(values) > 1 else math.nan
            out[f"{key}_all"] = [round(v, 4) for v in values]
            out[f"{key}_losses_mean"] = statistics.fmean(r["losses"] for r in finished)
            out[f"{key}_badput"] = {k: round(statistics.fmean(r["badput"][k] / r["wall_s"] for r in finished), 4)
                                    for k in finished[0]["badput"]}
        if policy in run["budgets"]:
            out[f"{key}_budget"] = run["budgets"][policy]
        if policy in run["paid"]:
            out[f"{key}_paid"] = run["paid"][policy]
    return out


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    t = time.monotonic()
    results.update(model_against_simulation(sizes.plan_des_faults))
    des_s = time.monotonic() - t
    for case in sizes.plan_cases:
        results.update(summarize(_run_child(case, sizes.plan_schedules, sizes.plan_stepping_scale,
                                            workdir / f"case-{case}")))
    gaps = [abs(v) for k, v in results.items() if k.endswith("_points") and k.startswith("plan_")
            and "vs_des" not in k and isinstance(v, float) and math.isfinite(v)]
    results["plan_validation_worst_points"] = max(gaps) if gaps else math.nan
    results["plan_validation_gave_up"] = sum(v for k, v in results.items() if k.endswith("_gave_up"))
    described = "; ".join(
        f"{c}: {CASES[c].recipe} on {CASES[c].slices} slices of {CASES[c].devices_per_slice} device(s), a slice lost "
        f"every {CASES[c].loss_every_s:g} s of running and back after {CASES[c].return_s:g} s, snapshot every "
        f"{CASES[c].snapshot_every}, checkpoint every {CASES[c].checkpoint_every}, "
        + (f"global batch {CASES[c].global_batch} kept constant" if CASES[c].global_batch
           else f"{PER_SLICE_BATCH} examples a slice")
        + f", about {CASES[c].stepping_s * sizes.plan_stepping_scale:g} s of steps per run"
        for c in sizes.plan_cases)
    notes.append(
        f"Plan validation: the model against {sizes.plan_schedules} real runs per policy and case ({described}); "
        "each run's Poisson schedule drawn by elastic_dew.plan.draw_schedule (seeds 0.."
        f"{sizes.plan_schedules - 1}) from the step after the first checkpoint. The prediction comes first, from "
        f"each policy's own calibration run (seed {CALIBRATION_SEED}, {CALIBRATION_LENGTH} runs' length) and the "
        "rates alone, and so does the retry budget (elastic_dew.plan.retry.recommend, a run of the measured "
        "length giving up in at most 1 in 1,000), which the elastic policies' runs then train with; a run it "
        "ends counts as given up. Measured goodput: elastic_dew.plan.check.measure (plan --check's rule: the "
        "record's productive time over the wall time from the first checkpoint at the cadence to the last step). "
        "restart meets each loss as a runtime error and an in-process restart from the newest checkpoint (no "
        "interpreter start, no reschedule). Model against the discrete-event simulation: "
        f"{len(DES_SLICES)} slice counts from 1 to 10,000, 0 and 2 spares, three policies, "
        f"{sizes.plan_des_faults} faults each ({des_s:.0f} s)."
    )
    return results


if __name__ == "__main__":
    if sys.argv[1:2] != ["child"] or len(sys.argv) != 6:
        sys.exit("usage: python -m benchmarks.plan_validation child CASE SCHEDULES STEPPING_SCALE WORKDIR")
    sys.exit(_child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]))
