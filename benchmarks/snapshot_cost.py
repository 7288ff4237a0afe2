"""Item 2: what staying ready costs: step time with a snapshot every k steps, on ``lm``.

The state is laid out as ``Trainer`` lays it out by default (issue 11): ``fsdp``, each large
parameter and its moments split over a slice's two ``data`` devices, replicated across the
four slices. One :class:`ElasticRun` on four simulated slices switches ``snapshot_every`` between blocks
of steps (none, 1, 5, 10, in rounds, so the variants alternate in time). A block's cost is
its mean step interval (the snapshot's cost lands on one step in k, so a median would hide
it); each variant's figure is the median over its blocks. Orbax's ``Snapshotter.save``
skips a request while the previous one is still queued, so each variant also reports the
fraction of requested snapshots that were taken: a low overhead with skipped snapshots
does not meet the target.

Host memory: the pinned-host bytes the newest snapshot holds on its fullest device
(:meth:`Snapshots.host_bytes_per_device_max`, from the snapshot's own arrays) over
``state_bytes / devices_per_slice``, the share of one copy per slice (issue 11: <= 1.1).
The same figure under ``replicated`` is measured beside it on one snapshot of that layout.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from benchmarks.common import lm_label, mean, median

__all__ = ["measure", "host_memory_ratio", "VARIANTS", "POLICY", "DEVICES_PER_SLICE"]

VARIANTS = (0, 1, 5, 10)
POLICY = "fsdp"
DEVICES_PER_SLICE = 2
WARMUP = 10
SKIP = 2  # intervals at the start of a block not counted


class _Finished(Exception):
    pass


def host_memory_ratio(program, policy_name: str) -> tuple[float, int, int]:
    """One snapshot of ``program``'s fresh state on 4x2 simulated slices: ``(host bytes on
    the fullest device over state bytes / devices per slice, host bytes, state bytes)``."""
    import jax

    from elastic_dew.elastic.slices.sharding import state_bytes
    from elastic_dew.elastic.slices.mesh import mesh_of
    from elastic_dew.elastic.state.snapshots import Snapshots

    mesh = mesh_of(jax.devices()[: 4 * DEVICES_PER_SLICE], 4)
    state = program.init_state(mesh)
    snapshots = Snapshots(replica_axis_index=0)
    if not snapshots.save(1, state, {"step": 1}, mesh):
        raise RuntimeError(f"the {policy_name} snapshot was not taken")
    snapshots.join()
    host = snapshots.host_bytes_per_device_max()
    total = state_bytes(state)
    snapshots.close()
    return host / (total / DEVICES_PER_SLICE), host, total


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    import jax

    from benchmarks.worker import lm_parts, lm_program
    from elastic_dew.elastic import hooks
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.loop.data import ElasticData
    from elastic_dew.elastic.events import Save, Step
    from elastic_dew.elastic.loop.protocol import ElasticRun
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.record.log import as_event

    parts = lm_parts(sizes.lm)
    program = lm_program(parts, POLICY)
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
            box["run"].tiers.snapshot_every = k  # the snapshot cadence from this step on
            box["run"].snapshots.join()  # a block starts with nothing in flight
            blocks.append((k, step, step + block - 1))

    hooks.add_listener(listener)
    try:
        with SimulatedSlices(4, DEVICES_PER_SLICE):
            run = ElasticRun(
                program, ElasticData(parts["dataset"]), dataclasses.replace(base, snapshot_every=0),
                emit=lambda e: events.append((time.monotonic(), e)),
            )
            from elastic_dew.elastic.state.snapshots import Snapshots

            run.tiers.snapshots = Snapshots(replica_axis_index=0)
            box["run"] = run
            try:
                run.run(10**6)
            except _Finished:
                pass
            box["host_bytes"] = run.snapshots.host_bytes_per_device_max()
            replicated = lm_program(parts, "replicated")
            box["replicated"] = host_memory_ratio(replicated, "replicated")
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
    shapes = program.shapes()
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))
    results["snapshot_state_mb"] = state_bytes / 2**20
    results["snapshot_host_bytes_per_device"] = box["host_bytes"]
    results["snapshot_host_memory_ratio"] = box["host_bytes"] / (state_bytes / DEVICES_PER_SLICE)
    ratio, host, _ = box["replicated"]
    results["snapshot_host_memory_ratio_replicated"] = ratio
    results["snapshot_host_bytes_per_device_replicated"] = host
    notes.append(
        f"Snapshot cost: {lm_label(sizes)}, {results['snapshot_state_mb']:.1f} MB of state, under {POLICY}, "
        f"{sizes.snapshot_rounds} rounds of {block}-step blocks per variant, interleaved; "
        "overhead is the mean step interval over the no-snapshot blocks' (median over blocks). "
        f"Host memory: the newest snapshot's pinned-host bytes on its fullest device, "
        f"{box['host_bytes']} B, over state bytes / {DEVICES_PER_SLICE} devices per slice "
        f"({state_bytes / DEVICES_PER_SLICE:.0f} B); under replicated the same snapshot holds {host} B."
    )
    return results

