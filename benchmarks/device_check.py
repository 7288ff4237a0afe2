"""``python -m benchmarks.device_check [--tiny] [--out DIR]``: the state tiers on the accelerator this process finds.

Every other benchmark runs on simulated CPU devices, where a snapshot's copy to
``pinned_host`` memory is a memcpy that competes with the step for the cores. On a TPU or a
GPU that copy is a DMA that overlaps the next step: the premise of tier 1. This script is the
check of that premise, prepared to run in a few minutes on a lent or a user's accelerator
(``docs/performance.md`` says how), on one device, the first JAX finds:

1. **versions first**: the installed jax, jaxlib, orbax-checkpoint, pathwaysutils, optax and
   tensorstore against ``pyproject.toml``'s lower bounds, before anything is imported from
   elastic_dew; a missing or older one ends the run at once (exit 2), naming the wheel to carry;
2. **step time with a snapshot every step, every 5 and never**, as ratios, in one run: the
   workload's training step in the protocol's order (``ElasticRun``'s loop: step N+1 is
   dispatched before step N is read; a save waits for the step in flight, off its clock,
   then offers step N's state), each completed step offered to elastic_dew's own
   :class:`~elastic_dew.elastic.state.tiers.Tiers` (tier 1: :class:`Snapshots` over Orbax's
   ``Snapshotter``, to ``pinned_host``). Blocks of steps switch the cadence (never, 1, 5, in
   rounds); a block's figure is its mean step interval (read to read) without its last
   interval, which holds the join before the next block; each cadence's figure is the median
   over its blocks, and the fraction of its snapshots Orbax took is beside it;
3. **snapshot restore bandwidth**: ``Snapshots.load`` of the newest snapshot onto the device
   (the state's bytes over its wall time), against the device's own copy of the same bytes
   from ``pinned_host`` to device memory (``jax.device_put`` between the memory kinds);
4. **checkpoint save and restore to local disk** (tier 2, :class:`Checkpoints` over Orbax's
   ``CheckpointManager``), against the disk's own write (a file of the same size, written and
   ``fsync``-ed: TensorStore syncs what it writes) and read (that file read back). Before
   every timed read, the kernel is asked to drop the file's cached pages
   (``posix_fadvise(DONTNEED)``, no root needed), the checkpoint's as well as the probe's,
   so both reads come from the disk where the kernel honours it;
5. **the first checkpoint save of the process against later ones**: the loop's hold (from
   ``save`` to its return, the state on the host) and the time to the commit, each first
   over the median of the later ones. ``Tiers.precompile_saves`` ran on the state first, as the
   protocol runs it at every resume.

Each part runs on its own: one that fails (the Snapshotter splits replicas with
pathwaysutils' ``split_by_mesh_axis``, a jaxlib operation the project has never run on a
GPU) is named, with its error, in ``results.json``'s ``failures``, and the rest go on.

**Workload** (full mode): the ``lm`` recipe's model (:mod:`elastic_dew.recipes.lm`: a decoder-only
transformer in plain JAX) with ``d_model=2048``, ``layers=8``, ``heads=16``,
``seq_len=1024``, computing in bfloat16 with float32 master weights, trained by the recipe's
AdamW on batches of 32 random token windows: 405 M parameters, 4.5 GiB of state (parameters
and both moments), about 86 TFLOP a step. ``--tiny`` is the same code on a model of a few
thousand parameters, on CPU, for the test suite: every path once, no figure worth reading.

Writes ``results.json`` (every figure, the versions, the device, the failures) and
``results.md`` (the table) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Workload", "WORKLOADS", "ROWS", "PACKAGES", "versions", "measure", "main"]

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Workload:
    """The model and how much of each part a mode runs."""

    #: :class:`elastic_dew.recipes.lm.LMConfig` settings of the model.
    lm: tuple[tuple[str, object], ...]
    batch: int
    rounds: int  # rounds of (never, 1, 5) blocks
    block: int  # steps per block, a multiple of 5
    warmup: int  # steps before the first block (the first compiles)
    restore_repeats: int  # alternating snapshot loads and host-to-device copies
    later_saves: int  # checkpoint saves after the first one


WORKLOADS = {
    "full": Workload(
        lm=(("d_model", 2048), ("layers", 8), ("heads", 16), ("seq_len", 1024), ("compute_dtype", "bfloat16")),
        batch=32, rounds=3, block=10, warmup=10, restore_repeats=3, later_saves=2,
    ),
    # The suite's mode: every code path once, on CPU.
    "tiny": Workload(
        lm=(("d_model", 16), ("layers", 1), ("heads", 2), ("seq_len", 16)),
        batch=2, rounds=1, block=5, warmup=5, restore_repeats=1, later_saves=1,
    ),
}

#: The cadences of the step-time part: never, every step, every 5 steps.
CADENCES = (0, 1, 5)

#: The distributions the check needs, with the import that proves each is usable.
PACKAGES = {
    "jax": "jax",
    "jaxlib": "jaxlib",
    "orbax-checkpoint": "orbax.checkpoint",
    "pathwaysutils": "pathwaysutils.experimental.split_by_mesh_axis",
    "optax": "optax",
    "tensorstore": "tensorstore",
    "numpy": "numpy",
    "pyyaml": "yaml",
}

# Rows of the table: (metric, value key, baseline key or None, ratio key or None, target key).
ROWS: list[tuple[str, str, str | None, str | None, str | None]] = [
    ("step time, no snapshots (s)", "device_step_s_none", None, None, None),
    ("snapshot every step: step-time overhead (%)", "device_snapshot_overhead_pct_k1", None, None,
     "device_snapshot_overhead_pct_k1"),
    ("  step time with a snapshot every step / without", "device_step_ratio_k1", None, None, None),
    ("  snapshots taken / requested, every step", "device_snapshots_taken_fraction_k1", None, None, None),
    ("  the snapshot save's hold on the loop, p50 (s)", "device_snapshot_save_s_p50", None, None, None),
    ("snapshot every 5 steps: step-time overhead (%)", "device_snapshot_overhead_pct_k5", None, None, None),
    ("  step time with a snapshot every 5 steps / without", "device_step_ratio_k5", None, None, None),
    ("  snapshots taken / requested, every 5 steps", "device_snapshots_taken_fraction_k5", None, None, None),
    ("snapshot restore (GiB/s; baseline: the device's pinned_host-to-device copy)", "device_snapshot_restore_gib_s",
     "device_host_to_device_gib_s", "device_snapshot_restore_bw_over_host_to_device", None),
    ("checkpoint save to local disk, to the commit (GiB/s; baseline: the disk's fsync-ed write)",
     "device_checkpoint_save_gib_s", "device_disk_write_gib_s", "device_checkpoint_save_bw_over_disk", None),
    ("checkpoint restore from local disk (GiB/s; baseline: the disk's read)", "device_checkpoint_restore_gib_s",
     "device_disk_read_gib_s", "device_checkpoint_restore_bw_over_disk", None),
    ("first checkpoint save of the process, hold (s; baseline: later saves, p50)", "device_first_save_hold_s",
     "device_later_save_hold_s_p50", "device_first_save_hold_over_later", None),
    ("  the same to the commit (s)", "device_first_save_commit_s", "device_later_save_commit_s_p50",
     "device_first_save_commit_over_later", None),
    ("Tiers.precompile_saves on the state (s)", "device_prepare_s", None, None, None),
]


def _median(values: list[float]) -> float:
    from benchmarks.common import median

    return median(values)


def _release(version: str) -> tuple[int, ...]:
    """``"0.12.8"`` as ``(0, 12, 8)``: the numeric release, enough to compare against a
    lower bound (no dependency on ``packaging``, which the accelerator may lack)."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


