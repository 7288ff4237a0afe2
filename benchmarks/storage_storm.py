"""The 503/429 storm through a preemption, as issue 40 reported it, measured end to end.

``python -m benchmarks.storage_storm [--timeouts 30 10] [--steps 20] [--preempt 17] [--grace S] [--out FILE]``

For each storage timeout: ``elastic-dew train mlp`` with ``--checkpoint-every 5`` and
``--schedule preempt@STEP`` writes to ``gs://`` on fake-gcs-server (127.0.0.1) through the
fault proxy, which answers every 3rd upload of a checkpoint's objects 503 and every 4th read
of them 429, with no limit (the clients back off and retry each; none fails for good). The
same command is then run again, as a JobSet restarts a preempted pod, under the same storm.
Printed and written as JSON, per run: its exit status and wall time, its storage summary
(checkpoints committed, skipped, abandoned; each commit's seconds; retries and bytes; the
loop's time held by checkpoint saves and its share of the wall time), the stop event's step,
the resume's source and step, and the errors the proxy injected. The machine's load is
recorded before and after. What it misses: a real bucket's latency and parallel streams
(one loopback server), and more than one host writing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["storm", "main"]


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _env(proxy_env: dict[str, str]) -> dict[str, str]:
    from elastic_dew.runtime.local_bucket import local_bucket_env

    derived = local_bucket_env({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:1"})
    env = {k: v for k, v in os.environ.items() if k not in derived and k != "STORAGE_EMULATOR_HOST"}
    env.pop("XLA_FLAGS", None)
    env.update(proxy_env, GCE_METADATA_HOST="127.0.0.1:9", NO_GCE_CHECK="True")
    return env


def _events(run_dir: Path, kind: str) -> list[dict]:
    from elastic_dew import record

    return [e for e in record.read_events(run_dir) if e["event"] == kind]


def storm(proxy, bucket: str) -> tuple[Any, Any]:
    """The storm's two rules, counts afresh: every 3rd upload 503, every 4th read 429."""
    from elastic_dew.testing.fault_proxy import ProxyFault

    proxy.clear()
    objects = f"{bucket[5:]}/ck/*"
    return (proxy.add(ProxyFault("error", method="POST", path=objects, status=503, every=3)),
            proxy.add(ProxyFault("error", method="GET", path=objects, status=429, every=4)))


def _run(run_dir: Path, bucket: str, timeout: float, steps: int, preempt: int, env: dict[str, str],
         grace: float | None = None) -> dict:
    from elastic_dew import record

    args = [sys.executable, "-m", "elastic_dew", "train", "mlp", "--steps", str(steps), "--slices", "2",
            "--checkpoint-every", "5", "--log-format", "text", "--no-tensorboard", "--run-dir", str(run_dir),
            "--checkpoint-dir", f"{bucket}/ck", "--storage-timeout", str(timeout), "--schedule", f"preempt@{preempt}"]
    if grace is not None:
        args += ["--grace-period", str(grace)]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env, cwd=run_dir.parent)
    seconds = time.monotonic() - started
    summary = record.summarize(record.read_events(run_dir))
    stops, resumes = _events(run_dir, "stop"), _events(run_dir, "resume")
    return {
        "exit": done.returncode, "seconds": round(seconds, 1), "storage": summary["storage"],
        "stop": (stops[-1]["reason"], stops[-1]["step"]) if stops else None,
        "resume": (resumes[-1]["source"], resumes[-1]["step"]) if resumes else None,
        "tail": done.stderr[-1500:] if done.returncode not in (0, 143) else "",
    }


def measure(timeouts: list[float], steps: int, preempt: int, grace: float | None = None) -> dict[str, Any]:
    """Each timeout's preempted run and its re-run under the storm (see the module)."""
    from elastic_dew.testing.fault_proxy import FaultProxy
    from elastic_dew.testing.gcs_server import GCSServer

    out: dict[str, Any] = {"load_before": _load(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="elastic-dew-storm-") as scratch:
        server = GCSServer(Path(scratch) / "gcs.log").start()
        try:
            with FaultProxy(server.url) as proxy:
                env = _env(proxy.env)
                for timeout in timeouts:
                    bucket = server.create_bucket(f"storm-{int(timeout)}-{int(time.time())}")
                    run_dir = Path(scratch) / f"run-{timeout:g}"
                    for attempt in ("preempted", "rerun"):
                        uploads, reads = storm(proxy, bucket)
                        row = _run(run_dir, bucket, timeout, steps, preempt, env, grace)
                        row.update(timeout=timeout, grace=grace, attempt=attempt, injected_503=uploads.fired,
                                   injected_429=reads.fired)
                        out["runs"].append(row)
                        print(json.dumps(row), flush=True)
                    proxy.clear()
        finally:
            server.stop()
    out["load_after"] = _load()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.storage_storm", description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", type=float, nargs="+", default=[30.0, 10.0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--preempt", type=int, default=17)
    parser.add_argument("--grace", type=float, default=None, help="--grace-period (default: the run's own, 30 s)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    result = measure(args.timeouts, args.steps, args.preempt, args.grace)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
