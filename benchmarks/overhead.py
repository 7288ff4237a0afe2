"""Item 7: the toolkit's own cost: ``Trainer.fit`` against a bare jitted loop.

Both train ``lm`` with the same step (the trainer's), the same data (the recipe's dataset,
batched by Grain in order) and the same shardings (state replicated, batch split over the
eight devices), under :class:`SimulatedSlices` (both pay its read checks). ``Trainer.fit``
runs with no faults, snapshots off and no periodic checkpoints. The bare loop reads the loss
every ``LOG_EVERY`` steps, as a hand-written loop that logs does. The figure is the steady
step time (from step ``WARMUP`` to the last, so compiling and the final checkpoint are
outside it), alternating the two, median over rounds.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import median

__all__ = ["measure"]

WARMUP = 10
LOG_EVERY = 10


def _bare(parts: dict, steps: int) -> float:
    import grain
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from elastic_dew.trainer import _Program

    program = _Program(parts["init"], parts["loss"], parts["optimizer"], parts["dataset"][0], 0, frozenset())
    mesh = Mesh(np.asarray(jax.devices()[:8]), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    split = NamedSharding(mesh, PartitionSpec("data"))
    state = jax.jit(program._init, out_shardings=replicated)(program._key())
    step_fn = jax.jit(program._train_step, out_shardings=(replicated, replicated))
    batches = iter(parts["dataset"].batch(48, drop_remainder=True).to_iter_dataset(grain.ReadOptions()))
    started = None
    for step in range(1, steps + 1):
        state, metrics = step_fn(state, jax.device_put(next(batches), split))
        if step % LOG_EVERY == 0 or step == steps:
            float(metrics["loss"])
        if step == WARMUP:
            started = time.monotonic()
    return (time.monotonic() - started) / (steps - WARMUP)


def _trainer(parts: dict, steps: int, workdir: Path) -> float:
    from elastic_dew import Trainer
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.events import Step
    from elastic_dew.record import as_event

    config = ElasticConfig(
        minimum_slice_count=None, poll_interval=0.05, global_batch=48, snapshot_every=0,
        checkpoint_every=0,
    )
    times: dict[int, float] = {}

    def progress(line) -> None:
        event = as_event(line)
        if isinstance(event, Step):
            times[event.step] = time.monotonic()

    run_dir = Path(tempfile.mkdtemp(dir=workdir, prefix="fit-"))
    Trainer(**parts, config=config, run_dir=run_dir, log_every=10**9, progress=progress).fit(steps)
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
            bare.append(_bare(parts, sizes.overhead_steps))
            fit.append(_trainer(parts, sizes.overhead_steps, workdir))
            jax.clear_caches()
    notes.append(
        f"Framework overhead: lm recipe, {sizes.overhead_steps} steps per run, steady step time "
        f"after step {WARMUP}, {sizes.overhead_rounds} alternating rounds; the bare loop reads "
        f"the loss every {LOG_EVERY} steps, Trainer.fit every step (it must, to see a lost slice)."
    )
    return {
        "framework_step_s_trainer": median(fit),
        "framework_step_s_bare": median(bare),
        "framework_overhead_pct": (median(fit) / median(bare) - 1) * 100,
    }
