"""What every benchmark shares: sizes per mode, statistics, targets and the results table."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "recoveries",
    "DEVICES",
    "XLA_FLAGS",
    "Sizes",
    "SIZES",
    "TARGETS",
    "ROWS",
    "CLUSTER_RESCHEDULE_S",
    "median",
    "p90",
    "mean",
    "worker_command",
    "worker_env",
    "machine",
    "write_results",
    "table",
]

#: Host CPU devices of the benchmark process: four simulated slices of two.
DEVICES = 8
XLA_FLAGS = f"--xla_force_host_platform_device_count={DEVICES}"
REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much of each benchmark a mode runs."""

    losses: int  # slice losses with precompiling on (issue: at least 10)
    losses_no_precompile: int  # the same without precompiling, for before/after
    losses_small_readahead: int  # the same with a small Grain read-ahead
    restarts: int  # restart-baseline subprocesses
    snapshot_rounds: int  # rounds of (none, k=1, k=5, k=10) blocks
    snapshot_block: int  # steps per block
    preempt_mb: tuple[int, ...]
    preempt_repeats: int
    preempt_idle_s: float  # seconds between the end of one large write and the start of the next
    restore_mb: int
    restore_repeats: int
    goodput_steps: int
    overhead_rounds: int
    overhead_steps: int
    reposition_repeats: int
    first_save_every: int = 40  # steps before each checkpoint in the first-save runs
    losses_file_workers: int = 0  # the same over ArrayRecord files read by 2 Grain workers
    soak_schedules: int = 1000  # chaos schedules the soak runs in one process (issue: at least 1,000)
    plan_schedules: int = 6  # runs per policy and case of the plan validation (issue 42: six seeds)
    plan_stepping_scale: float = 1.0  # times each case's seconds of steps per plan-validation run
    plan_cases: tuple[str, ...] = ("mlp_4x1", "lm_4x2")  # plan_validation.CASES
    plan_des_faults: int = 20000  # faults per discrete-event simulation of the model check
    scaling_slice_counts: tuple[int, ...] = (4, 16, 32, 64, 256)  # recovery_scaling's slice counts
    #: ``lm`` recipe settings over its defaults for snapshot_cost, overhead and first_save
    lm: tuple[tuple[str, object], ...] = ()


SIZES = {
    "full": Sizes(
        losses=12, losses_no_precompile=4, losses_small_readahead=12, restarts=10, snapshot_rounds=4, snapshot_block=40,
        preempt_mb=(64, 256, 1024), preempt_repeats=3, preempt_idle_s=10.0, restore_mb=512, restore_repeats=5,
        goodput_steps=600, overhead_rounds=5, overhead_steps=150, reposition_repeats=30,
        losses_file_workers=6,
    ),
    "quick": Sizes(
        losses=10, losses_no_precompile=2, losses_small_readahead=0, restarts=3, snapshot_rounds=2, snapshot_block=20,
        preempt_mb=(64, 256, 1024), preempt_repeats=1, preempt_idle_s=10.0, restore_mb=256, restore_repeats=3,
        goodput_steps=100, overhead_rounds=2, overhead_steps=40, reposition_repeats=10, first_save_every=20,
        losses_file_workers=3,
        soak_schedules=40,
        plan_schedules=3, plan_des_faults=5000, scaling_slice_counts=(4, 32),
    ),
    # The smoke test's mode: every code path once, no figure worth reading.
    "tiny": Sizes(
        losses=2, losses_no_precompile=0, losses_small_readahead=0, restarts=1, snapshot_rounds=1, snapshot_block=4,
        preempt_mb=(16,), preempt_repeats=1, preempt_idle_s=0.0, restore_mb=16, restore_repeats=1,
        goodput_steps=0, overhead_rounds=1, overhead_steps=15, reposition_repeats=2, first_save_every=3,
        soak_schedules=2,
        lm=(("seq_len", 32), ("d_model", 32), ("heads", 2), ("layers", 1)),  # the quick demo's model
        plan_schedules=1, plan_stepping_scale=0.2, plan_cases=("mlp_4x1",), plan_des_faults=300,
        scaling_slice_counts=(4, 32),
    ),
}

def lm_label(sizes: Sizes) -> str:
    """How the notes name the ``lm`` model a mode runs: ``lm recipe``, with its settings when
    the mode sets any."""
    settings = ", ".join(f"{name}={value}" for name, value in sizes.lm)
    return f"lm recipe ({settings})" if settings else "lm recipe"


