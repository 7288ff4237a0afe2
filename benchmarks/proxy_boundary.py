"""``python -m benchmarks.proxy_boundary [--quick] [--out DIR]``: the cost of the Pathways boundary.

The same worker (a real JAX process, nothing of elastic_dew's server in it) runs twice on
this machine in one run: on the CPU backend (``JAX_PLATFORMS=cpu``, 8 CPU devices) and
through jaxlib's IFRT proxy client to the local Pathways backend (``JAX_PLATFORMS=proxy``,
``pathwaysutils.initialize()``, 2 slices of 4 CPU devices, :class:`elastic_dew.proxy.LocalPathways`).
Each measures, in order:

1. **dispatch**: a one-device ``jax.jit`` program (``x + 1`` on 16 floats), after a warm-up:
   ``pipelined`` is the wall time per dispatch of a chain of dispatches read once at its end
   (what an asynchronous loop pays per program); ``round trip`` is a dispatch and its read,
   each waited for (what a loop that reads every result pays);
2. **transfer**: a float32 array of ``MiB`` MiB to one device (``jax.device_put``, waited for)
   and back (``np.asarray`` of a result not yet read), as MB/s, the median of 5;
3. **step**: the demo's model (the ``lm`` recipe with ``elastic-dew demo --quick``'s
   overrides: ``seq_len=32, d_model=32, heads=2, layers=1``, global batch 24) as the trainer
   compiles it (``Trainer.program``: the step program, ``fsdp``) on a mesh of the 8 devices
   as 4 slices of 2 (the demo's shape) in the protocol's order (step N+1 dispatched before
   step N's loss is read), the batch put on the devices each step: the wall time per step
   after a warm-up, and the process's CPU time per step beside it.

The figures and the machine's load (``/proc/loadavg`` before and after each worker) go to
``OUT/proxy_boundary.json`` and ``OUT/proxy_boundary.md``. What it misses: a real Pathways
server, a network between controller and servers (here loopback), TPU execution (the CPU
client runs each program in the server's process, competing with the client for the
cores), and the server's own Python (this backend's request handling is Python; Pathways'
is not), which is part of every figure through the proxy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: (dispatch chain, round trips, transfer MiB, steps, warm-up steps) per mode.
MODES = {"full": (500, 200, 64, 60, 10), "quick": (200, 100, 16, 30, 5)}
OVERRIDES = ("seq_len=32", "d_model=32", "heads=2", "layers=1")
GLOBAL_BATCH = 24


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ")[0]
    except OSError:
        return "unknown"


def worker(mode: str) -> dict:
    """Measure in this process (its backend chosen by ``JAX_PLATFORMS`` before JAX starts)."""
    chain, trips, mib, steps, warmup = MODES[mode]
    if os.environ.get("JAX_PLATFORMS") == "proxy":
        import pathwaysutils

        pathwaysutils.initialize()
    import jax
    import numpy as np

    out: dict = {"backend": jax.default_backend(), "devices": len(jax.devices()),
                 "platforms": os.environ.get("JAX_PLATFORMS")}
    device = jax.devices()[0]
    plus_one = jax.jit(lambda x: x + 1)
    y = jax.device_put(np.zeros(16, np.float32), device)
    for _ in range(20):
        y = plus_one(y)
    y.block_until_ready()
    start = time.perf_counter()
    for _ in range(chain):
        y = plus_one(y)
    y.block_until_ready()
    out["dispatch_pipelined_us"] = (time.perf_counter() - start) / chain * 1e6
    laps = []
    for _ in range(trips):
        t = time.perf_counter()
        y = plus_one(y)
        y.block_until_ready()
        laps.append(time.perf_counter() - t)
    out["dispatch_round_trip_us"] = statistics.median(laps) * 1e6

    host = np.random.default_rng(0).random(mib * 2**18, dtype=np.float32)  # mib MiB
    to_device, to_host = [], []
    double = jax.jit(lambda x: x * 2)
    for _ in range(5):
        t = time.perf_counter()
        on = jax.device_put(host, device)
        on.block_until_ready()
        to_device.append(time.perf_counter() - t)
        fresh = double(on)
        fresh.block_until_ready()
        t = time.perf_counter()
        back = np.asarray(fresh)
        to_host.append(time.perf_counter() - t)
        assert back.shape == host.shape
    out["host_to_device_mb_s"] = host.nbytes / statistics.median(to_device) / 1e6
    out["device_to_host_mb_s"] = host.nbytes / statistics.median(to_host) / 1e6
    out["transfer_mib"] = mib

    sys.path.insert(0, str(REPO))
    import tempfile

    from elastic_dew import Trainer, TrainConfig
    from elastic_dew.elastic import ElasticConfig
    from elastic_dew.elastic.slices.mesh import batch_sharding, mesh_of
    from elastic_dew.recipes import lm

    parts = lm.build(**{k: int(v) for k, v in (o.split("=") for o in OVERRIDES)})
    parts = {k: v for k, v in parts.items() if k in ("init", "loss", "optimizer", "dataset")}
    program = Trainer(**parts, config=ElasticConfig(minimum_slice_count=3), run_dir=tempfile.mkdtemp(),
                      train=TrainConfig(sharding="fsdp")).program
    mesh = mesh_of(jax.devices()[:8], 4)
    state = program.init_state(mesh)
    step_fn = program.compile(mesh, GLOBAL_BATCH)
    split = batch_sharding(mesh)
    batches = iter(parts["dataset"].batch(GLOBAL_BATCH, drop_remainder=True).to_iter_dataset())
    in_flight, marks, cpu = None, [], []
    for step in range(1, steps + 1):
        state, metrics = step_fn(state, jax.device_put(next(batches), split))
        if in_flight is not None:
            float(in_flight["loss"])
            marks.append(time.perf_counter())
            cpu.append(time.process_time())
        in_flight = metrics
    float(in_flight["loss"])
    steady = marks[warmup:]
    out["step_ms"] = (steady[-1] - steady[0]) / (len(steady) - 1) * 1e3
    out["step_cpu_ms"] = (cpu[-1] - cpu[warmup]) / (len(cpu) - 1 - warmup) * 1e3
    out["steps_timed"] = len(steady) - 1
    return out


def _run_worker(mode: str, env: dict) -> dict:
    before = _load()
    done = subprocess.run([sys.executable, "-m", "benchmarks.proxy_boundary", "--worker", "--mode", mode],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"the worker failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load_before"], result["load_after"] = before, _load()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.proxy_boundary", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer dispatches and steps, 16 MiB transfers")
    parser.add_argument("--out", default="benchmark-results", help="where proxy_boundary.json and .md go")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.mode)), flush=True)
        return 0
    mode = "quick" if args.quick else "full"
    from elastic_dew.proxy import LocalPathways

    base = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_BACKEND_TARGET", "XLA_FLAGS")}
    base.update({"GCE_METADATA_HOST": "127.0.0.1:9", "NO_GCE_CHECK": "True"})
    results = {"mode": mode}
    results["cpu"] = _run_worker(mode, {**base, "JAX_PLATFORMS": "cpu",
                                        "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with LocalPathways(2, 4, log=out / "proxy_boundary_server.log") as backend:
        results["proxy"] = _run_worker(mode, {**base, **backend.client_env()})
    cpu, proxy = results["cpu"], results["proxy"]
    rows = [
        ("dispatch, pipelined (us per program)", "dispatch_pipelined_us", "{:.0f}"),
        ("dispatch, round trip (us)", "dispatch_round_trip_us", "{:.0f}"),
        (f"host to device, {cpu['transfer_mib']} MiB (MB/s)", "host_to_device_mb_s", "{:.0f}"),
        (f"device to host, {cpu['transfer_mib']} MiB (MB/s)", "device_to_host_mb_s", "{:.0f}"),
        ("demo model step, wall (ms)", "step_ms", "{:.1f}"),
        ("demo model step, client CPU (ms)", "step_cpu_ms", "{:.1f}"),
    ]
    lines = [f"proxy boundary benchmark ({mode}; load {cpu['load_before']}-{cpu['load_after']} on the CPU run, "
             f"{proxy['load_before']}-{proxy['load_after']} on the proxy run)", "",
             "| figure | CPU backend | through the proxy | proxy / CPU |", "| --- | ---: | ---: | ---: |"]
    for label, key, fmt in rows:
        lines.append(f"| {label} | {fmt.format(cpu[key])} | {fmt.format(proxy[key])} | {proxy[key] / cpu[key]:.2f} |")
    results["step_ratio"] = proxy["step_ms"] / cpu["step_ms"]
    (out / "proxy_boundary.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "proxy_boundary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
