"""``python -m benchmarks [--quick] [--out DIR] [--only NAMES]``: run the benchmarks, write the results.

The process sets its own CPU device count (eight: four simulated slices of two) before JAX
starts, through ``elastic_dew.runtime.prepare_process``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

#: Benchmark modules in the order they run; each has ``measure(sizes, workdir, notes) -> dict``.
MODULES = ("reposition", "restore_bw", "storage_bw", "snapshot_cost", "overhead", "recovery", "recovery_scaling", "preemption", "goodput", "first_save", "soak", "plan_validation")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick mode (about 13 minutes on 2 cores, 7 of them the plan validation)")
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the smoke test's mode
    parser.add_argument("--out", default="benchmark-results", help="where results.json and results.md go")
    parser.add_argument(
        "--only", default="", help=f"comma-separated subset of {', '.join(MODULES)} (default: all)"
    )
    parser.add_argument("--plan-cases", default="",
                        help="comma-separated plan_validation cases (default: the mode's; the rate grid: "
                             "mlp_4x1,mlp_4x1_x3,mlp_4x1_x10,lm_4x2,lm_4x2_x3,lm_4x2_x10)")
    parser.add_argument("--plan-schedules", type=int, default=0, help="runs per policy and plan_validation case")
    parser.add_argument("--scratch", default="", help="keep every run's directory here (default: a temporary one)")
    args = parser.parse_args(argv)
    only = [name for name in args.only.split(",") if name]
    unknown = sorted(set(only) - set(MODULES))
    if unknown:
        parser.error(f"--only names {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    args.only = only or list(MODULES)
    from benchmarks.plan_validation import CASES

    args.plan_cases = tuple(name for name in args.plan_cases.split(",") if name)
    unknown = sorted(set(args.plan_cases) - set(CASES))
    if unknown:
        parser.error(f"--plan-cases names {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if args.plan_schedules < 0:
        parser.error(f"--plan-schedules is {args.plan_schedules}; give a number of runs, at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from benchmarks.common import SIZES, XLA_FLAGS, machine, write_results
    from elastic_dew.runtime import prepare_process

    prepare_process(xla_flags=XLA_FLAGS)  # before anything starts JAX
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    sizes = SIZES[mode]
    if args.plan_cases:
        sizes = dataclasses.replace(sizes, plan_cases=args.plan_cases)
    if args.plan_schedules:
        sizes = dataclasses.replace(sizes, plan_schedules=args.plan_schedules)
    out = Path(args.out)
    results: dict = {"mode": mode, "machine": machine(), "seconds": {}}
    notes: list[str] = []
    started = time.monotonic()
    with contextlib.nullcontext(args.scratch) if args.scratch else \
            tempfile.TemporaryDirectory(prefix="elastic-dew-bench-") as scratch:
        for name in args.only:
            module = importlib.import_module(f"benchmarks.{name}")
            t = time.monotonic()
            print(f"[{time.monotonic() - started:6.1f}s] {name} ...", flush=True)
            if name == "goodput" and not sizes.goodput_steps:
                continue
            results.update(module.measure(sizes, Path(scratch) / name, notes))
            results["seconds"][name] = round(time.monotonic() - t, 1)
            results["total_s"] = time.monotonic() - started
            write_results(out, results, notes, mode)  # a partial table survives a later failure
    results["total_s"] = time.monotonic() - started
    write_results(out, results, notes, mode)
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