#: key: (target text, test of the value, the baseline key or None). A missing value is not met.
TARGETS: dict[str, tuple[str, Any]] = {
    "recovery_speedup": (">= 10x", lambda v: v >= 10),
    "recovery_compiles": ("0", lambda v: v == 0),
    "first_save_over_later": ("<= 2x a later save", lambda v: v <= 2),
    "snapshot_overhead_pct_k1": ("<= 3% (with every snapshot taken)", None),
    "device_snapshot_overhead_pct_k1": ("<= 3% (with every snapshot taken)", None),
    "snapshot_host_memory_ratio": ("<= 1.1", lambda v: v <= 1.1),
    "examples_lost": ("0", lambda v: v == 0),
    "examples_duplicated": ("0", lambda v: v == 0),
    "preempt_over_disk_s_1024MB": ("<= 1 s over the disk's fsync-ed write (30 s grace window)", lambda v: v <= 1),
    "snapshot_restore_bw_over_memcpy": (">= 0.5", lambda v: v >= 0.5),
    "checkpoint_restore_bw_over_memcpy": (">= 0.5", lambda v: v >= 0.5),
    "snapshot_restore_bw_over_host_to_device": (">= 0.9", lambda v: v >= 0.9),
    "checkpoint_restore_bw_over_read_then_copy": (">= 0.9", lambda v: v >= 0.9),
    "goodput_share_of_fault_free": (">= 0.9", lambda v: v >= 0.9),
    "framework_overhead_pct": ("<= 2%", lambda v: v <= 2),
    "host_cpu_ms_per_step_added": ("<= 1 ms", lambda v: v <= 1),
    "reposition_ratio": ("<= 2", lambda v: v <= 2),
    "recovery_scaling_ratio": ("<= 2", lambda v: v <= 2),
    "soak_success_rate": ("100% (MaxText's Snapshotter soak: 73%)", lambda v: v == 100),
    "soak_threads_growth": ("0 more threads at the end", lambda v: v == 0),
    "plan_validation_worst_points": ("<= 5 points", lambda v: v <= 5),
    "plan_model_vs_des_points": ("<= 1 point", lambda v: v <= 1),
    "recovery_scaling_steps_ratio_256": ("<= 4x", lambda v: v <= 4),
}


#: The time a preempted or killed pod takes to be rescheduled on a cluster (minutes; the
#: supervisor here starts the next process at once). The goodput benchmark reports its
#: shares again with each gap between processes this long, derived from the same runs.
CLUSTER_RESCHEDULE_S = 60.0


def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def p90(values: list[float]) -> float:
    """The 90th percentile, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def worker_env(devices: int = DEVICES) -> dict[str, str]:
    """The environment of a worker subprocess: CPU devices, no inherited device count."""
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)
    env["BENCH_DEVICES"] = str(devices)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def worker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.worker", *args]


def machine() -> dict[str, Any]:
    """What ran the benchmarks: CPU model, cores, memory, versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory_gb = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    import jax
    import orbax.checkpoint

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": memory_gb,
        "python": platform.python_version(),
        "jax": jax.__version__,
        "orbax": orbax.checkpoint.__version__,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