def _lower_bounds() -> dict[str, str]:
    """``pyproject.toml``'s ``>=`` bounds by distribution name (requirements with a marker left out)."""
    import tomllib

    bounds = {}
    for line in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        found = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9.]*)\s*", line)
        if found:
            bounds[found.group(1).lower()] = found.group(2)
    return bounds


def versions() -> tuple[dict[str, str | None], list[str]]:
    """The installed version of each of :data:`PACKAGES` (``None`` when missing) and what
    keeps the check from running: a missing package, one below ``pyproject.toml``'s lower
    bound, or one that does not import (a dependency of it missing, named by the error).
    Imports nothing of elastic_dew."""
    found: dict[str, str | None] = {}
    problems = []
    bounds = _lower_bounds()
    for name, module in PACKAGES.items():
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
            problems.append(f"{name} is not installed: carry its wheel (pip download --no-deps {name}"
                            f"{'>=' + bounds[name] if name in bounds else ''})")
            continue
        if name in bounds and _release(found[name]) < _release(bounds[name]):
            problems.append(f"{name} {found[name]} is older than the {bounds[name]} elastic_dew needs: "
                            f"carry its wheel (pip download --no-deps {name}=={bounds[name]})")
            continue
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 - named, with the error, and the run ends
            problems.append(f"{name} {found[name]} does not import ({module}): {type(error).__name__}: {error}; "
                            "carry the wheel that provides what it names")
    return found, problems


