"""Item 6: the share of fault-free goodput that survives a fixed fault schedule, elastic and restarting.

Four runs of ``Trainer.fit`` of ``lm`` for the same number of steps, each as real
subprocesses (``benchmarks.worker train``) on four simulated slices, which
:mod:`elastic_dew.supervisor` starts again after exit 143 (preempted) or a kill, as a JobSet
restarts its pod:

* elastic, fault-free: a snapshot every 5 steps, a checkpoint every 50, no faults;
* restart baseline, fault-free: no elastic training (no snapshots, every slice needed), a
  checkpoint every 50 steps, no faults;
* elastic, faulted: the schedule (fractions of the run) loses a slice at 20% and gives it
  back at 35%, loses another at 50% and gives it back at 65%, and preempts at 80%; the
  slice losses are ridden in process, the preemption ends the process;
* restart baseline, faulted: the same faults handled by restarting, as item 1's baseline
  does: each slice loss kills the whole workload (``kill``), and the new process restores
  the newest persistent checkpoint; the slice returns are moot.

The runs go fault-free, fault-free, faulted, faulted, each pair elastic then baseline.
Goodput is the run record's (``summary.json``): productive step time over the wall time from
the first process's start to the run's last event, the time between processes counted as
``infrastructure_recovery_from_disruption``, as ml-goodput-measurement counts it. The row
to meet is each side's faulted goodput over its own fault-free goodput: the share of it
that survives the faults.

Each run's processes share one JAX persistent compilation cache, the run's own (a fresh
directory per run, so no run starts warm): a restarted process loads the programs its
predecessors compiled, as ``elastic-dew train`` does on simulated slices and a Pathways
controller does from its own cache on a cluster.

The time between processes: the supervisor starts the next process at once, where a
cluster reschedules a preempted pod in minutes. ``BENCH_RESCHEDULE_DELAY_S`` (default 0)
sleeps that long before each restart, so the measured runs carry it; and both shares are
reported again with each restart taking :data:`~benchmarks.common.CLUSTER_RESCHEDULE_S`,
derived from the same runs (the time between processes raised to that many seconds per
restart: nothing else in the accounting depends on it).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import CLUSTER_RESCHEDULE_S, REPO, worker_command, worker_env
from elastic_dew.rundir import SUMMARY_FILE
from elastic_dew.supervisor import supervise

__all__ = ["measure", "schedules", "reschedule_delay", "rescheduled_goodput"]

logger = logging.getLogger(__name__)

CHECKPOINT_EVERY = 50
SNAPSHOT_EVERY = 5
#: The environment variable of the simulated reschedule delay, in seconds.
DELAY_VARIABLE = "BENCH_RESCHEDULE_DELAY_S"
BETWEEN = "infrastructure_recovery_from_disruption"


def schedules(steps: int) -> tuple[str, str]:
    """The elastic schedule and the restart baseline's (the same faults, handled by restarting)."""
    at = lambda fraction: max(1, int(steps * fraction))  # noqa: E731
    elastic = f"lose:1@{at(0.2)},restore:1@{at(0.35)},lose:2@{at(0.5)},restore:2@{at(0.65)},preempt@{at(0.8)}"
    baseline = f"kill@{at(0.2)},kill@{at(0.5)},preempt@{at(0.8)}"
    return elastic, baseline


def reschedule_delay(environ: dict[str, str] | None = None) -> float:
    """The simulated reschedule delay from ``BENCH_RESCHEDULE_DELAY_S`` (0 when unset)."""
    text = (os.environ if environ is None else environ).get(DELAY_VARIABLE, "").strip()
    if not text:
        return 0.0
    try:
        delay = float(text)
    except ValueError:
        delay = -1.0
    if not delay >= 0 or delay == float("inf"):
        raise ValueError(
            f"{DELAY_VARIABLE}={text!r} is not a number of seconds >= 0; set it to e.g. 60, or unset it"
        )
    return delay


def rescheduled_goodput(summary: dict[str, Any], seconds_per_restart: float) -> float:
    """The run's goodput had each restart taken ``seconds_per_restart`` between processes.

    The time between processes is raised (never lowered) to ``restarts x
    seconds_per_restart``; the wall time grows by the difference and productive time stays.
    """
    restarts = max(0, int(summary["processes"]) - 1)
    between = float(summary["badput"].get(BETWEEN, 0.0))
    wall = float(summary["wall_seconds"]) + max(0.0, restarts * seconds_per_restart - between)
    return float(summary["productive_seconds"]) / wall if wall > 0 else 0.0