# Rows of the table: (metric, value key, baseline key or None, ratio key or None, target key).
ROWS: list[tuple[str, str, str | None, str | None, str | None]] = [
    ("recovery after a slice loss (fsdp), p50 (s)", "recovery_s_p50", "restart_s_p50", "recovery_speedup", "recovery_speedup"),
    ("recovery after a slice loss, p90 (s)", "recovery_s_p90", "restart_s_p50", None, None),
    ("  restart baseline with JAX's persistent compilation cache, warm, p50 (s) (baseline: without)",
     "restart_cached_s_p50", "restart_s_p50", "restart_cached_speedup", None),
    ("  restart baseline, the first with the cache (filling it) (s)", "restart_cold_cache_s", None, None, None),
    ("  detection, p50 (s)", "recovery_detection_s_p50", None, None, None),
    ("  wait for slices, p50 (s)", "recovery_wait_for_slices_s_p50", None, None, None),
    ("  mesh and compile, p50 (s)", "recovery_mesh_and_compile_s_p50", None, None, None),
    ("  restore, p50 (s)", "recovery_restore_s_p50", None, None, None),
    ("  first step after restore, p50 (s)", "recovery_first_step_s_p50", None, None, None),
    ("recovery with a small Grain read-ahead, p50 (s)", "recovery_small_readahead_s_p50", "restart_s_p50", "recovery_small_readahead_speedup", None),
    ("recovery with file data and 2 Grain workers, p50 (s)", "recovery_file_workers_s_p50", "restart_s_p50", "recovery_file_workers_speedup", None),
    ("  2 new Grain workers to the first batch (baseline: their rewind) (s)", "data_workers_start_s", "data_workers_rewind_s", None, None),
    ("  first loss of each slice, p50 (s)", "recovery_first_per_slice_s_p50", "restart_s_p50", None, None),
    ("  XLA compiles from a loss to its first step, all losses (baseline: without precompiling)",
     "recovery_compiles", "recovery_no_precompile_compiles", None, "recovery_compiles"),
    ("first loss of each slice without precompiling, p50 (s)", "recovery_no_precompile_s_p50", "recovery_first_per_slice_s_p50", "recovery_no_precompile_over_precompile", None),
    ("snapshot every step (fsdp): step-time overhead (%)", "snapshot_overhead_pct_k1", None, None, "snapshot_overhead_pct_k1"),
    ("  snapshots taken / requested, k=1", "snapshots_taken_fraction_k1", None, None, None),
    ("snapshot every 5 steps: overhead (%)", "snapshot_overhead_pct_k5", None, None, None),
    ("  snapshots taken / requested, k=5", "snapshots_taken_fraction_k5", None, None, None),
    ("snapshot every 10 steps: overhead (%)", "snapshot_overhead_pct_k10", None, None, None),
    ("  snapshots taken / requested, k=10", "snapshots_taken_fraction_k10", None, None, None),
    ("snapshot host memory per device / (state bytes / devices per slice), fsdp (baseline: replicated)",
     "snapshot_host_memory_ratio", "snapshot_host_memory_ratio_replicated", None, "snapshot_host_memory_ratio"),
    ("steps recomputed per failure", "steps_recomputed", None, None, None),
    ("examples lost", "examples_lost", None, None, "examples_lost"),
    ("examples duplicated", "examples_duplicated", None, None, "examples_duplicated"),
    ("checkpoint save to gs:// on a local server (GiB/s; baseline: local disk)", "checkpoint_save_gcs_gib_s", "checkpoint_save_disk_gib_s", "checkpoint_save_gcs_over_disk", None),
    ("checkpoint restore from gs:// on a local server (GiB/s; baseline: local disk)", "checkpoint_restore_gcs_gib_s", "checkpoint_restore_disk_gib_s", "checkpoint_restore_gcs_over_disk", None),
    ("preemption save, 64 MB (s)", "preempt_save_s_64MB", None, None, None),
    ("preemption save, 256 MB (s)", "preempt_save_s_256MB", None, None, None),
    ("preemption save, 1 GB (s) (baseline: the disk's fsync-ed write of the same bytes)", "preempt_save_s_1024MB",
     "disk_write_s_1024MB", None, None),
    ("  SIGTERM to exit 143 less the disk's fsync-ed write, 1 GB (s)", "preempt_over_disk_s_1024MB", None, None,
     "preempt_over_disk_s_1024MB"),
    ("  the same, the fastest preemption less the fastest write of the repeats (s)",
     "preempt_over_disk_s_1024MB_fastest", None, None, None),
    ("checkpoint save bandwidth / disk write bandwidth", "save_bw_over_disk", None, None, None),
    ("snapshot restore bandwidth / memcpy", "snapshot_restore_bw_over_memcpy", None, None, "snapshot_restore_bw_over_memcpy"),
    ("  snapshot restore bandwidth / a memcpy into a fresh buffer", "snapshot_restore_bw_over_fresh_memcpy", None, None, None),
    ("  snapshot restore bandwidth / XLA's pinned_host-to-device copy of the same bytes", "snapshot_restore_bw_over_host_to_device", None, None,
     "snapshot_restore_bw_over_host_to_device"),
    ("  XLA's pinned_host-to-device copy / memcpy", "host_to_device_bw_over_memcpy", None, None, None),
    ("checkpoint restore bandwidth / memcpy", "checkpoint_restore_bw_over_memcpy", None, None, "checkpoint_restore_bw_over_memcpy"),
    ("  checkpoint restore bandwidth / a memcpy into a fresh buffer", "checkpoint_restore_bw_over_fresh_memcpy", None, None, None),
    ("  checkpoint restore bandwidth / Orbax's read of the same checkpoint as numpy", "checkpoint_restore_bw_over_numpy_read", None, None, None),
    ("  checkpoint restore bandwidth / that read then one host-to-device copy of the same bytes",
     "checkpoint_restore_bw_over_read_then_copy", None, None, "checkpoint_restore_bw_over_read_then_copy"),
    ("goodput under the fault schedule / without faults", "goodput_share_of_fault_free",
     "goodput_restart_baseline_share_of_fault_free", "goodput_share_over_restart_baseline",
     "goodput_share_of_fault_free"),
    ("  goodput under the fault schedule", "goodput", "goodput_restart_baseline", "goodput_ratio", None),
    ("  goodput without faults, same steps", "goodput_fault_free", "goodput_restart_baseline_fault_free", None, None),
    ("  time between processes, faulted run (s)", "goodput_between_processes_s",
     "goodput_restart_baseline_between_processes_s", None, None),
    (f"  the same share with a {CLUSTER_RESCHEDULE_S:.0f} s reschedule per restart (derived)",
     "goodput_share_of_fault_free_rescheduled", "goodput_restart_baseline_share_of_fault_free_rescheduled",
     None, None),
    ("framework overhead vs a bare jitted loop, same fsdp shardings and lagged read (%)", "framework_overhead_pct",
     None, None, "framework_overhead_pct"),
    ("host CPU time elastic_dew adds per step, loop thread + its own threads, p50 (ms)",
     "host_cpu_ms_per_step_added", None, None, "host_cpu_ms_per_step_added"),
    ("  host CPU per step: Trainer.fit (baseline: the bare loop), p50 (ms)", "host_cpu_ms_per_step_trainer",
     "host_cpu_ms_per_step_bare", None, None),
    ("  of which elastic_dew's own threads, p50 (ms)", "host_cpu_ms_per_step_own_threads", None, None, None),
    ("data reposition, step 1,000,000 / step 10", "reposition_ratio", None, None, "reposition_ratio"),
    ("recovery after one loss, 32 slices / 4 slices, warm p50 (s)", "recovery_scaling_s_p50_32",
     "recovery_scaling_s_p50_4", "recovery_scaling_ratio", "recovery_scaling_ratio"),
    ("  the same in steady step times (recovery / median step)", "recovery_scaling_steps_p50_32",
     "recovery_scaling_steps_p50_4", "recovery_scaling_ratio_in_steps", None),
    ("recovery after one loss, 256 slices / 4 slices, warm p50 (s)", "recovery_scaling_s_p50_256",
     "recovery_scaling_s_p50_4", "recovery_scaling_s_ratio_256", None),
    ("  the same in steady step times (recovery / median step)", "recovery_scaling_steps_p50_256",
     "recovery_scaling_steps_p50_4", "recovery_scaling_steps_ratio_256", "recovery_scaling_steps_ratio_256"),
    ("  16 slices: recovery, warm p50 (s) (baseline: in steps)", "recovery_scaling_s_p50_16",
     "recovery_scaling_steps_p50_16", None, None),
    ("  64 slices: recovery, warm p50 (s) (baseline: in steps)", "recovery_scaling_s_p50_64",
     "recovery_scaling_steps_p50_64", None, None),
    ("  fitted growth of recovery with slices, exponent (seconds; baseline: steps)", "recovery_scaling_growth_s",
     "recovery_scaling_growth_steps", None, None),
    ("  fitted growth of the steady step with slices, exponent", "recovery_scaling_growth_step_s", None, None, None),
    ("scale-up after a return, 256 slices (s) (baseline: 4 slices)", "recovery_scaling_scale_up_s_p50_256",
     "recovery_scaling_scale_up_s_p50_4", None, None),
    ("  the same in steady step times (baseline: 4 slices)", "recovery_scaling_scale_up_steps_p50_256",
     "recovery_scaling_scale_up_steps_p50_4", None, None),
    ("  fitted growth of the scale-up with slices, exponent (seconds)", "recovery_scaling_growth_scale_up_s",
     None, None, None),
    ("  wait for slices, 32 slices (baseline: 4), warm p50 (s)", "recovery_scaling_wait_for_slices_s_p50_32",
     "recovery_scaling_wait_for_slices_s_p50_4", None, None),
    ("chaos soak: schedules keeping every invariant, one process (%)", "soak_success_rate", None, None,
     "soak_success_rate"),
    ("  schedules run", "soak_schedules", None, None, None),
    ("  steps re-run per fault fired", "soak_steps_rerun_per_fault", None, None, None),
    ("  threads at the end (baseline: at the start)", "soak_threads_end", "soak_threads_start", None,
     "soak_threads_growth"),
    ("  resident memory at the end (baseline: at the start) (MB)", "soak_rss_mb_end", "soak_rss_mb_start", None, None),
    ("  time per schedule (s)", "soak_s_per_schedule", None, None, None),
    ("plan: the model against real runs, worst gap of mean measured goodput from predicted (points)",
     "plan_validation_worst_points", None, None, "plan_validation_worst_points"),
    *[(f"  {policy.replace('_', '-')}, {case}: measured mean goodput (baseline: predicted)",
       f"plan_{policy}_{case}_measured", f"plan_{policy}_{case}_predicted", None, None)
      for case in ("mlp_4x1", "mlp_8x1", "lm_4x2") for policy in ("restart", "pause_resume", "replica_resize")],
    ("plan: the model against its discrete-event simulation, 1-10,000 slices, worst gap (points)",
     "plan_model_vs_des_points", None, None, "plan_model_vs_des_points"),
    ("first checkpoint save of a process (s)", "first_save_s", "first_save_unprepared_s", "first_save_over_later", "first_save_over_later"),
    ("  later checkpoint saves, p50 (s)", "later_save_prepared_s_p50", "later_save_unprepared_s_p50", None, None),
]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    return str(value)


