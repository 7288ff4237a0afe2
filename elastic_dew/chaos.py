"""Chaos mode: seeded random fault schedules, and the invariants every faulted run must keep.

A *scenario* is a small training run (a linear model, :data:`TOTAL_SLICES` simulated slices
of :data:`DEVICES_PER_SLICE` CPU devices, a constant global batch) with a fault schedule in
the simulator's grammar. :func:`run` trains it through the real :class:`~elastic_dew.Trainer`
in this process, restarting it after ``Preempted`` with the same run directory and fault log,
as a JobSet restarts the controller. :func:`check` then compares the run with the
failure-free run of the same length and returns every broken invariant:

* exactly-once data: the committed step lines (the run record's commit rule) are steps
  ``1..N`` and their example ranges tile ``[0, N * batch)``;
* the final parameters equal the failure-free run's: bitwise when every committed step ran
  on every slice, ``allclose`` at :data:`TOLERANCE` where the mesh changed;
* no committed checkpoint deleted or damaged: each committed step directory is hashed at
  every phase the elastic layer announces, and must keep its first hash to the end;
* the run record consistent with what happened: one ``start`` per process, each restart
  resuming from the checkpoint of the step its preemption stopped at, the summary's final
  step, example count and digest matching the record and the saved parameters, and every
  fault in the simulator's log fired at most once.

:func:`draw` draws a scenario from a seed (faults, slices, steps and phases), always keeping
one slice that is never lost, so every drawn run must finish. A failure is replayed with one
command::

    python -m elastic_dew.chaos --seed N

``python -m elastic_dew.chaos --seeds A:B`` runs a range and prints the seed and the replay
command of every failure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "TOTAL_SLICES",
    "DEVICES_PER_SLICE",
    "GLOBAL_BATCH",
    "TOLERANCE",
    "Scenario",
    "Outcome",
    "model",
    "committed_checkpoints",
    "run",
    "check",
    "draw",
    "replay_command",
    "main",
]

logger = logging.getLogger(__name__)

TOTAL_SLICES = 4
DEVICES_PER_SLICE = 2
#: Divisible by the data-parallel devices of 4, 3, 2 and 1 slices of 2.
GLOBAL_BATCH = 24
#: The elastic layer's tolerance where the mesh changed under a constant global batch: the
#: gradient's all-reduce sums in another order, so float32 results agree to this, not bitwise.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
#: Processes one scenario may use (the first plus restarts after preemption).
MAX_PROCESSES = 6
_FEATURES = 4
_EXAMPLES = 2048


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One faulted run: a schedule and the settings it runs with."""

    schedule: str = ""
    steps: int = 12
    minimum_slice_count: int | None = 1
    snapshot_every: int = 2
    checkpoint_every: int = 4
    max_attempts: int | None = 10
    timeout: float = 60.0
    poll_interval: float = 0.05

    def config(self) -> Any:
        from elastic_dew.elastic.config import ElasticConfig

        return ElasticConfig(
            minimum_slice_count=self.minimum_slice_count,
            poll_interval=self.poll_interval,
            timeout=self.timeout,
            max_attempts=self.max_attempts,
            global_batch=GLOBAL_BATCH,
            snapshot_every=self.snapshot_every,
            checkpoint_every=self.checkpoint_every,
            # Retention would delete old checkpoints by design; keep them all, so any
            # checkpoint that disappears was lost to a fault.
            max_to_keep=100,
        )


@dataclasses.dataclass
class Outcome:
    """What a scenario's run left behind."""

    scenario: Scenario
    run_dir: Path
    processes: int = 0
    preempted_at: list[int] = dataclasses.field(default_factory=list)
    error: BaseException | None = None
    #: step -> hash of each committed checkpoint, as first seen during the run.
    checkpoints_seen: dict[int, str] = dataclasses.field(default_factory=dict)
    #: problems found while the run was going (a committed checkpoint changed or vanished).
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"


