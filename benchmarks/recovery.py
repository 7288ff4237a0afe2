"""Item 1: recovery after a slice loss, in process, against restarting the whole workload.

The elastic side trains ``lm`` through :class:`ElasticRun` on four simulated slices of two
devices (replica-resize, a snapshot every step, a checkpoint every 10), with the state laid
out as ``Trainer`` lays it out by default (``fsdp``: large parameters and their moments split
over a slice's ``data`` devices, replicated across slices; after a loss the survivors' copy
is put onto the smaller mesh with its shardings). A listener on the
protocol's ``step`` phase loses a slice (rotating over the slices), gives it back four steps
later, and between losses runs one restart-baseline subprocess (blocking, so A and B
alternate in time and the training is idle while the baseline runs). Recovery is the wall
time from the injected loss to the completion of the first step after the resume, split
into the protocol's durations plus the first step itself.

The baseline (``benchmarks.worker restart``) is a new process that imports, initialises
JAX, compiles and restores the newest committed checkpoint of this very run (copied aside),
timed from ``Popen`` to its first completed step. It does not count a scheduler's pod
restart, which only adds to it.
"""

from __future__ import annotations

import cProfile
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, median, p90, recoveries as recoveries_after, worker_command, worker_env
from benchmarks.work_lost import work_lost
from elastic_dew.elastic.events import DURATION_KEYS, Resume, Step
from elastic_dew.elastic.state.orbax_step import committed_checkpoint_steps
from elastic_dew.record.log import as_event
from elastic_dew.rundir import CHECKPOINTS_DIR

__all__ = ["measure", "restart_once", "file_parts", "worker_start_and_rewind", "POLICY"]

POLICY = "fsdp"  # the restart baseline's Trainer uses its default, which is the same

PERIOD_AFTER_RETURN = 6  # steps between a scale-up and the next loss
#: Grain read-ahead of the variant that shows what the default read-ahead costs a recovery.
SMALL_READAHEAD = (2, 96)


class _Finished(Exception):
    """Raised from the listener to end the run once every loss is measured."""


def _newest_committed(directory: Path) -> Path | None:
    """The newest committed step directory under ``directory`` (rundir's commit rule)."""
    steps = committed_checkpoint_steps(directory)
    return directory / str(steps[-1]) if steps else None


def restart_once(checkpoint: Path, workdir: Path, cache: Path | None = None) -> float:
    """Copy ``checkpoint`` (one step directory) aside and time a restarted process to its first step.

    ``cache``: a directory for JAX's persistent compilation cache in the restarted process
    (``None``: none, every program compiled anew).
    """
    target = workdir / CHECKPOINTS_DIR
    shutil.copytree(checkpoint, target / checkpoint.name)
    log = workdir / "worker.log"
    env = worker_env()
    if cache is not None:
        env["BENCH_COMPILATION_CACHE"] = str(cache)
    with open(log, "w") as err:  # a file, not a pipe: a full pipe would stall the worker
        started = time.monotonic()
        child = subprocess.Popen(
            worker_command("restart", str(target), str(workdir / "run")),
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
        )
    source = None
    for line in child.stdout:
        if line.startswith("RESUME"):
            source = line.split()[1]
        if line.startswith("FIRST_STEP"):
            elapsed = time.monotonic() - started
            break
    else:
        child.wait()
        raise RuntimeError(f"restart baseline exited {child.returncode} before a step: {log.read_text()[-2000:]}")
    child.wait(timeout=60)
    if source != "checkpoint":
        raise RuntimeError(f"restart baseline resumed from {source!r}, not from the checkpoint")
    return elapsed


def file_parts(workdir: Path) -> dict:
    """The ``lm`` recipe over ArrayRecord files of its own corpus (``elastic-dew data prepare``)."""
    from elastic_dew.recipes import lm
    from elastic_dew.recipes.data import corpus
    from elastic_dew.recipes.data.files import prepare

    text = workdir / "corpus.txt"
    workdir.mkdir(parents=True, exist_ok=True)
    text.write_text(corpus(lm.LMConfig.corpus_chars))
    prepare([text], workdir / "data", seq_len=lm.LMConfig.seq_len, shards=4)
    return lm.build(data=str(workdir / "data"))