def _supervise(run_dir: Path, steps: int, schedule: str, snapshot_every: int, delay: float) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}-worker.log"

    def wait(status: int, restarts: int) -> None:
        if delay > 0:
            logger.info("%s: process exited %d; rescheduling takes %.0f s", run_dir.name, status, delay)
            time.sleep(delay)

    env = worker_env()
    env["BENCH_COMPILATION_CACHE"] = str(run_dir.parent / f"{run_dir.name}-compilation-cache")
    with open(log, "a") as err:
        codes = supervise(
            worker_command("train", str(run_dir), str(steps), schedule, str(snapshot_every), str(CHECKPOINT_EVERY)),
            max_processes=10, on_restart=wait, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
            stderr=err, timeout=1800,
        )
    if codes[-1] != 0:
        raise RuntimeError(f"the {run_dir.name} run's worker exited {codes}: {log.read_text()[-3000:]}")
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    summary["exit_codes"] = codes
    if summary["final_step"] != steps:
        raise RuntimeError(f"the {run_dir.name} run ended at step {summary['final_step']}, not {steps}")
    if not schedule and len(codes) != 1:
        raise RuntimeError(f"the fault-free {run_dir.name} run took {len(codes)} processes ({codes})")
    return summary


def _badput(summary: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in summary["badput"].items() if v >= 0.05)


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    steps = sizes.goodput_steps
    delay = reschedule_delay()
    elastic_schedule, baseline_schedule = schedules(steps)
    runs = {}
    for name, schedule, snapshot_every in (
        ("elastic-fault-free", "", SNAPSHOT_EVERY),
        ("restart-fault-free", "", 0),
        ("elastic", elastic_schedule, SNAPSHOT_EVERY),
        ("restart", baseline_schedule, 0),
    ):
        runs[name] = _supervise(workdir / name, steps, schedule, snapshot_every, delay)
    elastic, baseline = runs["elastic"], runs["restart"]
    clean, baseline_clean = runs["elastic-fault-free"], runs["restart-fault-free"]
    share = lambda g, free: g / free if free else float("nan")  # noqa: E731
    results: dict[str, Any] = {
        "goodput": elastic["goodput"],
        "goodput_restart_baseline": baseline["goodput"],
        "goodput_ratio": share(elastic["goodput"], baseline["goodput"]),
        "goodput_fault_free": clean["goodput"],
        "goodput_restart_baseline_fault_free": baseline_clean["goodput"],
        "goodput_share_of_fault_free": share(elastic["goodput"], clean["goodput"]),
        "goodput_restart_baseline_share_of_fault_free": share(baseline["goodput"], baseline_clean["goodput"]),
        "goodput_between_processes_s": elastic["badput"][BETWEEN],
        "goodput_restart_baseline_between_processes_s": baseline["badput"][BETWEEN],
        "goodput_reschedule_delay_s": delay,
        "goodput_cluster_reschedule_s": CLUSTER_RESCHEDULE_S,
        "goodput_share_of_fault_free_rescheduled": share(
            rescheduled_goodput(elastic, CLUSTER_RESCHEDULE_S), clean["goodput"]
        ),
        "goodput_restart_baseline_share_of_fault_free_rescheduled": share(
            rescheduled_goodput(baseline, CLUSTER_RESCHEDULE_S), baseline_clean["goodput"]
        ),
        "goodput_processes": len(elastic["exit_codes"]),
        "goodput_restart_baseline_processes": len(baseline["exit_codes"]),
        "goodput_badput_s": elastic["badput"],
        "goodput_restart_baseline_badput_s": baseline["badput"],
        "goodput_fault_free_badput_s": clean["badput"],
        "goodput_restart_baseline_fault_free_badput_s": baseline_clean["badput"],
    }
    for name, summary in runs.items():
        results[f"goodput_wall_s_{name.replace('-', '_')}"] = summary["wall_seconds"]
    results["goodput_share_over_restart_baseline"] = share(
        results["goodput_share_of_fault_free"], results["goodput_restart_baseline_share_of_fault_free"]
    )
    notes.append(
        f"Goodput: lm, {steps} steps per run, each run without faults and under faults; elastic "
        f"schedule `{elastic_schedule}` ({len(elastic['exit_codes'])} processes), restart baseline "
        f"`{baseline_schedule}` ({len(baseline['exit_codes'])} processes). Goodput counts the time "
        f"between processes (each run's processes share the run's own JAX compilation cache; "
        f"the supervisor restarts at once, plus a simulated reschedule of "
        f"{delay:.0f} s; measured {elastic['badput'][BETWEEN]:.2f} s and "
        f"{baseline['badput'][BETWEEN]:.2f} s). The rescheduled row is derived from the same runs "
        f"with each restart taking {CLUSTER_RESCHEDULE_S:.0f} s, as a rescheduled pod does on a "
        f"cluster. Faulted badput (s), elastic: {_badput(elastic)}; restart baseline: "
        f"{_badput(baseline)}. Fault-free badput (s), elastic: {_badput(clean)}; restart "
        f"baseline: {_badput(baseline_clean)}."
    )
    return results