#: The snapshot-overhead targets, each with the fraction of its snapshots taken: an overhead
#: met by skipping snapshots is not met.
_TAKEN = {
    "snapshot_overhead_pct_k1": "snapshots_taken_fraction_k1",
    "device_snapshot_overhead_pct_k1": "device_snapshots_taken_fraction_k1",
}


def verdicts(results: dict[str, Any]) -> dict[str, bool]:
    """Whether each target is met; the snapshot targets need every snapshot taken."""
    out = {}
    for key, (_, test) in TARGETS.items():
        value = results.get(key)
        if key in _TAKEN:
            taken = results.get(_TAKEN[key])
            out[key] = value is not None and taken is not None and value <= 3 and taken >= 1.0
            continue
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out[key] = False
            continue
        out[key] = bool(test(value))
    return out


def table(results: dict[str, Any], rows: list[tuple] | None = None) -> str:
    """The markdown table of ``rows`` (default :data:`ROWS`): metric, value, baseline, ratio,
    target, met."""
    met = verdicts(results)
    lines = ["| metric | value | baseline | ratio | target | met |", "|---|---|---|---|---|---|"]
    for label, value_key, base_key, ratio_key, target_key in ROWS if rows is None else rows:
        if value_key not in results:
            continue
        target = TARGETS[target_key][0] if target_key else ""
        verdict = ("yes" if met[target_key] else "**no**") if target_key else ""
        lines.append(
            f"| {label} | {_fmt(results.get(value_key))} | "
            f"{_fmt(results.get(base_key)) if base_key else ''} | "
            f"{_fmt(results.get(ratio_key)) if ratio_key else ''} | {target} | {verdict} |"
        )
    return "\n".join(lines)


