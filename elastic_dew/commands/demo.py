"""``elastic-dew demo``: the main job, a simulated elastic run that survives three faults.

It trains the ``lm`` recipe on 4 simulated slices of 2 CPU devices in replica-resize mode
(``--min-slices 3``) with a chaos schedule: slice 1 is lost, comes back, and then the
process is preempted (a real SIGTERM). The training runs as a child process,
``elastic-dew train lm ...``; when it exits with 143 (or is killed) the demo starts the
same command again, the way a JobSet restarts the controller's pod, and the run resumes from
its checkpoint without firing the faults that already fired. It ends with what happened,
the goodput summary and the path of the timeline picture.

``--quick`` runs a much smaller model for fewer steps (the test suite runs it).

``--boundary proxy`` runs the same training through the boundary Pathways presents: the
training process runs with ``JAX_PLATFORMS=proxy`` on a local Pathways backend
(:class:`elastic_dew.proxy.LocalPathways`, 4 slices of 2 CPU devices) that fires the same
schedule at the steps it counts (the preemption a SIGTERM to the training process), so the
training meets the loss as ``DATA_LOSS`` from jaxlib's proxy client, nothing simulated in
its process.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_dew.console import add_flag, flag_of, observe_of
from elastic_dew.run import USAGE_EXIT
from elastic_dew.run.planning import RUNS_DIR
from elastic_dew.runtime import run_timestamp
from elastic_dew.supervisor import supervise

if TYPE_CHECKING:
    from elastic_dew.elastic.events import Event

__all__ = ["configure", "run", "DemoPlan", "FULL", "QUICK", "story"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DemoPlan:
    """One demo's training run and how often it may be restarted: its steps, its fault
    schedule, the run settings it gives by field name (``train``'s flags are read from their
    declarations, :func:`elastic_dew.console.flag_of`) and the ``lm`` recipe's overrides."""

    steps: int
    schedule: str
    settings: Mapping[str, Any]
    overrides: tuple[str, ...] = ()
    max_restarts: int = 3


#: 4 simulated slices of 2 CPU devices, carrying on with 3 after a loss (replica-resize).
_SLICES = {"slices": 4, "devices_per_slice": 2, "minimum_slice_count": 3}

FULL = DemoPlan(
    steps=300,
    schedule="lose:1@80,restore:1@140,preempt@220",
    settings={**_SLICES, "global_batch": 48, "snapshot_every": 10, "checkpoint_every": 40, "log_every": 20},
)

QUICK = DemoPlan(
    steps=40,
    schedule="lose:1@10,restore:1@16,preempt@28",
    settings={**_SLICES, "global_batch": 24, "snapshot_every": 5, "checkpoint_every": 15, "log_every": 10},
    overrides=("seq_len=32", "d_model=32", "heads=2", "layers=1"),
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="a much shorter run (a smaller model, 40 steps)"
    )
    parser.add_argument(
        "--run-dir", metavar="DIR", help="where the run lives (default runs/demo_TIMESTAMP)"
    )
    parser.add_argument(
        "--boundary", choices=("in-process", "proxy"), default="in-process",
        help="in-process: simulated slices inside the training process; proxy: the training runs with "
             "JAX_PLATFORMS=proxy on a local Pathways backend (docs/pathways-boundary.md)",
    )
    # The training processes' option, built from the declaration train's is built from.
    add_flag(parser, "log_format")


#: The settings of the simulated slices themselves, which a run on the proxy backend leaves to it.
_SIMULATOR_SETTINGS = ("slices", "devices_per_slice", "schedule")


def command(plan: DemoPlan, run_dir: Path, log_format: str = "auto", *, simulated: bool = True) -> list[str]:
    """The training command the demo runs (and runs again after a preemption).

    ``log_format`` is the training processes' ``--log-format``; they inherit the demo's
    standard error, so ``auto`` resolves there as it would for the demo itself. Not
    ``simulated``, the command names no simulated slices and no schedule (the local Pathways
    backend has both).
    """
    given = {"steps": plan.steps, "schedule": plan.schedule, "run_dir": run_dir, **plan.settings}
    if not simulated:
        given = {name: value for name, value in given.items() if name not in _SIMULATOR_SETTINGS}
    args = [arg for name, value in given.items() for arg in (flag_of(name), str(value))]
    args += [arg for override in plan.overrides for arg in (flag_of("overrides"), override)]
    return [sys.executable, "-m", "elastic_dew", "train", "lm", *args, "--log-format", log_format, "--no-summary"]


