"""Issue 12: recovery after one slice loss on 32 simulated slices over recovery on 4.

Recovery should not grow with the slice count. Each slice count runs in its own process
(``python -m benchmarks.recovery_scaling child SLICES LOSSES RUN_DIR``, the device count set
before JAX starts): ``Trainer.fit`` of the ``mlp`` recipe on SLICES simulated slices of one
CPU device, replica-resize (``minimum_slice_count=1``), a snapshot every step, a poll every
0.05 s, a global batch of 8 per slice that scales with the active slices (the same work per
device at either count). A listener on the protocol's ``step`` phase loses the last slice,
gives it back four steps after the resume, and loses it again four steps after the run is
back on every slice. Recovery is the wall time from the loss to the completion of the first
step after the resume that follows it. The first loss compiles the smaller mesh's step
(precompiling is off, so no background compile competes with the measurement); it is
reported apart, and the row is the median of the later, warm losses.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, median, recoveries as recoveries_after, worker_env

__all__ = ["measure", "growth", "SLICE_COUNTS"]

#: (few, many) slice counts of issue 12's ratio; a mode's ``scaling_slice_counts`` are the
#: counts it runs (issue 31: 4, 16, 64 and 256, with 32 for issue 12's row).
SLICE_COUNTS = (4, 32)
#: ``BENCH_PROFILE_SLICES=N`` profiles the loop thread of the N-slice child (cProfile: by
#: cumulative time and the callers of the costliest, to ``profile-N.txt``, and the raw
#: ``profile-N.prof``, beside its run directory).
PROFILE_VARIABLE = "BENCH_PROFILE_SLICES"
PER_SLICE_BATCH = 8
STEPS_AFTER = 4  # steps after a resume (and after the return) before the next fault

class _Finished(Exception):
    """Raised from the listener to end the child's run once every loss is measured."""


def _training_parts(parts: dict) -> dict:
    """A recipe's parts without its evaluation split: the benchmark measures training."""
    return {name: part for name, part in parts.items() if name != "eval_dataset"}


def _child(slices: int, losses: int, run_dir: str) -> int:
    from elastic_dew.runtime import prepare_process

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    prepare_process(xla_flags=f"--xla_force_host_platform_device_count={slices}")

    from elastic_dew import Trainer, TrainConfig
    from elastic_dew.elastic import hooks
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.events import Resume, Step
    from elastic_dew.elastic.slices.retry import make_manager
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.recipes import mlp

    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, timeout=120, max_attempts=None,
        global_batch=PER_SLICE_BATCH * slices, batch_policy="scale_by_active_slices",
        snapshot_every=1, checkpoint_every=0, precompile_smaller_meshes=False,
    )
    lost = slices - 1
    state: dict[str, Any] = {"phase": "warmup", "count": 0, "losses": [], "returns": []}
    events: list[tuple[float, Any]] = []  # (monotonic time, typed event)
    box: dict[str, Any] = {}

    def listener(phase: str, step: int) -> None:
        if phase != "step":
            return
        state["count"] += 1
        manager = box["manager"]
        if state["phase"] == "warmup" and state["count"] >= 10:
            state["phase"], state["count"] = "lose", STEPS_AFTER
        if state["phase"] == "lose" and state["count"] >= STEPS_AFTER:
            if len(state["losses"]) >= losses + 1:  # the cold loss and `losses` warm ones
                raise _Finished
            state["losses"].append(time.monotonic())
            box["sim"].lose(lost)
            state["phase"], state["count"] = "lost", 0
        elif state["phase"] == "lost" and state["count"] >= STEPS_AFTER:
            state["returns"].append(time.monotonic())
            box["sim"].restore(lost)
            state["phase"], state["count"] = "returning", 0
        elif state["phase"] == "returning" and manager.active_slice_count < manager.total_slice_count:
            state["count"] = 0  # counted from the return to every slice
        elif state["phase"] == "returning":
            state["phase"] = "lose"

    def progress(event: Any) -> None:
        events.append((time.monotonic(), event))

    hooks.add_listener(listener)
    try:
        with SimulatedSlices(slices, 1) as sim:
            box["sim"] = sim
            box["manager"] = make_manager()
            trainer = Trainer(
                **_training_parts(mlp.build()), config=config, run_dir=run_dir, sinks=[progress],
                train=TrainConfig(log_every=10**9), manager=box["manager"],
            )
            profile = None
            if os.environ.get(PROFILE_VARIABLE, "") == str(slices):
                import cProfile

                profile = cProfile.Profile()
                profile.enable()
            try:
                trainer.fit(10**6)
            except _Finished:
                pass
            finally:
                if profile is not None:
                    import pstats

                    profile.disable()
                    profile.dump_stats(Path(run_dir).parent / f"profile-{slices}.prof")
                    with open(Path(run_dir).parent / f"profile-{slices}.txt", "w") as out:
                        stats = pstats.Stats(profile, stream=out).sort_stats("cumulative")
                        stats.print_stats(60)
                        stats.sort_stats("tottime").print_callers(15)
    finally:
        hooks.remove_listener(listener)

    scale_ups = []
    for t_back in state["returns"]:
        later = [(t, e) for t, e in events if t >= t_back]
        live = next((t for t, e in later if isinstance(e, Resume) and e.source == "live"), None)
        step = None if live is None else next((t for t, e in later if t >= live and isinstance(e, Step)), None)
        if step is not None:
            scale_ups.append(step - t_back)
    recoveries, waits, parts = [], [], []
    for t_loss, (_, resume), t_step in recoveries_after(state["losses"], events):
        recoveries.append(t_step - t_loss)
        waits.append(resume.durations["wait_for_slices"])
        parts.append(dict(resume.durations))
    steps = [t for t, e in events if isinstance(e, Step)]
    step_s = median([b - a for a, b in zip(steps, steps[1:])])
    print("RESULT " + json.dumps({"recoveries": recoveries, "waits": waits, "parts": parts, "step_s": step_s,
                                  "scale_ups": scale_ups}), flush=True)
    return 0


