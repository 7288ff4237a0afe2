"""Item 6: goodput under a fixed fault schedule, elastic against the restart baseline.

Both sides run ``Trainer.fit`` of ``lm`` for the same steps as real subprocesses
(``benchmarks.worker train``) on four simulated slices, and :mod:`elastic_dew.supervisor`
restarts a process that exits 143 (preempted) or is killed, as a JobSet restarts the workload. The schedule
(fractions of the run): a slice lost at 20% and back at 35%, another lost at 50% and back
at 65%, a preemption at 80%. The elastic side rides the slice losses in process (snapshot
every 5 steps, checkpoint every 50); the baseline has no elastic training, so each slice
loss kills the whole workload, which restarts from the newest checkpoint (every 50 steps),
and the slice returns are moot. Goodput is the run record's (productive step time over the
processes' wall time, as ml-goodput-measurement defines it), from ``summary.json``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, worker_command, worker_env
from elastic_dew.supervisor import RESTART_STATUSES, supervise

__all__ = ["measure", "schedules"]

CHECKPOINT_EVERY = 50
SNAPSHOT_EVERY = 5


def schedules(steps: int) -> tuple[str, str]:
    at = lambda fraction: max(1, int(steps * fraction))  # noqa: E731
    elastic = f"lose:1@{at(0.2)},restore:1@{at(0.35)},lose:2@{at(0.5)},restore:2@{at(0.65)},preempt@{at(0.8)}"
    baseline = f"kill@{at(0.2)},kill@{at(0.5)},preempt@{at(0.8)}"
    return elastic, baseline


def _supervise(run_dir: Path, steps: int, schedule: str, snapshot_every: int) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}-worker.log"
    with open(log, "a") as err:
        codes = supervise(
            worker_command("train", str(run_dir), str(steps), schedule, str(snapshot_every), str(CHECKPOINT_EVERY)),
            max_processes=10, cwd=REPO, env=worker_env(), stdout=subprocess.DEVNULL, stderr=err, timeout=1800,
        )
    if codes[-1] != 0 and codes[-1] not in RESTART_STATUSES:
        raise RuntimeError(f"training worker exited {codes[-1]}: {log.read_text()[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["exit_codes"] = codes
    return summary


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    steps = sizes.goodput_steps
    elastic_schedule, baseline_schedule = schedules(steps)
    elastic = _supervise(workdir / "elastic", steps, elastic_schedule, SNAPSHOT_EVERY)
    baseline = _supervise(workdir / "restart", steps, baseline_schedule, 0)
    for name, summary in (("elastic", elastic), ("restart", baseline)):
        if summary["final_step"] != steps:
            raise RuntimeError(f"the {name} run ended at step {summary['final_step']}, not {steps}")
    notes.append(
        f"Goodput: lm, {steps} steps; elastic schedule `{elastic_schedule}` "
        f"({len(elastic['exit_codes'])} processes), baseline `{baseline_schedule}` "
        f"({len(baseline['exit_codes'])} processes). Elastic badput (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in elastic["badput"].items() if v >= 0.05)
        + "; baseline badput (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in baseline["badput"].items() if v >= 0.05)
        + "."
    )
    return {
        "goodput": elastic["goodput"],
        "goodput_restart_baseline": baseline["goodput"],
        "goodput_ratio": elastic["goodput"] / baseline["goodput"] if baseline["goodput"] else float("nan"),
        "goodput_wall_s": elastic["wall_seconds"],
        "goodput_restart_baseline_wall_s": baseline["wall_seconds"],
        "goodput_badput_s": elastic["badput"],
        "goodput_restart_baseline_badput_s": baseline["badput"],
    }
