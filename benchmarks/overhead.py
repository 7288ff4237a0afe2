"""Item 7: the toolkit's own cost: ``Trainer.fit`` against a bare jitted loop.

Both train ``lm`` with the same step (the trainer's), the same data (the recipe's dataset,
batched by Grain in order, with the trainer's read-ahead options), the same shardings (the
trainer's default ``fsdp`` state: each large parameter and its moments split over a slice's
``data`` devices, replicated across the four slices; the batch split over ``(replica,
data)``) and the same lagged read (step N+1 is dispatched before step N's loss is read,
every step, as the protocol does), under :class:`SimulatedSlices` (both pay its read
checks). The bare loop takes its program from a ``Trainer`` built with the same arguments,
so its shardings are the trainer's own. ``Trainer.fit`` runs with no faults, snapshots off
and no periodic checkpoints. The figure is the steady step time (from step ``WARMUP`` to the
last, so compiling and the final checkpoint are outside it), alternating the two, median
over rounds.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import median

__all__ = ["measure", "POLICY"]

WARMUP = 10
POLICY = "fsdp"
GLOBAL_BATCH = 48


def _config():
    from elastic_dew.elastic.config import ElasticConfig

    return ElasticConfig(
        minimum_slice_count=None, poll_interval=0.05, global_batch=GLOBAL_BATCH, snapshot_every=0,
        checkpoint_every=0,
    )


def _bare(parts: dict, steps: int, workdir: Path) -> float:
    import jax

    from elastic_dew import Trainer
    from elastic_dew.elastic.data import default_read_options
    from elastic_dew.elastic.slices import batch_sharding, mesh_of

    run_dir = Path(tempfile.mkdtemp(dir=workdir, prefix="bare-"))
    program = Trainer(**parts, config=_config(), run_dir=run_dir, sharding=POLICY)._program
    mesh = mesh_of(jax.devices()[:8], 4)
    state = program.init_state(mesh)
    step_fn = program.compile(mesh, GLOBAL_BATCH)
    split = batch_sharding(mesh)
    # The trainer's read-ahead: Grain's default (500 batches) never refills in a run this
    # short, so the bare loop would skip the one read-ahead hand-off a step that ``fit`` pays.
    read_options = default_read_options(GLOBAL_BATCH)
    batches = iter(parts["dataset"].batch(GLOBAL_BATCH, drop_remainder=True).to_iter_dataset(read_options))
    started = None
    in_flight = None
    for step in range(1, steps + 1):
        state, metrics = step_fn(state, jax.device_put(next(batches), split))
        if in_flight is not None:
            float(in_flight["loss"])  # step - 1's loss, read once step is dispatched
            if step - 1 == WARMUP:
                started = time.monotonic()
        in_flight = metrics
    float(in_flight["loss"])
    return (time.monotonic() - started) / (steps - WARMUP)


def _trainer(parts: dict, steps: int, workdir: Path) -> float:
    from elastic_dew import Trainer
    from elastic_dew.elastic.events import Step
    times: dict[int, float] = {}

    def progress(event) -> None:
        if isinstance(event, Step):
            times[event.step] = time.monotonic()

    run_dir = Path(tempfile.mkdtemp(dir=workdir, prefix="fit-"))
    Trainer(
        **parts, config=_config(), run_dir=run_dir, log_every=10**9, sinks=[progress], sharding=POLICY
    ).fit(steps)
    return (times[steps] - times[WARMUP]) / (steps - WARMUP)


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    import jax

    from benchmarks.worker import lm_parts
    from elastic_dew.simulate import SimulatedSlices

    parts = lm_parts()
    workdir.mkdir(parents=True, exist_ok=True)
    fit, bare = [], []
    with SimulatedSlices(4, 2):
        for _ in range(sizes.overhead_rounds):
            bare.append(_bare(parts, sizes.overhead_steps, workdir))
            fit.append(_trainer(parts, sizes.overhead_steps, workdir))
            jax.clear_caches()
    notes.append(
        f"Framework overhead: lm recipe under {POLICY}, {sizes.overhead_steps} steps per run, steady "
        f"step time after step {WARMUP}, {sizes.overhead_rounds} alternating rounds; both loops "
        "read each step's loss one step late (after dispatching the next step), with the same "
        "state and batch shardings."
    )
    return {
        "framework_step_s_trainer": median(fit),
        "framework_step_s_bare": median(bare),
        "framework_overhead_pct": (median(fit) / median(bare) - 1) * 100,
    }