def device_info() -> dict[str, Any]:
    """The device the check runs on: platform, kind, memory, and the driver where it can be read."""
    import jax

    device = jax.devices()[0]
    info: dict[str, Any] = {
        "platform": device.platform,
        "kind": device.device_kind,
        "devices": jax.device_count(),
        "platform_version": getattr(device.client, "platform_version", None),
    }
    try:
        stats = device.memory_stats() or {}
        info["memory_gib"] = round(stats["bytes_limit"] / 2**30, 1) if "bytes_limit" in stats else None
    except Exception:  # noqa: BLE001 - not every backend reports memory
        info["memory_gib"] = None
    if device.platform == "gpu" and shutil.which("nvidia-smi"):
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader", "-i", "0"],
                capture_output=True, text=True, timeout=20,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as error:
            info["driver"] = f"nvidia-smi failed: {error}"
    return info


def _drop_cached_pages(path: Path) -> None:
    """Ask the kernel to drop the page cache of ``path`` (a file, or every file under a
    directory), so the next read comes from the disk. Best effort: a no-op where
    ``posix_fadvise`` is missing."""
    if not hasattr(os, "posix_fadvise"):
        return
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _disk_read_seconds(path: Path) -> float:
    """Read ``path`` whole, after dropping its cached pages."""
    _drop_cached_pages(path)
    buffer = bytearray(64 * 2**20)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass
    return time.perf_counter() - started


class _Model:
    """The workload: the ``lm`` recipe's model and optimizer, one jitted training step, on
    a one-device mesh with elastic_dew's axes."""

    def __init__(self, workload: Workload) -> None:
        import jax
        import numpy as np
        import optax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from elastic_dew.elastic.slices.mesh import AXES
        from elastic_dew.recipes import lm
        from elastic_dew.recipes.data import VOCABULARY

        self.cfg = lm.LMConfig(**dict(workload.lm))
        self.mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), AXES)
        self.sharding = NamedSharding(self.mesh, PartitionSpec())
        optimizer = lm.optimizer(self.cfg)
        cfg, vocab, batch, width = self.cfg, len(VOCABULARY), workload.batch, self.cfg.seq_len + 1

        def init(key):
            params = lm.init_params(key, cfg)
            return {"params": params, "opt": optimizer.init(params)}

        def step(state, key):
            tokens = jax.random.randint(key, (batch, width), 0, vocab)
            loss, grads = jax.value_and_grad(lm.next_token_loss)(state["params"], tokens, cfg)
            updates, opt = optimizer.update(grads, state["opt"], state["params"])
            return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

        self.init = jax.jit(init, out_shardings=self.sharding)
        # No donation: the protocol's step does not donate, since the saves read step N's state
        # after step N+1 is dispatched from it.
        self.step = jax.jit(step, out_shardings=(self.sharding, self.sharding))
        self.key = jax.random.key(0)

    def abstract(self) -> Any:
        import jax

        shapes = jax.eval_shape(self.init, self.key)
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.sharding), shapes)

    def batch_key(self, step: int) -> Any:
        import jax

        return jax.random.fold_in(self.key, step)