def model() -> dict[str, Any]:
    """A linear regression on fixed data, trained by SGD: small, and sensitive to every example."""
    import grain
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    rng = np.random.default_rng(7)
    xs = rng.normal(size=(_EXAMPLES, _FEATURES)).astype(np.float32)
    ys = (xs @ np.arange(1, _FEATURES + 1, dtype=np.float32) + 0.5).astype(np.float32)

    def init(key):
        return {"w": jax.random.normal(key, (_FEATURES,)) * 0.1, "b": jnp.zeros(())}

    def loss(params, batch, key):
        del key
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    dataset = grain.MapDataset.range(_EXAMPLES).map(lambda i: {"x": xs[i], "y": ys[i]})
    return {"init": init, "loss": loss, "optimizer": optax.sgd(0.05), "dataset": dataset}


# ----------------------------------------------------------------------------- checkpoints


def _is_committed(path: Path) -> bool:
    """The tier-2 commit rule (``elastic_dew.elastic.checkpoints``): Orbax's commit timestamp
    in the step metadata, and both items present."""
    try:
        metadata = json.loads((path / "_CHECKPOINT_METADATA").read_text())
    except (OSError, ValueError):
        return False
    return bool(metadata.get("commit_timestamp_nsecs")) and (path / "state").exists() and (path / "meta").exists()


