"""Issue 11, item 7: what the first persistent checkpoint of a process costs the loop.

Orbax saves replicated arrays replica-parallel: each replica transfers its own slice, cut by
a small ``jax.lax.slice_in_dim`` program per device, shard shape and slice. A process's
first save compiled all of those programs inside the loop (profiled with cProfile: nearly
all of the first save's time is ``replica_slices.transfer_arrays_to_host`` ->
``slice_in_dim`` -> compile); later saves find them cached. ``Checkpoints.prepare``
compiles them in a background thread from the first step's output on, so the first save
finds them ready (see ``docs/performance.md``).

Each variant is a fresh process (compiled programs are per process): ``elastic-dew train
lm`` on four simulated slices with a checkpoint every ``K`` steps, once as shipped and once
with ``Checkpoints.prepare`` made a no-op (the baseline, as before the change). A save's
cost to the loop is its ``save`` event's seconds; the figure is the first save over the
median of the later ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import median
from elastic_dew.elastic.events import Save
from elastic_dew.record import as_events, read_events

__all__ = ["measure", "saves_of"]

_UNPREPARED = (
    "import sys; from elastic_dew.elastic.checkpoints import Checkpoints; "
    "Checkpoints.prepare = lambda self, state: None; "
    "from elastic_dew.cli import main; sys.exit(main(sys.argv[1:]))"
)
_PREPARED = "import sys; from elastic_dew.cli import main; sys.exit(main(sys.argv[1:]))"


def saves_of(run_dir: Path) -> list[float]:
    """The checkpoint tier's save seconds, in step order, from a run's ``events.jsonl``."""
    events = as_events(read_events(run_dir))
    return [e.seconds for e in events if isinstance(e, Save) and e.tier == "checkpoint" and e.taken]


def _run(code: str, run_dir: Path, steps: int, every: int) -> list[float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    args = ["train", "lm", "--steps", str(steps), "--checkpoint-every", str(every), "--run-dir", str(run_dir),
            "--no-summary"]
    subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, capture_output=True, timeout=1200)
    return saves_of(run_dir)


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    every = sizes.first_save_every
    steps = every * 4
    results: dict[str, Any] = {}
    for name, code in (("unprepared", _UNPREPARED), ("prepared", _PREPARED)):
        saves = _run(code, workdir / name, steps, every)
        first, later = saves[0], median(saves[1:])
        results[f"first_save_{name}_s"] = first
        results[f"later_save_{name}_s_p50"] = later
        results[f"first_save_{name}_over_later"] = first / later if later else float("nan")
    results["first_save_s"] = results["first_save_prepared_s"]
    results["first_save_over_later"] = results["first_save_prepared_over_later"]
    notes.append(
        f"first checkpoint save: lm on 4x2 simulated slices, a checkpoint every {every} steps, "
        f"{steps} steps, one fresh process per variant; without preparing, the first save took "
        f"{results['first_save_unprepared_s']:.2f} s against {results['later_save_unprepared_s_p50']:.2f} s "
        "for later ones. On this 2-core host the background compile competes with the steps for "
        "the cores, so a first save soon after the start finds part of it undone and compiles the rest."
    )
    return results