def _run(slices: int, losses: int, workdir: Path) -> dict[str, list[float]]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"child-{slices}.log"
    with open(log, "w") as err:  # a file, not a pipe: a full pipe would stall the child
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.recovery_scaling", "child", str(slices), str(losses),
             str(workdir / f"run-{slices}")],
            cwd=REPO, env=worker_env(devices=slices), stdout=subprocess.PIPE, stderr=err, text=True,
            timeout=900,
        )
    result = next((line[len("RESULT "):] for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode != 0 or result is None:
        raise RuntimeError(
            f"recovery_scaling on {slices} slices exited {done.returncode}: {log.read_text()[-2000:]}"
        )
    return json.loads(result)


def growth(counts: list[int], values: list[float]) -> float:
    """The exponent ``b`` of the least-squares fit ``value = a * slices ** b`` (log-log)."""
    xs = [math.log(n) for n in counts]
    ys = [math.log(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else math.nan


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    losses = max(1, sizes.losses // 3)
    counts = list(sizes.scaling_slice_counts)
    results: dict[str, Any] = {}
    for slices in counts:
        run = _run(slices, losses, workdir)
        recoveries, waits = run["recoveries"], run["waits"]
        if len(recoveries) < 2:
            raise RuntimeError(f"recovery_scaling on {slices} slices measured {len(recoveries)} losses, not {losses + 1}")
        results[f"recovery_scaling_cold_s_{slices}"] = recoveries[0]
        results[f"recovery_scaling_s_p50_{slices}"] = median(recoveries[1:])
        results[f"recovery_scaling_wait_for_slices_s_p50_{slices}"] = median(waits[1:])
        results[f"recovery_scaling_s_all_{slices}"] = [round(x, 4) for x in recoveries]
        results[f"recovery_scaling_step_s_{slices}"] = run["step_s"]
        results[f"recovery_scaling_steps_p50_{slices}"] = results[f"recovery_scaling_s_p50_{slices}"] / run["step_s"]
        results[f"recovery_scaling_parts_p50_{slices}"] = {
            key: median([p[key] for p in run["parts"][1:]]) for key in run["parts"][0]}
        if run["scale_ups"]:
            results[f"recovery_scaling_scale_up_s_p50_{slices}"] = median(run["scale_ups"][1:] or run["scale_ups"])
            results[f"recovery_scaling_scale_up_steps_p50_{slices}"] = (
                results[f"recovery_scaling_scale_up_s_p50_{slices}"] / run["step_s"])
    few, many = counts[0], (SLICE_COUNTS[1] if SLICE_COUNTS[1] in counts else counts[-1])
    results["recovery_scaling_ratio"] = results[f"recovery_scaling_s_p50_{many}"] / results[f"recovery_scaling_s_p50_{few}"]
    results["recovery_scaling_ratio_in_steps"] = (
        results[f"recovery_scaling_steps_p50_{many}"] / results[f"recovery_scaling_steps_p50_{few}"]
    )
    results["recovery_scaling_cold_ratio"] = (
        results[f"recovery_scaling_cold_s_{many}"] / results[f"recovery_scaling_cold_s_{few}"]
    )
    largest = counts[-1]
    if len(counts) > 2:
        for unit, key in (("s", "recovery_scaling_s_p50"), ("steps", "recovery_scaling_steps_p50"),
                          ("step_s", "recovery_scaling_step_s")):
            results[f"recovery_scaling_growth_{unit}"] = growth(counts, [results[f"{key}_{n}"] for n in counts])
        if all(f"recovery_scaling_scale_up_s_p50_{n}" in results for n in counts):
            results["recovery_scaling_growth_scale_up_s"] = growth(
                counts, [results[f"recovery_scaling_scale_up_s_p50_{n}"] for n in counts])
        results[f"recovery_scaling_steps_ratio_{largest}"] = (
            results[f"recovery_scaling_steps_p50_{largest}"] / results[f"recovery_scaling_steps_p50_{few}"])
        results[f"recovery_scaling_s_ratio_{largest}"] = (
            results[f"recovery_scaling_s_p50_{largest}"] / results[f"recovery_scaling_s_p50_{few}"])
    notes.append(
        f"Recovery scaling: one loss of the last slice at a time, {losses} warm losses after a cold "
        f"one, on {', '.join(map(str, counts))} simulated slices of one CPU device, mlp recipe, "
        f"replica-resize, snapshot every step, poll_interval 0.05 s, {PER_SLICE_BATCH} examples per slice, "
        "precompiling off; each count in its own process. Recovery: the loss to the end of the first step "
        "after the resume; scale-up: the slice's return to the end of the first step after the live "
        "resume. Cold (first loss, compiles the smaller "
        f"mesh's step): {results[f'recovery_scaling_cold_s_{few}']:.2f} s and "
        f"{results[f'recovery_scaling_cold_s_{many}']:.2f} s; wait for slices, warm p50: "
        f"{results[f'recovery_scaling_wait_for_slices_s_p50_{few}']:.3f} s and "
        f"{results[f'recovery_scaling_wait_for_slices_s_p50_{many}']:.3f} s. All the slices "
        "share the machine's cores, so per-slice work that real slices do in parallel is serial "
        "here: a steady step takes "
        + ", ".join(f"{results[f'recovery_scaling_step_s_{n}'] * 1e3:.1f} ms on {n}" for n in counts)
        + " slices, which the figures in step times divide out. Fitted growth (least squares of log "
        "figure on log slices): "
        + (", ".join(f"{unit} ^{results[f'recovery_scaling_growth_{unit}']:.2f}"
                     for unit in ("s", "steps", "step_s") if f"recovery_scaling_growth_{unit}" in results) or "n/a")
        + ". Recovery parts, warm p50 by slice count: "
        + "; ".join(f"{n}: " + ", ".join(f"{k} {v:.3f}" for k, v in results[f"recovery_scaling_parts_p50_{n}"].items())
                    for n in counts)
        + "."
    )
    return results


if __name__ == "__main__":
    if sys.argv[1:2] != ["child"] or len(sys.argv) != 5:
        sys.exit("usage: python -m benchmarks.recovery_scaling child SLICES LOSSES RUN_DIR")
    sys.exit(_child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