def _state_bytes(tree: Any) -> int:
    import jax

    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def _step_times(model: _Model, state: Any, tiers: Any, emitted: list, workload: Workload, results: dict,
                notes: list[str]) -> Any:
    """Part 2 (``emitted``: the list the tiers emit into); returns the last completed state (the
    loop's own, still live)."""
    import jax

    from elastic_dew.elastic.events import Save

    plan = [k for _ in range(workload.rounds) for k in CADENCES]
    last = workload.warmup + len(plan) * workload.block - 1
    read_at: dict[int, float] = {}
    tiers.snapshot_every = 0

    def dispatch(from_state: Any, step: int) -> tuple[int, Any, Any]:
        new_state, loss = model.step(from_state, model.batch_key(step))
        return step, new_state, loss

    current = dispatch(state, 1)
    while True:
        step, step_state, loss = current
        ahead = dispatch(step_state, step + 1) if step < last else None
        if ahead is not None and step + 1 >= workload.warmup and (step + 1 - workload.warmup) % workload.block == 0:
            # The next block's cadence, with nothing in flight: in this step's interval,
            # the one of its block that is not counted.
            tiers.snapshot_every = plan[(step + 1 - workload.warmup) // workload.block]
            tiers.land()
        float(loss)  # the read of step `step`
        read_at[step] = time.perf_counter()
        wait = (lambda s=ahead[1]: jax.block_until_ready(s)) if ahead is not None else None
        tiers.on_step(step, step_state, {"step": step}, model.mesh, wait)
        if ahead is None:
            break
        current = ahead
    tiers.land()
    saves: list[Save] = [e for e in emitted if isinstance(e, Save)]
    per_cadence: dict[int, list[float]] = {k: [] for k in CADENCES}
    taken: dict[int, list[int]] = {k: [0, 0] for k in CADENCES}
    for index, k in enumerate(plan):
        first = workload.warmup + index * workload.block
        counted = range(first, first + workload.block - 1)
        per_cadence[k].append(sum(read_at[s + 1] - read_at[s] for s in counted) / len(counted))
        for save in saves:
            if save.tier == "snapshot" and save.step in counted:
                taken[k][0] += 1
                taken[k][1] += int(save.taken)
    none = _median(per_cadence[0])
    results["device_step_s_none"] = none
    for k in CADENCES[1:]:
        figure = _median(per_cadence[k])
        results[f"device_step_s_k{k}"] = figure
        results[f"device_step_ratio_k{k}"] = figure / none
        results[f"device_snapshot_overhead_pct_k{k}"] = (figure / none - 1) * 100
        requested, took = taken[k]
        results[f"device_snapshots_taken_fraction_k{k}"] = took / requested if requested else 0.0
    every_step = [s.seconds for s in saves if s.tier == "snapshot" and s.taken]
    results["device_snapshot_save_s_p50"] = _median(every_step)
    results["device_step_blocks"] = {str(k): v for k, v in per_cadence.items()}
    landed = tiers.snapshots.latest_step()
    if landed is None:
        notes.append("No snapshot landed in host memory: Orbax's worker logged why (see the output).")
    notes.append(
        f"Step time: {workload.rounds} rounds of {workload.block}-step blocks per cadence (never, 1, 5), "
        f"interleaved, after {workload.warmup - 1} warm-up steps; a block's figure is its mean read-to-read "
        f"interval without its last; the newest snapshot landed is of step {landed}."
    )
    return step_state


def _snapshot_restore(model: _Model, state: Any, tiers: Any, workload: Workload, results: dict, notes: list[str]) -> None:
    """Part 3."""
    import jax

    nbytes = _state_bytes(state)
    pinned = jax.device_put(state, model.sharding.with_memory_kind("pinned_host"))
    jax.block_until_ready(pinned)
    abstract = model.abstract()
    loads, copies = [], []
    for _ in range(workload.restore_repeats):
        started = time.perf_counter()
        loaded, _, _ = tiers.snapshots.load(abstract)
        jax.block_until_ready(loaded)
        loads.append(time.perf_counter() - started)
        del loaded
        started = time.perf_counter()
        moved = jax.device_put(pinned, model.sharding)
        jax.block_until_ready(moved)
        copies.append(time.perf_counter() - started)
        del moved
    del pinned
    load_bw, copy_bw = nbytes / _median(loads) / 2**30, nbytes / _median(copies) / 2**30
    results.update(
        device_snapshot_restore_gib_s=load_bw,
        device_host_to_device_gib_s=copy_bw,
        device_snapshot_restore_bw_over_host_to_device=load_bw / copy_bw,
        device_snapshot_restore_s=loads,
        device_host_to_device_s=copies,
    )
    notes.append(
        f"Snapshot restore: Snapshots.load of the newest snapshot ({nbytes / 2**30:.2f} GiB) onto the device, "
        f"{workload.restore_repeats} times, alternating with jax.device_put of the same state from pinned_host; "
        "medians. A load also re-splits the restored state into a new snapshot (Orbax's reset_snapshot_state)."
    )


def _checkpoint(model: _Model, state: Any, tiers: Any, workload: Workload, workdir: Path, results: dict,
                notes: list[str]) -> None:
    """Parts 4 and 5: the process's first save, later saves, restores, and the disk's own."""
    import jax

    from benchmarks.preemption import disk_write_seconds

    checkpoints = tiers.checkpoints
    nbytes = _state_bytes(state)
    holds, commits = [], []
    for step in range(1, workload.later_saves + 2):
        started = time.perf_counter()
        checkpoints.save(step, state, {"step": step}, force=True)
        holds.append(time.perf_counter() - started)
        checkpoints.wait()
        commits.append(time.perf_counter() - started)
    abstract = model.abstract()
    restores, writes, reads = [], [], []
    probe_dir = workdir / "disk-probe"
    for _ in range(max(1, workload.later_saves)):
        _drop_cached_pages(Path(checkpoints.directory))
        started = time.perf_counter()
        restored, _ = checkpoints.restore(len(holds), abstract)
        jax.block_until_ready(restored)
        restores.append(time.perf_counter() - started)
        del restored
        writes.append(disk_write_seconds(probe_dir, nbytes, keep=True))
        reads.append(_disk_read_seconds(probe_dir / "disk-probe.bin"))
        (probe_dir / "disk-probe.bin").unlink()
    gib = lambda seconds: nbytes / _median(seconds) / 2**30  # noqa: E731
    later_hold, later_commit = _median(holds[1:]), _median(commits[1:])
    results.update(
        device_checkpoint_save_gib_s=gib(commits[1:]),
        device_disk_write_gib_s=gib(writes),
        device_checkpoint_save_bw_over_disk=gib(commits[1:]) / gib(writes),
        device_checkpoint_restore_gib_s=gib(restores),
        device_disk_read_gib_s=gib(reads),
        device_checkpoint_restore_bw_over_disk=gib(restores) / gib(reads),
        device_first_save_hold_s=holds[0],
        device_later_save_hold_s_p50=later_hold,
        device_first_save_hold_over_later=holds[0] / later_hold,
        device_first_save_commit_s=commits[0],
        device_later_save_commit_s_p50=later_commit,
        device_first_save_commit_over_later=commits[0] / later_commit,
        device_checkpoint_save_hold_s=holds,
        device_checkpoint_save_commit_s=commits,
    )
    notes.append(
        f"Checkpoints: {workload.later_saves + 1} saves of the state ({nbytes / 2**30:.2f} GiB) to local disk "
        f"({workdir}), the first the process's; {len(restores)} restores of the last, each after its files' "
        "cached pages were dropped, alternating with a probe file of the same size written (fsync-ed) and read "
        "back (its pages dropped too); medians."
    )


def _part(name: str, call: Callable[[], Any], results: dict) -> Any:
    """Run one part; a failure is recorded under ``failures`` with its error, and ``None`` returned."""
    print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
    started = time.perf_counter()
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - named in the results; the other parts go on
        traceback.print_exc()
        results.setdefault("failures", {})[name] = f"{type(error).__name__}: {error}"
        return None
    finally:
        results.setdefault("part_seconds", {})[name] = round(time.perf_counter() - started, 2)


def measure(mode: str, workdir: Path) -> tuple[dict[str, Any], list[str]]:
    """Run every part in ``mode`` (``full`` or ``tiny``) with scratch files under ``workdir``;
    the results and the notes. Expects :func:`versions` to have found nothing missing."""
    import jax

    from benchmarks.common import lm_label
    from elastic_dew.elastic.state.checkpoints import Checkpoints
    from elastic_dew.elastic.state.snapshots import Snapshots
    from elastic_dew.elastic.state.tiers import Tiers

    workload = WORKLOADS[mode]
    results: dict[str, Any] = {"mode": mode, "device": device_info()}
    notes: list[str] = []
    model = _part("build the model", lambda: _Model(workload), results)
    if model is None:
        return results, notes
    box: dict[str, Any] = {}

    def start() -> None:
        state = model.init(model.key)
        box["state"] = jax.block_until_ready(state)
        results["device_state_gib"] = _state_bytes(state) / 2**30
        tiers = Tiers(Snapshots(replica_axis_index=0), Checkpoints(str(workdir / "checkpoints"), max_to_keep=1),
                      snapshot_every=1, emit=box.setdefault("emitted", []).append)
        box["tiers"] = tiers
        started = time.perf_counter()
        tiers.precompile_saves(state, model.mesh)  # as the protocol does at every resume
        results["device_prepare_s"] = time.perf_counter() - started

    _part("init and Tiers.precompile_saves", start, results)
    tiers = box.get("tiers")
    if tiers is None:
        return results, notes
    try:
        state = _part("step time with snapshots", lambda: _step_times(model, box.pop("state"), tiers, box["emitted"],
                                                                    workload, results, notes), results)
        if state is None:  # the loop failed part-way: start again from a fresh state
            state = jax.block_until_ready(model.init(model.key))
        _part("snapshot restore", lambda: _snapshot_restore(model, state, tiers, workload, results, notes), results)
        _part("checkpoint save and restore", lambda: _checkpoint(model, state, tiers, workload, workdir, results,
                                                                  notes), results)
    finally:
        tiers.owns_checkpoints = True
        tiers.close()
    cfg = model.cfg
    results["workload"] = (
        f"{lm_label(workload)}, batch {workload.batch}, "
        f"{results.get('device_state_gib', float('nan')):.2f} GiB of state"
    )
    notes.insert(0, f"Workload: {results['workload']} (seq_len {cfg.seq_len}, {cfg.compute_dtype} compute, "
                    "float32 master weights, the recipe's AdamW), on one device.")
    step_s = results.get("device_step_s_none")
    if mode == "full" and step_s is not None and step_s < 0.1:
        notes.append(f"The step took {step_s * 1e3:.0f} ms, under the 100 ms the check asks of its workload: "
                     "the snapshot's overhead is over-stated against a real step.")
    return results, notes


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a model of a few thousand parameters (the suite's mode)")
    parser.add_argument("--out", default="device-check", help="where results.json and results.md go")
    parser.add_argument("--workdir", default=None,
                        help="where the checkpoints and the disk probe are written (default: a temporary directory)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    mode = "tiny" if args.tiny else "full"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    found, problems = versions()
    print("versions: " + ", ".join(f"{name} {version}" for name, version in found.items()), flush=True)
    if problems:
        print("cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        (out / "results.json").write_text(json.dumps({"mode": mode, "versions": found, "problems": problems},
                                                     indent=2) + "\n")
        return 2
    if args.tiny:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from benchmarks.common import machine, write_results

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="elastic-dew-device-check-", dir=args.workdir) as scratch:
        results, notes = measure(mode, Path(scratch))
    results.update(machine=machine(), versions=found, total_s=time.monotonic() - started)
    device = results["device"]
    notes.insert(0, f"Device: {device.get('kind')} ({device.get('platform')}, {device.get('devices')} found, "
                    f"{device.get('memory_gib')} GiB usable), {device.get('platform_version')}; "
                    f"driver: {device.get('driver', 'n/a')}.")
    for name, error in results.get("failures", {}).items():
        notes.append(f"FAILED: {name}: {error}")
    write_results(out, results, notes, mode, rows=ROWS, title="elastic_dew device check")
    print((out / "results.md").read_text())
    return 1 if results.get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
