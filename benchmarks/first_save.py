"""Issues 11 and 19: what the first persistent checkpoint of a process costs the loop.

Orbax saves replicated arrays replica-parallel: each replica transfers its own slice, cut by
a small ``jax.lax.slice_in_dim`` program per device, shard shape and slice. A process's
first save compiled all of those programs inside the loop (profiled with cProfile: nearly
all of the first save's time is ``replica_slices.transfer_arrays_to_host`` ->
``slice_in_dim`` -> compile); later saves find them cached. Tier 2 now writes a leaf whose
per-replica slice is under ``orbax_private.REPLICA_PARALLEL_MIN_SLICE_BYTES`` whole from one
replica (Orbax's ``min_slice_bytes_for_replica_parallel``), which compiles nothing, and
``Checkpoints.precompile_saves`` compiles the slicing of the larger leaves in the background.

Each variant is a fresh process (compiled programs are per process): ``elastic-dew train
lm`` on four simulated slices with a checkpoint every ``K`` steps, once as shipped and once
as before issue 11 (the baseline: every leaf replica-parallel, the bound 0, and
``Checkpoints.precompile_saves`` a no-op). A save's cost to the loop is its ``save`` event's seconds;
the figure is the first save over the median of the later ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import lm_label, median
from elastic_dew.elastic.events import Save
from elastic_dew.record import as_events, read_events

__all__ = ["measure", "saves_of"]

_UNPREPARED = (
    "import sys; from elastic_dew.elastic.state.checkpoints import Checkpoints; "
    "from elastic_dew._compat import orbax as orbax_private; orbax_private.REPLICA_PARALLEL_MIN_SLICE_BYTES = 0; "
    "Checkpoints.precompile_saves = lambda self, state: None; "
    "from elastic_dew.cli import main; sys.exit(main(sys.argv[1:]))"
)
_PREPARED = "import sys; from elastic_dew.cli import main; sys.exit(main(sys.argv[1:]))"


def saves_of(run_dir: Path) -> list[float]:
    """The checkpoint tier's save seconds, in step order, from a run's ``events.jsonl``."""
    events = as_events(read_events(run_dir))
    return [e.seconds for e in events if isinstance(e, Save) and e.tier == "checkpoint" and e.taken]


def _run(code: str, run_dir: Path, steps: int, every: int, lm: tuple[tuple[str, object], ...]) -> list[float]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    args = ["train", "lm", "--steps", str(steps), "--checkpoint-every", str(every), "--run-dir", str(run_dir),
            "--no-summary", *(f"--set={name}={value}" for name, value in lm)]
    subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, capture_output=True, timeout=1200)
    return saves_of(run_dir)


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    every = sizes.first_save_every
    steps = every * 4
    results: dict[str, Any] = {}
    for name, code in (("unprepared", _UNPREPARED), ("prepared", _PREPARED)):
        saves = _run(code, workdir / name, steps, every, sizes.lm)
        first, later = saves[0], median(saves[1:])
        results[f"first_save_{name}_s"] = first
        results[f"later_save_{name}_s_p50"] = later
        results[f"first_save_{name}_over_later"] = first / later if later else float("nan")
    results["first_save_s"] = results["first_save_prepared_s"]
    results["first_save_over_later"] = results["first_save_prepared_over_later"]
    notes.append(
        f"first checkpoint save: {lm_label(sizes)} on 4x2 simulated slices, a checkpoint every {every} steps, "
        f"{steps} steps, one fresh process per variant; the baseline (every leaf replica-parallel, "
        f"nothing prepared) took {results['first_save_unprepared_s']:.2f} s for the first save against "
        f"{results['later_save_unprepared_s_p50']:.2f} s for later ones; as shipped, leaves under "
        "4 MiB a replica are written whole by one replica and nothing is compiled."
    )
    return results
