"""The chaos soak: hundreds of random fault schedules in one process, every invariant checked.

Each schedule is :func:`elastic_dew.testing.draw` of a seed from :data:`FIRST_SEED` on, a
range no test runs (the suite runs seeds 0-26; the generator's own tests draw 0-199
without running them): 1-5 faults (slice losses and returns, preemptions as real SIGTERMs)
at random steps and phases of a 10-14 step run on 4 simulated slices of 2 CPU devices,
trained through the real ``Trainer`` with restarts after preemption, then checked by
:func:`elastic_dew.testing.check` against the failure-free run. All of it runs in this one
process, as the simulator's users run their suites, so the soak also measures what the
runs leave behind: threads and resident memory at the start (after a failure-free
reference run, once the process-wide pools of JAX, Orbax and Grain exist) and at the end.

Reported: the share of schedules that kept every invariant (MaxText reports 73 % recovery
success for its Snapshotter soak; the target here is 100 %), each failure's seed, broken
invariants and one-line replay (``python -m elastic_dew.chaos --seed N``), the steps re-run
per fault fired (steps a later resume re-did, by the run record's commit rule, over the
faults the simulator's log says fired), threads and RSS at the start and the end, and the
time taken. Compiled programs are reused across schedules through JAX's persistent
compilation cache in the soak's directory (compiling was most of a schedule's time).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["FIRST_SEED", "soak", "measure"]

#: The first seed of the soak: far above every seed a test runs or draws.
FIRST_SEED = 1_000_000


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak(schedules: int, workdir: Path, *, first_seed: int = FIRST_SEED, progress_every: int = 0) -> dict[str, Any]:
    """Run ``schedules`` seeds from ``first_seed`` in this process; the soak's figures.

    ``progress_every`` > 0 prints a line (seeds done, failures, threads, RSS) that often,
    so a soak cut short still says how far it got.
    """
    if not faulthandler.is_enabled():  # many runs share this process: should one die natively, say where
        faulthandler.enable()
    workdir.mkdir(parents=True, exist_ok=True)
    with _compilation_cache(workdir / "compilation-cache"):
        return _soak(schedules, workdir, first_seed, progress_every)


@contextlib.contextmanager
def _compilation_cache(directory: Path) -> Iterator[None]:
    """JAX's persistent compilation cache in ``directory``, every program kept, while the soak runs.

    The schedules compile the same few programs again and again (one model on the meshes of
    4, 3, 2 and 1 slices): each distinct program is compiled once and loaded from the cache
    after that, as ``elastic-dew train`` keeps a cache for its simulated runs. Programs under
    JAX's one-second threshold are kept too (on CPU every one of them is). The directory is
    the soak's own, so the first schedules compile for real; the process's own cache
    settings are back when the soak ends.
    """
    import jax

    from elastic_dew.runtime import use_compilation_cache

    before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    use_compilation_cache(directory, min_compile_time_s=0)
    try:
        yield
    finally:
        use_compilation_cache(before[0], min_compile_time_s=before[1])


def _soak(schedules: int, workdir: Path, first_seed: int, progress_every: int) -> dict[str, Any]:
    from elastic_dew import record
    from elastic_dew.testing import check, draw, reference, replay_command, run
    from benchmarks.work_lost import work_lost

    reference(draw(first_seed).steps, workdir)  # the warm-up: the process-wide pools start here
    threads_start, rss_start = threading.active_count(), _rss_mb()
    started = time.monotonic()
    failures: list[dict[str, Any]] = []
    rerun = fired = 0
    for number, seed in enumerate(range(first_seed, first_seed + schedules), start=1):
        scenario = draw(seed)
        outcome = run(scenario, workdir / f"seed-{seed}")
        problems = check(outcome, reference(scenario.steps, workdir))
        fired += len(outcome.fault_log.entries())
        try:
            rerun += work_lost(record.read_events(outcome.run_dir))["steps_recomputed_total"]
        except OSError:
            pass  # a run with no record is a failure check() has already named
        if problems:
            failures.append({
                "seed": seed, "schedule": scenario.schedule, "scenario": repr(scenario),
                "problems": problems, "replay": replay_command(seed),
            })
            print(f"  soak seed {seed} FAILED: {scenario.schedule}: {'; '.join(problems)}; "
                  f"replay: {replay_command(seed)}", flush=True)
        shutil.rmtree(outcome.run_dir, ignore_errors=True)
        if progress_every and number % progress_every == 0:
            print(f"  soak {number}/{schedules}: {len(failures)} failed, {threading.active_count()} threads, "
                  f"{_rss_mb():.0f} MB, {time.monotonic() - started:.0f} s", flush=True)
    seconds = time.monotonic() - started
    threads_end, rss_end = threading.active_count(), _rss_mb()
    return {
        "soak_schedules": schedules,
        "soak_first_seed": first_seed,
        "soak_success_rate": 100.0 * (schedules - len(failures)) / schedules,
        "soak_failures": failures,
        "soak_faults_fired": fired,
        "soak_steps_rerun_per_fault": rerun / fired if fired else 0.0,
        "soak_threads_start": threads_start,
        "soak_threads_end": threads_end,
        "soak_threads_growth": threads_end - threads_start,
        "soak_rss_mb_start": rss_start,
        "soak_rss_mb_end": rss_end,
        "soak_rss_mb_per_schedule": (rss_end - rss_start) / schedules,
        "soak_s": seconds,
        "soak_s_per_schedule": seconds / schedules,
    }


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)  # the runs lose slices on purpose: keep their tracebacks out
    try:
        results = soak(sizes.soak_schedules, workdir, progress_every=max(1, sizes.soak_schedules // 20))
    finally:
        root.setLevel(level)
    notes.append(
        f"Soak: {results['soak_schedules']} chaos schedules (seeds {FIRST_SEED}.."
        f"{FIRST_SEED + results['soak_schedules'] - 1}, which no test runs) in one process, each "
        "checked for every invariant of elastic_dew.testing.check; MaxText reports 73% recovery "
        "success for its Snapshotter soak. Threads and RSS are taken after the failure-free "
        f"reference runs and at the end ({results['soak_rss_mb_start']:.0f} -> "
        f"{results['soak_rss_mb_end']:.0f} MB); steps re-run per fault counts the step lines a "
        f"later resume re-did over the {results['soak_faults_fired']} faults fired."
    )
    for failure in results["soak_failures"]:
        notes.append(
            f"Soak failure, seed {failure['seed']} ({failure['schedule']}): "
            f"{'; '.join(failure['problems'])}. Replay: `{failure['replay']}`"
        )
    return results