def _elastic(losses: int, restarts: int, precompile: bool, workdir: Path, read_options: Any = None,
             parts: dict | None = None, workers: int = 0) -> dict[str, Any]:
    import jax

    from benchmarks.worker import lm_parts, lm_program
    from elastic_dew.elastic import hooks
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.loop.compiler import COMPILED_EVENT
    from elastic_dew.elastic.loop.data import ElasticData
    from elastic_dew.elastic.loop.protocol import ElasticRun
    from elastic_dew.simulate import SimulatedSlices

    parts = parts or lm_parts()
    # Trainer.fit builds this same Program; the benchmark drives ElasticRun directly to see
    # the run object (its precompiler) and to inject faults at exact moments.
    program = lm_program(parts, POLICY)
    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, timeout=120, global_batch=48,
        snapshot_every=1, checkpoint_every=10, checkpoint_dir=str(workdir / CHECKPOINTS_DIR),
        precompile_smaller_meshes=precompile,
        max_attempts=None,  # the benchmark loses a slice more often than the guide's 10 attempts allow
    )
    events: list[tuple[float, Any]] = []  # (monotonic time, typed event)
    state = {"losses": [], "restarts": [], "cached": [], "phase": "warmup", "count": 0, "lost": None}
    cache = workdir / "compilation-cache"  # one for every cached restart of this run, as on one machine
    box: dict[str, Any] = {}

    def listener(phase: str, step: int) -> None:
        if phase != "step":
            return
        state["count"] += 1
        run = box["run"]
        if state["phase"] == "warmup":
            if state["count"] < 12:
                return
            worker = run.compiler._precompiler  # the step compiler's background precompile thread
            if worker is not None:
                worker.join()  # a loss hours into a run finds the precompiling long done
            state["count"], state["phase"] = 0, "lose"
        elif state["phase"] == "lose" and state["count"] >= 2:
            if len(state["losses"]) >= losses and len(state["restarts"]) >= restarts:
                raise _Finished
            which = len(state["losses"]) % 4
            t = time.monotonic()
            if box.get("profile") is not None:
                box["profile"].enable()
            box["sim"].lose(which)
            state["losses"].append(t)
            state["lost"], state["count"], state["phase"] = which, 0, "lost"
        elif state["phase"] == "lost" and state["count"] >= 4:
            box["sim"].restore(state["lost"])
            state["count"], state["phase"] = 0, "returning"
        elif state["phase"] == "returning" and run.manager.active_slice_count == run.manager.total_slice_count:
            if state["count"] >= PERIOD_AFTER_RETURN:
                if len(state["restarts"]) < restarts:
                    checkpoint = _newest_committed(workdir / CHECKPOINTS_DIR)
                    if checkpoint is not None:
                        where = Path(tempfile.mkdtemp(dir=workdir, prefix="restart-"))
                        state["restarts"].append(restart_once(checkpoint, where))
                        where = Path(tempfile.mkdtemp(dir=workdir, prefix="restart-cached-"))
                        state["cached"].append(restart_once(checkpoint, where, cache))
                state["count"], state["phase"] = 0, "lose"

    # Every XLA compile of the run, to count those inside a recovery window.
    compiles: list[tuple[float, str, str]] = []  # (monotonic time at its end, thread, program)

    def on_duration(event: str, duration: float, **kwargs: Any) -> None:
        if event == COMPILED_EVENT:
            compiles.append((time.monotonic(), threading.current_thread().name, str(kwargs.get("fun_name", "?"))))

    profile_path = os.environ.get("BENCH_PROFILE_RECOVERY")
    if profile_path and precompile:
        box["profile"] = cProfile.Profile()

    def emit(line) -> None:
        event = as_event(line)
        events.append((time.monotonic(), event))
        if isinstance(event, Resume) and event.source != "live":
            state["resumed"] = True
        if isinstance(event, Step) and state.pop("resumed", False) and box.get("profile") is not None:
            box["profile"].disable()  # the profile covers loss to first step, as recovery does

    hooks.add_listener(listener)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        with SimulatedSlices(4, 2) as sim:
            box["sim"] = sim
            data = ElasticData(parts["dataset"], read_options=read_options, workers=workers)
            run = ElasticRun(program, data, config, emit=emit)
            box["run"] = run
            try:
                run.run(10**6)
            except _Finished:
                pass
    finally:
        hooks.remove_listener(listener)
        jax.monitoring.unregister_event_duration_listener(on_duration)
        if "run" in box:
            box["run"].data.close()  # stops Grain's worker processes
        jax.clear_caches()
        if box.get("profile") is not None:
            box["profile"].dump_stats(profile_path)

    recoveries, parts_by_key = [], {k: [] for k in (*DURATION_KEYS, "first_step")}
    in_windows: list[tuple[str, str]] = []  # (thread, program) of each compile from a loss to its first step
    for t_loss, (t_resume, resume), t_step in recoveries_after(state["losses"], events):
        recoveries.append(t_step - t_loss)
        in_windows += [(thread, name) for t, thread, name in compiles if t_loss <= t <= t_step]
        for k in DURATION_KEYS:
            parts_by_key[k].append(resume.durations[k])
        parts_by_key["first_step"].append(t_step - t_resume)
    return {
        "recoveries": recoveries,
        "parts": parts_by_key,
        "restarts": state["restarts"],
        "cached": state["cached"],
        "events": [e for _, e in events],
        "sources": sorted({e.source for _, e in events if isinstance(e, Resume)}),
        "compiles_in_recoveries": in_windows,
    }


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    on = _elastic(sizes.losses, sizes.restarts, True, workdir / "precompile")
    r = on["recoveries"]
    results["recovery_losses"] = len(r)
    results["recovery_s_p50"] = median(r)
    results["recovery_s_p90"] = p90(r)
    for k, values in on["parts"].items():
        results[f"recovery_{k}_s_p50"] = median(values)
        results[f"recovery_{k}_s_p90"] = p90(values)
    results["recovery_s_all"] = [round(x, 4) for x in r]
    # Each slice's first loss is the first run of that mesh's executable; later ones are warm.
    results["recovery_first_per_slice_s_p50"] = median(r[:4])
    results["recovery_compiles"] = len(on["compiles_in_recoveries"])
    results["recovery_compiled_programs"] = sorted({f"{t}: {n}" for t, n in on["compiles_in_recoveries"]})
    results["restart_s_p50"] = median(on["restarts"])
    results["restart_s_p90"] = p90(on["restarts"])
    results["restart_s_all"] = [round(x, 3) for x in on["restarts"]]
    results["recovery_speedup"] = results["restart_s_p50"] / results["recovery_s_p50"]
    # The first cached restart fills the cache; the later ones load from it.
    results["restart_cold_cache_s"] = on["cached"][0] if on["cached"] else float("nan")
    results["restart_cached_s_p50"] = median(on["cached"][1:]) if len(on["cached"]) > 1 else float("nan")
    results["restart_cached_s_all"] = [round(x, 3) for x in on["cached"]]
    results["restart_cached_speedup"] = results["restart_s_p50"] / results["restart_cached_s_p50"]
    lost = work_lost(on["events"])
    results["steps_recomputed"] = lost["steps_recomputed_total"] / max(1, lost["failures"])
    results["examples_lost"] = lost["examples_lost"]
    results["examples_duplicated"] = lost["examples_duplicated"]
    if sizes.losses_no_precompile:
        off = _elastic(sizes.losses_no_precompile, 0, False, workdir / "no-precompile")
        results["recovery_no_precompile_s_p50"] = median(off["recoveries"])
        results["recovery_no_precompile_s_all"] = [round(x, 4) for x in off["recoveries"]]
        results["recovery_no_precompile_mesh_and_compile_s_p50"] = median(off["parts"]["mesh_and_compile"])
        results["recovery_no_precompile_compiles"] = len(off["compiles_in_recoveries"])
        results["recovery_no_precompile_over_precompile"] = (
            results["recovery_no_precompile_s_p50"] / results["recovery_first_per_slice_s_p50"]
        )
        notes.append(
            "Precompiling, before and after: without it every loss here is the first loss of its "
            "slice and compiles that mesh's step; it is compared with the first loss of each "
            "slice in the precompiling run (the first run of an executable costs more than later runs)."
        )
    if sizes.losses_small_readahead:
        import grain

        options = grain.ReadOptions(num_threads=SMALL_READAHEAD[0], prefetch_buffer_size=SMALL_READAHEAD[1])
        small = _elastic(sizes.losses_small_readahead, 0, True, workdir / "small-readahead", options)
        results["recovery_small_readahead_s_p50"] = median(small["recoveries"])
        results["recovery_small_readahead_first_step_s_p50"] = median(small["parts"]["first_step"])
        results["recovery_small_readahead_speedup"] = results["restart_s_p50"] / results["recovery_small_readahead_s_p50"]
        notes.append(
            "The first step after a resume waits for Grain to refill its read-ahead, under the "
            "GIL. ElasticData's default read-ahead is two batches on at most as many threads as "
            "cores (elastic_dew.elastic.loop.data.default_read_options; Grain's own default of 16 "
            "threads and 500 examples made this step the largest part of recovery); with "
            f"ReadOptions(num_threads={SMALL_READAHEAD[0]}, prefetch_buffer_size={SMALL_READAHEAD[1]}) "
            f"recovery is {results['recovery_small_readahead_s_p50']:.2f} s (p50 of "
            f"{len(small['recoveries'])}), first step "
            f"{results['recovery_small_readahead_first_step_s_p50']:.2f} s."
        )
    if sizes.losses_file_workers:
        files = _elastic(sizes.losses_file_workers, 0, True, workdir / "file-workers",
                         parts=file_parts(workdir / "files"), workers=2)
        results["recovery_file_workers_s_p50"] = median(files["recoveries"])
        results["recovery_file_workers_first_step_s_p50"] = median(files["parts"]["first_step"])
        results["recovery_file_workers_speedup"] = results["restart_s_p50"] / results["recovery_file_workers_s_p50"]
        results["data_workers_start_s"], results["data_workers_rewind_s"] = worker_start_and_rewind(workdir / "files")
        notes.append(
            "Recovery with file data: the lm recipe over ArrayRecord shards of its corpus "
            "(elastic-dew data prepare, 4 shards) read by 2 Grain worker processes "
            f"(--set data_workers=2), {len(files['recoveries'])} losses: p50 "
            f"{results['recovery_file_workers_s_p50']:.2f} s, first step "
            f"{results['recovery_file_workers_first_step_s_p50']:.2f} s. Under the constant batch "
            "policy every resume rewinds the running workers (ElasticData keeps them); starting "
            f"two new workers to the first batch takes {results['data_workers_start_s']:.2f} s on "
            f"this machine, the rewind {results['data_workers_rewind_s'] * 1000:.1f} ms."
        )
    notes.append(
        f"Recovery: {len(r)} slice losses on 4 simulated slices x 2 CPU devices, lm recipe under {POLICY}, "
        "replica-resize, snapshot every step, poll_interval 0.05 s; the restart baseline is a "
        f"real subprocess timed from Popen to its first step ({len(on['restarts'])} runs, "
        "interleaved with the losses); a scheduler's pod restart would only add to it. Each restart "
        "is followed by the same restart with JAX's persistent compilation cache on (one cache "
        "directory for the run: the first such restart fills it, the later ones load from it; "
        "restart_cached_s_p50 is the p50 of those later ones). recovery_compiles counts the XLA "
        "compiles (JAX's backend_compile_duration event, any thread) that ended between a loss and "
        "the first step after its resume; loading a program compiled for another mesh of the same "
        "shape is not a compile."
    )
    return results


def worker_start_and_rewind(files: Path) -> tuple[float, float]:
    """Seconds to the first batch through 2 new Grain workers, and to the first batch after a rewind."""
    from elastic_dew.elastic.loop.data import ElasticData
    from elastic_dew.recipes.data.files import load

    dataset, _ = load(files / "data")
    data = ElasticData(dataset, workers=2)
    try:
        t = time.perf_counter()
        data.start(48)
        data.next()
        start = time.perf_counter() - t
        saved = data.get_state()
        for _ in range(3):
            data.next()
        t = time.perf_counter()
        data.start(48, saved)
        data.next()
        return start, time.perf_counter() - t
    finally:
        data.close()