def write_results(
    out: Path, results: dict[str, Any], notes: list[str], mode: str, *,
    rows: list[tuple] | None = None, title: str = "elastic_dew benchmarks",
) -> None:
    """``results.json`` (every figure) and ``results.md`` (the table of ``rows``, default
    :data:`ROWS`, the misses, the machine)."""
    out.mkdir(parents=True, exist_ok=True)
    met = verdicts(results)
    payload = dict(results)
    payload["targets_met"] = {k: v for k, v in met.items() if k in results}
    (out / "results.json").write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    info = results.get("machine", {})
    missed = [k for k, ok in met.items() if k in results and not ok]
    md = [
        f"# {title} ({mode} mode)",
        "",
        f"Machine: {info.get('cpu')}, {info.get('cores')} cores, {info.get('memory_gb')} GB; "
        f"Python {info.get('python')}, JAX {info.get('jax')}, Orbax {info.get('orbax')}; "
        f"commit {info.get('commit')}, {info.get('date')}. Total {results.get('total_s', 0):.0f} s.",
        "",
        table(results, rows),
        "",
    ]
    if missed:
        md.append("Targets missed: " + ", ".join(f"`{k}`" for k in missed) + ".")
    else:
        md.append("Every target measured here was met.")
    if notes:
        md += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    (out / "results.md").write_text("\n".join(md) + "\n")


def recoveries(losses: list[float], events: list[tuple[float, Any]]) -> list[tuple[float, Any, float]]:
    """For each slice loss at wall time ``t_loss``: ``(t_loss, resume, t_first_step)``, the
    first non-``live`` resume after it and when the first step after that resume completed.

    ``events`` is ``[(monotonic time, typed event)]`` as a benchmark collects them; a loss
    with no resume or no step after it (the run ended first) is left out.
    """
    from elastic_dew.elastic.events import Resume, Step

    out = []
    for t_loss in losses:
        later = [(t, e) for t, e in events if t >= t_loss]
        resume = next(((t, e) for t, e in later if isinstance(e, Resume) and e.source != "live"), None)
        if resume is None:
            continue
        step = next((t for t, e in later if t >= resume[0] and isinstance(e, Step)), None)
        if step is None:
            continue
        out.append((t_loss, resume, step))
    return out
