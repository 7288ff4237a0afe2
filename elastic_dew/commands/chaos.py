"""``elastic-dew chaos`` (and ``python -m elastic_dew.chaos``): run seeded chaos scenarios.

Each seed draws a random fault schedule (:func:`elastic_dew.testing.draw`), trains it on
simulated slices with restarts after preemption, and checks every invariant against the
failure-free run (:func:`elastic_dew.testing.check`). A failure prints its seed, its broken
invariants and the one command that replays it; the exit status is 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import sys
import tempfile
from pathlib import Path

from elastic_dew.run import USAGE_EXIT
from elastic_dew.testing.runner import run_seed
from elastic_dew.testing.scenarios import DEVICES_PER_SLICE, TOTAL_SLICES, replay_command

__all__ = ["configure", "run", "main"]

_PROG = "python -m elastic_dew.chaos"
_DESCRIPTION = "Chaos mode: seeded random fault schedules, and the invariants every faulted run must keep."


def _seeds(text: str) -> list[int]:
    if ":" in text:
        first, _, last = text.partition(":")
        if not (first.isdigit() and last.isdigit()) or int(last) <= int(first):
            raise argparse.ArgumentTypeError(f"--seeds {text!r} must be A:B with whole numbers A < B")
        return list(range(int(first), int(last)))
    raise argparse.ArgumentTypeError(f"--seeds {text!r} must be A:B, e.g. 0:20")


def configure(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="replay one seed")
    group.add_argument("--seeds", type=_seeds, help="run seeds A..B-1")
    parser.add_argument("--workdir", help="keep the runs here (default: a temporary directory)")
    # -v (the global option, before or after the subcommand) logs what the runs do.


def _refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments argparse accepted, or None."""
    if args.seed is not None and args.seed < 0:
        return f"--seed {args.seed} must be >= 0"
    if args.workdir and Path(args.workdir).exists() and any(Path(args.workdir).iterdir()):
        return f"--workdir {args.workdir} is not empty; give a new or empty directory"
    return None


def _quiet_logging(verbose: bool) -> None:
    # The runs lose slices on purpose: without -v, keep their tracebacks out of the verdicts.
    level = logging.INFO if verbose else logging.CRITICAL
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)
    if not verbose:
        logging.getLogger("absl").setLevel(logging.CRITICAL)


def _cpu_devices() -> None:
    from elastic_dew.runtime import prepare_process

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    devices = TOTAL_SLICES * DEVICES_PER_SLICE
    if f"--xla_force_host_platform_device_count={devices}" not in os.environ.get("XLA_FLAGS", ""):
        prepare_process(xla_flags=f"--xla_force_host_platform_device_count={devices}")


def _run_seeds(seeds: list[int], workdir: str | None) -> int:
    # Many runs share this process: should one die natively, say where (on stderr).
    if not faulthandler.is_enabled():
        with contextlib.suppress(OSError, ValueError, AttributeError):  # a stderr with no file (captured)
            faulthandler.enable()
    with contextlib.ExitStack() as stack:
        workdir = workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="elastic-dew-chaos-"))
        failures = 0
        for seed in seeds:
            scenario, problems = run_seed(seed, workdir)
            if problems:
                failures += 1
                print(f"seed {seed} FAILED: {scenario.schedule} ({scenario})")
                for problem in problems:
                    print(f"  - {problem}")
                print(f"  replay: {replay_command(seed)}")
            else:
                print(f"seed {seed} ok: {scenario.schedule}")
    print(f"{len(seeds) - failures} of {len(seeds)} seeds kept every invariant")
    return 1 if failures else 0


def run(args: argparse.Namespace) -> int:
    """The ``elastic-dew chaos`` subcommand: exit 1 on any failure, 2 on bad arguments."""
    refusal = _refusal(args)
    if refusal is not None:
        print(f"elastic-dew chaos: error: {refusal}", file=sys.stderr)
        return USAGE_EXIT
    _quiet_logging(args.verbose)
    _cpu_devices()
    return _run_seeds([args.seed] if args.seed is not None else args.seeds, args.workdir)


def main(argv: list[str] | None = None) -> int:
    """``python -m elastic_dew.chaos --seed N`` (or ``--seeds A:B``): exit 1 on any failure."""
    parser = argparse.ArgumentParser(prog=_PROG, description=_DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the runs do (faults, stops, resumes)")
    configure(parser)
    args = parser.parse_args(argv)
    refusal = _refusal(args)
    if refusal is not None:
        parser.error(refusal)
    _quiet_logging(args.verbose)
    _cpu_devices()
    return _run_seeds([args.seed] if args.seed is not None else args.seeds, args.workdir)
