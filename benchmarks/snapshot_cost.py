"""Item 2: what staying ready costs: step time with a snapshot every k steps, on ``lm``.

One :class:`ElasticRun` on four simulated slices switches ``snapshot_every`` between blocks
of steps (none, 1, 5, 10, in rounds, so the variants alternate in time). A block's cost is
its mean step interval (the snapshot's cost lands on one step in k, so a median would hide
it); each variant's figure is the median over its blocks. Orbax's ``Snapshotter.save``
skips a request while the previous one is still queued, so each variant also reports the
fraction of requested snapshots that were taken: a low overhead with skipped snapshots
does not meet the target.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from benchmarks.common import mean, median

__all__ = ["measure", "VARIANTS"]

VARIANTS = (0, 1, 5, 10)
WARMUP = 10
SKIP = 2  # intervals at the start of a block not counted


class _Finished(Exception):
    pass


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    import jax

    from benchmarks.worker import lm_parts
    from elastic_dew.elastic import hooks
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.data import ElasticData
    from elastic_dew.elastic.events import Save, Step
    from elastic_dew.elastic.protocol import ElasticRun
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.trainer import _Program
    from elastic_dew.record import as_event

    parts = lm_parts()
    program = _Program(parts["init"], parts["loss"], parts["optimizer"], parts["dataset"][0], 0, frozenset())
    base = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, global_batch=48, snapshot_every=1,
        checkpoint_every=0, checkpoint_dir=None, precompile_smaller_meshes=False,
    )
    block = sizes.snapshot_block
    plan = [k for _ in range(sizes.snapshot_rounds) for k in VARIANTS]
    events: list[tuple[float, Any]] = []  # (monotonic time, typed event)
    blocks: list[tuple[int, int, int]] = []  # (k, first step, last step)
    box: dict[str, Any] = {}

    def listener(phase: str, step: int) -> None:
        if phase != "step" or step <= WARMUP:
            return
        index, offset = divmod(step - WARMUP - 1, block)
        if index >= len(plan):
            raise _Finished
        if offset == 0:
            k = plan[index]
            box["run"].config = dataclasses.replace(base, snapshot_every=k)
            box["run"].snapshots.join()  # a block starts with nothing in flight
            blocks.append((k, step, step + block - 1))

    hooks.add_listener(listener)
    try:
        with SimulatedSlices(4, 2):
            run = ElasticRun(
                program, ElasticData(parts["dataset"]), dataclasses.replace(base, snapshot_every=0),
                emit=lambda e: events.append((time.monotonic(), e)),
            )
            from elastic_dew.elastic.snapshots import Snapshots

            run.snapshots = Snapshots(replica_axis_index=0)
            box["run"] = run
            try:
                run.run(10**6)
            except _Finished:
                pass
    finally:
        hooks.remove_listener(listener)
        jax.clear_caches()

    typed = [(t, as_event(e)) for t, e in events]
    step_time = {e.step: t for t, e in typed if isinstance(e, Step)}
    saves = [e for _, e in typed if isinstance(e, Save) and e.tier == "snapshot"]
    per_k: dict[int, list[float]] = {k: [] for k in VARIANTS}
    taken: dict[int, list[int]] = {k: [0, 0] for k in VARIANTS}
    for k, first, last in blocks:
        intervals = [step_time[s + 1] - step_time[s] for s in range(first + SKIP, last + 1) if s + 1 in step_time and s in step_time]
        if intervals:
            per_k[k].append(mean(intervals))
        for e in saves:
            if first <= e.step <= last:
                taken[k][0] += 1
                taken[k][1] += int(e.taken)
    results: dict[str, Any] = {}
    none = median(per_k[0])
    results["snapshot_step_s_none"] = none
    for k in VARIANTS[1:]:
        results[f"snapshot_step_s_k{k}"] = median(per_k[k])
        results[f"snapshot_overhead_pct_k{k}"] = (median(per_k[k]) / none - 1) * 100
        requested, took = taken[k]
        results[f"snapshots_taken_fraction_k{k}"] = took / requested if requested else 0.0
    shapes = jax.eval_shape(program._init, program._key())
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    results["snapshot_state_mb"] = state_bytes / 2**20
    notes.append(
        f"Snapshot cost: lm recipe ({results['snapshot_state_mb']:.1f} MB of state), "
        f"{sizes.snapshot_rounds} rounds of {block}-step blocks per variant, interleaved; "
        "overhead is the mean step interval over the no-snapshot blocks' (median over blocks)."
    )
    return results