def story(events: Iterable[Event | Mapping[str, Any]]) -> list[str]:
    """What happened, one line per fault, stop, resume and process start, in order.

    ``events`` are the run's events, typed or as their JSON lines (read through the run
    record's typed reader).
    """
    from elastic_dew.elastic import events as ev
    from elastic_dew.record import as_events

    lines = []
    for event in as_events(events):
        if isinstance(event, ev.Fault):
            target = f" slice {event.slice}" if event.slice is not None else ""
            lines.append(f"  fault   {event.action}{target} during step {event.step}")
        elif isinstance(event, ev.Stop):
            lines.append(f"  stop    {event.reason} after step {event.step}")
        elif isinstance(event, ev.Resume):
            d = event.durations
            lines.append(
                f"  resume  from {event.source} at step {event.step} "
                f"({sum(d.values()):.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in d.items()) + ")"
            )
        elif isinstance(event, ev.Start):
            lines.append(f"  process {event.pid} started")
    return lines


def _through_proxy(plan: DemoPlan, run_dir: Path, cmd: list[str], restarting: Any) -> list[int]:
    """Run ``cmd`` on a local Pathways backend with the plan's slices and schedule; each
    process announces itself to the backend (which sends the preemption's SIGTERM). The
    backend's fault log and log are in ``RUN_DIR-proxy/``."""
    import os

    from elastic_dew.proxy import LocalPathways
    from elastic_dew.rundir import FAULTS_FILE

    beside = _backend_dir(run_dir)  # the training refuses a run directory holding other files
    beside.mkdir(parents=True, exist_ok=True)
    backend = LocalPathways(int(plan.settings["slices"]), int(plan.settings["devices_per_slice"]),
                            schedule=plan.schedule, fault_log=beside / FAULTS_FILE, log=beside / "proxy.log")
    with backend:
        from elastic_dew.proxy.announce import CONTROL_ENV

        # the training's own loop announces its phases: the backend fires at the steps it names
        env = {**os.environ, **backend.client_env(), CONTROL_ENV: f"127.0.0.1:{backend.port}"}
        return supervise([*backend.exec_prefix(), *cmd], max_processes=plan.max_restarts + 1,
                         on_restart=restarting, env=env)


def _backend_dir(run_dir: Path) -> Path:
    """Where the local Pathways backend's fault log and log go: beside the run directory."""
    return run_dir.with_name(run_dir.name + "-proxy")


def _with_backend_faults(events: Iterable[Any], run_dir: Path) -> list[Any]:
    """The run's events with the faults the backend fired (its fault log), in time order."""
    import json

    from elastic_dew.rundir import FAULTS_FILE

    log = _backend_dir(run_dir) / FAULTS_FILE
    faults = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    merged = [e.to_json() if hasattr(e, "to_json") else dict(e) for e in events]
    merged += [f for f in faults if not f.get("never_fired")]
    return sorted(merged, key=lambda e: e.get("wall", 0.0))


def run(args: argparse.Namespace) -> int:
    from elastic_dew import record
    from elastic_dew.commands.report import report

    plan = QUICK if args.quick else FULL
    run_dir = Path(args.run_dir) if args.run_dir else RUNS_DIR / f"demo_{run_timestamp()}"
    if not args.run_dir and run_dir.exists():
        print(f"elastic-dew demo: error: {run_dir} exists; give --run-dir", file=sys.stderr)
        return USAGE_EXIT
    proxy = args.boundary == "proxy"
    cmd = command(plan, run_dir, observe_of(args).log_format, simulated=not proxy)
    where = "a local Pathways backend (JAX_PLATFORMS=proxy) with 4 slices" if proxy else "4 simulated slices"
    print(
        f"elastic-dew demo: training the lm recipe for {plan.steps} steps on {where} "
        f"of 2 CPU devices,\nwith the faults {plan.schedule} (lose slice 1, get it back, preempt).\n"
        f"Run directory: {run_dir}\nCommand: {' '.join(cmd)}\n",
        flush=True,
    )
    started = time.monotonic()

    def restarting(status: int, restarts: int) -> None:
        print(
            f"\nelastic-dew demo: the training exited with {status} (preempted); restarting "
            f"the same command, as a JobSet restarts the pod (restart {restarts})\n",
            flush=True,
        )

    if proxy:
        statuses = _through_proxy(plan, run_dir, cmd, restarting)
    else:
        statuses = supervise(cmd, max_processes=plan.max_restarts + 1, on_restart=restarting)
    restarts = len(statuses) - 1
    if statuses[-1] != 0:
        status = statuses[-1]
        print(f"elastic-dew demo: the training failed with exit status {status}", file=sys.stderr)
        return status if status > 0 else 1

    summary, picture, table = report(run_dir)
    print(f"\nelastic-dew demo: done in {time.monotonic() - started:.0f} s after {restarts} restart(s).")
    print(f"What happened (from {run_dir / record.EVENTS_FILE}):")
    print("\n".join(story(_with_backend_faults(record.read_events(run_dir), run_dir) if proxy
                           else record.read_events(run_dir))))
    print()
    print(table)
    if picture is not None:
        print(f"\ntimeline: {picture}")
    print(f"\nSee it again with: elastic-dew report {run_dir}")
    return 0