def _hash_dir(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def committed_checkpoints(directory: str | os.PathLike[str]) -> dict[int, str]:
    """``{step: sha256 of every file}`` of the committed checkpoints in ``directory``."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    found = {}
    for path in directory.iterdir():
        if path.name.isdigit() and _is_committed(path):
            try:
                found[int(path.name)] = _hash_dir(path)
            except OSError:  # vanished while being read: the next look reports it
                continue
    return found


class _CheckpointWatch:
    """Hash the committed checkpoints at every phase; a committed one must never change."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._lock = threading.Lock()

    def look(self, *_: Any) -> None:
        now = committed_checkpoints(self.outcome.checkpoint_dir)
        with self._lock:
            for step, digest in now.items():
                first = self.outcome.checkpoints_seen.setdefault(step, digest)
                if first != digest:
                    self._problem(f"committed checkpoint {step} changed after it was committed")
            for step in self.outcome.checkpoints_seen:
                if step not in now:
                    self._problem(f"committed checkpoint {step} was deleted or damaged")

    def _problem(self, text: str) -> None:
        if text not in self.outcome.problems:
            self.outcome.problems.append(text)


# ----------------------------------------------------------------------------- running


@contextlib.contextmanager
def _listening(listener: Callable[[str, int], None]) -> Iterator[None]:
    from elastic_dew.elastic import hooks

    hooks.add_listener(listener)
    try:
        yield
    finally:
        hooks.remove_listener(listener)


def _settle_scale_up(sim: Any, manager: Any, scenario: Scenario) -> Callable[[str, int], None]:
    """Hold a step until pathwaysutils' monitor thread has seen a returned slice.

    The monitor polls on its own thread; without this the step at which a returned slice
    is added back depends on timing. Only replica-resize runs monitor for returned slices.
    """

    def hold(phase: str, step: int) -> None:
        if phase != "step" or scenario.minimum_slice_count is None:
            return
        returned = set(range(TOTAL_SLICES)) - set(sim.lost) - set(manager.active_slice_indices)
        deadline = time.monotonic() + 5.0
        while returned and not manager.available_inactive_slices and time.monotonic() < deadline:
            time.sleep(0.01)
            returned -= set(sim.lost)

    return hold


def run(scenario: Scenario, run_dir: str | os.PathLike[str], *, on_process: Callable[[Any, Any], None] | None = None) -> Outcome:
    """Train ``scenario`` in ``run_dir``, restarting after every preemption; never raises.

    Each process is a fresh :class:`SimulatedSlices` over the same fault log, a fresh
    pathwaysutils ``Manager`` and a fresh :class:`Trainer` on the same run directory.
    ``on_process(sim, manager)`` is called as each process starts. An error other than
    ``Preempted`` ends the run and is kept in ``Outcome.error``.
    """
    from elastic_dew.elastic.retry import make_manager
    from elastic_dew.runtime import Preempted
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.trainer import Trainer

    outcome = Outcome(scenario, Path(run_dir))
    watch = _CheckpointWatch(outcome)
    with _listening(watch.look):
        while outcome.processes < MAX_PROCESSES:
            outcome.processes += 1
            with SimulatedSlices(
                TOTAL_SLICES, DEVICES_PER_SLICE, schedule=scenario.schedule,
                fault_log=outcome.run_dir / "faults.jsonl",
            ) as sim:
                manager = make_manager()
                if on_process is not None:
                    on_process(sim, manager)
                trainer = Trainer(
                    **model(), config=scenario.config(), run_dir=outcome.run_dir,
                    manager=manager, log_every=1000,
                )
                try:
                    with _listening(_settle_scale_up(sim, manager, scenario)):
                        trainer.fit(scenario.steps)
                    break
                except Preempted as stop:
                    outcome.preempted_at.append(stop.step)
                    logger.info("preempted at step %d; restarting as a JobSet would", stop.step)
                except Exception as error:  # noqa: BLE001 - the outcome carries it to check()
                    outcome.error = error
                    break
        else:
            outcome.error = RuntimeError(f"still preempted after {MAX_PROCESSES} processes")
        watch.look()
    return outcome


_references: dict[tuple[int, Path], dict[str, Any]] = {}


def reference(steps: int, workdir: str | os.PathLike[str]) -> dict[str, Any]:
    """The failure-free run's final parameters (flat numpy), computed once per length and directory."""
    from elastic_dew import record

    key = (steps, Path(workdir))
    if key not in _references:
        outcome = run(Scenario(steps=steps), Path(workdir) / f"reference-{steps}")
        if outcome.error is not None:
            raise outcome.error
        _references[key] = record.load_params(outcome.run_dir)
    return _references[key]


# ----------------------------------------------------------------------------- checking


def _check_data(committed: list[dict], steps: int) -> list[str]:
    problems = []
    numbers = sorted(e["step"] for e in committed)
    if numbers != list(range(1, steps + 1)):
        problems.append(f"committed steps are {numbers}, not 1..{steps}")
    position = 0
    for event in sorted(committed, key=lambda e: e["step"]):
        start, end = event["examples"]
        if start != position or end - start != GLOBAL_BATCH:
            problems.append(
                f"step {event['step']} consumed examples [{start}, {end}); expected "
                f"[{position}, {position + GLOBAL_BATCH}) (exactly-once data)"
            )
        position = end
    return problems


def _check_params(run_dir: Path, expected: dict[str, Any], full_mesh: bool) -> list[str]:
    import numpy as np

    from elastic_dew import record

    try:
        params = record.load_params(run_dir)
    except OSError as error:
        return [f"no final parameters: {error}"]
    if sorted(params) != sorted(expected):
        return [f"final parameters {sorted(params)} differ in names from {sorted(expected)}"]
    problems = []
    for name, value in expected.items():
        if full_mesh and not np.array_equal(params[name], value):
            problems.append(f"parameter {name} differs from the failure-free run (bitwise; every step ran on every slice)")
        elif not np.allclose(params[name], value, **TOLERANCE):
            problems.append(f"parameter {name} differs from the failure-free run beyond {TOLERANCE}")
    return problems


def _check_record(outcome: Outcome, events: list[dict]) -> list[str]:
    from elastic_dew import record

    problems = []
    starts = sum(1 for e in events if e["event"] == "start")
    if starts != outcome.processes:
        problems.append(f"the record has {starts} start lines for {outcome.processes} processes")
    # Each restart resumes from the checkpoint of the step its preemption stopped at.
    resumes_by_process: list[dict] = []
    seen_start = False
    for event in events:
        if event["event"] == "start":
            seen_start = True
        elif event["event"] == "resume" and seen_start:
            resumes_by_process.append(event)
            seen_start = False
    for stop, resume in zip(outcome.preempted_at, resumes_by_process[1:], strict=False):
        if (resume["source"], resume["step"]) != ("checkpoint", stop + 1):
            problems.append(
                f"the process after the preemption at step {stop} resumed from "
                f"{resume['source']} at {resume['step']}, not from checkpoint at {stop + 1}"
            )
    for stop in outcome.preempted_at:
        if stop not in outcome.checkpoints_seen:
            problems.append(f"the preemption at step {stop} left no committed checkpoint of it")
    stops = [e for e in events if e["event"] == "stop"]
    preempted = [e["step"] for e in stops if e["reason"] == "preempted"]
    if preempted != outcome.preempted_at:
        problems.append(f"the record's preempted stops {preempted} are not the preemptions {outcome.preempted_at}")
    if outcome.error is None:
        if not stops or stops[-1]["reason"] != "done":
            problems.append("the record does not end with a done stop")
        try:
            summary = record.load_summary(outcome.run_dir)
            params = record.load_params(outcome.run_dir)
        except (OSError, ValueError) as error:
            return [*problems, f"no summary or final parameters: {error}"]
        steps = outcome.scenario.steps
        if summary["final_step"] != steps:
            problems.append(f"summary final_step {summary['final_step']} != {steps}")
        if summary["examples_consumed"] != steps * GLOBAL_BATCH:
            problems.append(f"summary examples_consumed {summary['examples_consumed']} != {steps * GLOBAL_BATCH}")
        if summary["state_digest"] != record.state_digest(params):
            problems.append("summary state_digest does not match final_params.npz")
        if sorted(summary["badput"]) != sorted(record.BADPUT_CATEGORIES):
            problems.append(f"summary badput categories {sorted(summary['badput'])}")
    faults_file = outcome.run_dir / "faults.jsonl"
    if faults_file.exists():
        fired = [json.loads(line)["index"] for line in faults_file.read_text().splitlines() if line.strip()]
        if len(fired) != len(set(fired)):
            problems.append(f"a fault fired more than once: fault log indices {fired}")
    return problems


def check(outcome: Outcome, expected_params: dict[str, Any], *, expect_error: type | None = None) -> list[str]:
    """Every broken invariant of ``outcome`` (empty when the run kept them all).

    ``expected_params`` are the failure-free run's final parameters. ``expect_error`` is
    the exception type the scenario must end with (``None``: it must finish).
    """
    from elastic_dew import record

    problems = list(outcome.problems)
    if expect_error is None and outcome.error is not None:
        problems.append(f"the run failed: {type(outcome.error).__name__}: {outcome.error}")
    if expect_error is not None and not isinstance(outcome.error, expect_error):
        problems.append(f"expected {expect_error.__name__}, got {outcome.error!r}")
    final = committed_checkpoints(outcome.checkpoint_dir)
    for step, digest in outcome.checkpoints_seen.items():
        if final.get(step) != digest:
            problems.append(f"committed checkpoint {step} was deleted or damaged by the end")
    events = record.read_events(outcome.run_dir)
    committed = record.committed_steps(events)
    if outcome.error is None:
        problems += _check_data(committed, outcome.scenario.steps)
        full_mesh = all(e["slices"] == TOTAL_SLICES for e in committed)
        problems += _check_params(outcome.run_dir, expected_params, full_mesh)
    else:
        # A run that stopped with an error still has exactly-once data up to where it got.
        problems += _check_data(committed, max((e["step"] for e in committed), default=0))
    problems += _check_record(outcome, events)
    return problems


# ----------------------------------------------------------------------------- drawing

#: Phases that happen at any step, and those that happen only while recovering.
_RUNNING_PHASES = ("step", "step", "step", "snapshot", "checkpoint")
_RECOVERY_PHASES = ("snapshot_load", "compile", "checkpoint_restore")


def draw(seed: int) -> Scenario:
    """A random scenario from ``seed``: 1-5 faults at random steps and phases.

    The first fault hits a running step (a step, a snapshot or a checkpoint save); each later
    one either hits a running step too, or the recovery from an earlier fault (its snapshot
    load, compile or checkpoint restore), or, after a slice's return, the scale-up or the
    step that notices it. Slices ``lose`` and ``restore`` (a restore only of a slice the
    schedule lost, at a later step); at most two preemptions, whose stop may be hit again.
    One slice is never lost, so every drawn run must finish.
    """
    rng = random.Random(seed)
    steps = rng.randint(10, 14)
    survivor = rng.randrange(TOTAL_SLICES)
    losable = [s for s in range(TOTAL_SLICES) if s != survivor]
    faults: list[str] = []
    lost: list[tuple[int, int]] = []  # (slice, step)
    earlier: list[int] = []
    preempts = 0
    for number in range(rng.randint(1, 5)):
        kind = rng.choices(("lose", "restore", "preempt"), weights=(5, 3, 2))[0]
        if kind == "preempt" and preempts >= 2:
            kind = "lose"
        if kind == "restore" and lost:
            victim, at = rng.choice(lost)
            step = rng.randint(min(at + 1, steps), steps)
            faults.append(f"restore:{victim}@{step}/step")
            if rng.random() < 0.5:  # hit the scale-up that brings it back
                faults.append(f"lose:{rng.choice(losable)}@{step}/scale_up")
            continue
        if number and earlier and rng.random() < 0.4:
            phase = rng.choice(_RECOVERY_PHASES + ("stop",) * (kind == "lose" and preempts > 0))
            step = rng.choice(earlier)
        else:
            phase = rng.choice(_RUNNING_PHASES)
            step = rng.randint(1, steps)
        earlier.append(step)
        if kind == "preempt":
            preempts += 1
            faults.append(f"preempt@{step}/{phase}")
        else:
            victim = rng.choice(losable)
            lost.append((victim, step))
            faults.append(f"lose:{victim}@{step}/{phase}")
    return Scenario(
        schedule=",".join(faults),
        steps=steps,
        minimum_slice_count=1,
        snapshot_every=rng.choice((0, 2, 3)),
        checkpoint_every=rng.choice((0, 3, 4, 5)),
    )


def replay_command(seed: int) -> str:
    """The one command that replays ``seed``."""
    return f"python -m elastic_dew.chaos --seed {seed}"


def run_seed(seed: int, workdir: str | os.PathLike[str]) -> tuple[Scenario, list[str]]:
    """Draw, run and check one seed in ``workdir``; return the scenario and its problems."""
    scenario = draw(seed)
    logger.info("seed %d: %s", seed, scenario)
    expected = reference(scenario.steps, workdir)
    outcome = run(scenario, Path(workdir) / f"seed-{seed}")
    problems = check(outcome, expected)
    fired = (outcome.run_dir / "faults.jsonl")
    count = len(fired.read_text().splitlines()) if fired.exists() else 0
    logger.info("seed %d: %d of %d faults fired", seed, count, len(scenario.schedule.split(",")))
    return scenario, problems


def _seeds(text: str) -> list[int]:
    if ":" in text:
        first, _, last = text.partition(":")
        if not (first.isdigit() and last.isdigit()) or int(last) <= int(first):
            raise argparse.ArgumentTypeError(f"--seeds {text!r} must be A:B with whole numbers A < B")
        return list(range(int(first), int(last)))
    raise argparse.ArgumentTypeError(f"--seeds {text!r} must be A:B, e.g. 0:20")


def main(argv: list[str] | None = None) -> int:
    """``python -m elastic_dew.chaos --seed N`` (or ``--seeds A:B``): exit 1 on any failure."""
    parser = argparse.ArgumentParser(prog="python -m elastic_dew.chaos", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="replay one seed")
    group.add_argument("--seeds", type=_seeds, help="run seeds A..B-1")
    parser.add_argument("--workdir", help="keep the runs here (default: a temporary directory)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the runs do (faults, stops, resumes)")
    args = parser.parse_args(argv)
    if args.seed is not None and args.seed < 0:
        parser.error(f"--seed {args.seed} must be >= 0")
    seeds = [args.seed] if args.seed is not None else args.seeds
    if args.workdir and Path(args.workdir).exists() and any(Path(args.workdir).iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty; give a new or empty directory")
    # The runs lose slices on purpose: without -v, keep their tracebacks out of the verdicts.
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.CRITICAL,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("absl").setLevel(logging.CRITICAL)

    from elastic_dew.runtime import prepare_process

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    devices = TOTAL_SLICES * DEVICES_PER_SLICE
    if f"--xla_force_host_platform_device_count={devices}" not in os.environ.get("XLA_FLAGS", ""):
        prepare_process(xla_flags=f"--xla_force_host_platform_device_count={devices}")

    with contextlib.ExitStack() as stack:
        workdir = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="elastic-dew-chaos-"))
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


if __name__ == "__main__":
    sys.exit(main())
