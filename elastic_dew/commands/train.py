"""``elastic-dew train RECIPE``: train a recipe elastically, on simulated or real slices.

On CPU (``JAX_PLATFORMS`` unset or ``cpu``) the slices are simulated: the command asks
``prepare_process`` for ``slices * devices_per_slice`` host devices before JAX starts and
trains inside :class:`~elastic_dew.simulate.SimulatedSlices`, which fires the ``--chaos``
schedule's faults and records them in the run directory's ``faults.jsonl``, so the same
command run again after exit 143 or a kill resumes the run and does not fire them again.
Under Pathways (``JAX_PLATFORMS=proxy``) nothing is simulated: the allocation's real slices
are used, and ``--slices``, ``--devices-per-slice`` and ``--chaos`` are refused.

The run directory is ``--run-dir``, else ``runs/NAME`` with NAME from ``--name``, else
``$JOBSET_NAME`` (a restarted pod re-uses its run), else ``run_timestamp()`` (refused if
that directory exists). It is a local directory: a URL such as ``gs://...`` is refused
(mount the bucket, e.g. with Cloud Storage FUSE, and give the mounted path). An existing run
directory is resumed; it must have been started
with the same recipe, recipe settings, seed and global batch (``command.json`` records
them).

Every argument is checked before anything is touched; a bad one is an error naming the fix,
with exit status 2. A preemption ends the command with ``PREEMPTED_EXIT`` (143).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import pkgutil
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "configure",
    "run",
    "parse_recipe_args",
    "process_options",
    "train",
    "plan",
    "Plan",
    "UsageError",
    "available_recipes",
    "simulating",
    "RUNS_DIR",
    "COMMAND_FILE",
]

logger = logging.getLogger(__name__)

RUNS_DIR = Path("runs")
COMMAND_FILE = "command.json"
DEFAULT_SLICES = 4
DEFAULT_DEVICES_PER_SLICE = 2
#: Seconds between slice health checks under the simulator (a real allocation uses the
#: ElasticConfig default): simulated slices come back at once, so polling fast keeps the
#: demo's waits short.
SIMULATED_POLL_INTERVAL = 0.5
#: The workers' local multi-tier checkpoint directory (the guide's --gke-mtc-ramdisk-dir).
MULTI_TIER_DIR = "/tmp/mtc_checkpoints"
#: Settings that make two runs different runs; resuming with other values is refused.
_IDENTITY = ("recipe", "overrides", "seed", "global_batch")
#: A URL scheme (gs://, s3://, file://): not a local path, which the run directory must be.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class UsageError(ValueError):
    """A bad argument, found before anything was touched."""


def simulating() -> bool:
    """Whether this process simulates its slices: ``JAX_PLATFORMS`` unset or ``cpu``."""
    return os.environ.get("JAX_PLATFORMS", "").strip().lower() in ("", "cpu")


def available_recipes() -> list[str]:
    """The recipe names shipped in the ``recipes`` package (found by name, not imported:
    recipes sit above this runner and call it)."""
    spec = importlib.util.find_spec("recipes")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted(
        info.name
        for info in pkgutil.iter_modules(locations)
        if not info.name.startswith("_") and not info.ispkg
    )


def _add_arguments(parser: argparse.ArgumentParser, *, recipe: bool = True) -> None:
    if recipe:
        parser.add_argument(
            "recipe",
            metavar="RECIPE",
            help="a recipe name (lm, mlp, ...) or a module path with build() (mypkg.myrecipe)",
        )
    parser.add_argument("--steps", type=int, metavar="N", help="train until step N (default: the recipe's)")
    parser.add_argument(
        "--slices", type=int, metavar="S", help=f"simulated slices (default {DEFAULT_SLICES})"
    )
    parser.add_argument(
        "--devices-per-slice",
        type=int,
        metavar="D",
        help=f"CPU devices per simulated slice (default {DEFAULT_DEVICES_PER_SLICE})",
    )
    parser.add_argument(
        "--global-batch", type=int, metavar="B", help="examples per step (default: the recipe's)"
    )
    parser.add_argument(
        "--snapshot-every", type=int, default=10, metavar="K",
        help="steps between in-memory snapshots; 0 turns them off (default 10)",
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=100, metavar="M",
        help="steps between persistent checkpoints; 0 keeps only preemption checkpoints (default 100)",
    )
    parser.add_argument(
        "--checkpoint-kind", choices=("orbax", "multi_tier"), default="orbax",
        help="persistent tier: orbax (a CheckpointManager in the run directory) or multi_tier "
        "(the guide's ReplicatorCheckpointManager over colocated-Python sidecars; TPU only)",
    )
    parser.add_argument(
        "--checkpoint-dir", metavar="DIR",
        help=f"where the persistent tier writes (default RUN_DIR/checkpoints; for multi_tier "
        f"the workers' local directory, default {MULTI_TIER_DIR})",
    )
    parser.add_argument(
        "--min-slices", type=int, metavar="K",
        help="replica-resize: carry on with at least K slices after a loss "
        "(default: pause-resume, wait for every slice)",
    )
    parser.add_argument(
        "--poll-interval", type=float, metavar="SECONDS",
        help=f"seconds between slice health checks (default {SIMULATED_POLL_INTERVAL} simulated, "
        "pathwaysutils' 10 on real slices)",
    )
    parser.add_argument(
        "--chaos", default="", metavar="SCHEDULE",
        help="faults for the simulator, e.g. lose:1@20,restore:1@40,preempt@60 "
        "(grammar ACTION[:SLICE]@STEP[/PHASE])",
    )
    parser.add_argument("--run-dir", metavar="DIR", help="the run directory; an existing one is resumed")
    parser.add_argument(
        "--name", metavar="NAME", help="run in runs/NAME (default $JOBSET_NAME, else a timestamp)"
    )
    parser.add_argument("--log-every", type=int, default=10, metavar="L", help="steps between log lines (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the parameters and step keys (default 0)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="a recipe setting, e.g. --set d_model=128 (repeatable)",
    )
    # The demo prints its own summary after the last restart.
    parser.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)


def configure(parser: argparse.ArgumentParser) -> None:
    _add_arguments(parser)


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checked ``train`` invocation: everything decided except a timestamp run name."""

    recipe: str  # module name
    module: ModuleType
    overrides: dict[str, Any]
    steps: int
    global_batch: int
    simulate: bool
    slices: int
    devices_per_slice: int
    chaos: str
    config: Any  # ElasticConfig
    run_dir: Path | None  # None: runs/<run_timestamp()>, chosen after prepare_process
    log_every: int
    seed: int
    print_summary: bool = True

    def identity(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "overrides": self.overrides,
            "seed": self.seed,
            "global_batch": self.global_batch,
        }


def _module_name(recipe: str) -> str:
    return recipe if "." in recipe else f"recipes.{recipe}"


def _load_recipe(recipe: str) -> ModuleType:
    name = _module_name(recipe)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise UsageError(
            f"unknown recipe {recipe!r}; the recipes are {', '.join(available_recipes())}, "
            "or give a module path whose module has build() (mypkg.myrecipe)"
        )
    module = importlib.import_module(name)
    if not callable(getattr(module, "build", None)):
        raise UsageError(
            f"recipe module {name} has no build(**overrides) function returning "
            "dict(init=..., loss=..., optimizer=..., dataset=...)"
        )
    return module


def _parse_overrides(items: list[str]) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--set {item!r} is not KEY=VALUE; write e.g. --set d_model=128")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text  # a plain word is a string
        overrides[key.strip()] = value
    return overrides


def _positive(name: str, value: int | None, *, zero_ok: bool = False) -> None:
    if value is None:
        return
    if value < (0 if zero_ok else 1):
        raise UsageError(f"{name} {value} must be {'>= 0 (0 turns it off)' if zero_ok else '>= 1'}")


def _run_dir_of(args: argparse.Namespace) -> Path | None:
    if args.run_dir and args.name:
        raise UsageError("give --run-dir or --name, not both (--name NAME means --run-dir runs/NAME)")
    if args.run_dir and _URL.match(args.run_dir):
        raise UsageError(
            f"--run-dir {args.run_dir} is a URL, but the run directory must be a local directory "
            "(the run record is appended and fsynced line by line); mount the bucket, for example "
            "with Cloud Storage FUSE, and give the mounted path (--run-dir /gcs/runs/NAME)"
        )
    if args.run_dir:
        run_dir = Path(args.run_dir)
        top = Path(*run_dir.parts[:2]) if run_dir.is_absolute() and len(run_dir.parts) > 2 else None
        if top is not None and not simulating() and not top.exists():
            # On real slices an absolute run directory lives on a mounted volume (the
            # manifests mount the bucket at /gcs); without the mount it would land in the
            # container's own filesystem and vanish with the pod, and a restart would
            # silently start over.
            raise UsageError(
                f"--run-dir {run_dir}: {top} does not exist, so the volume it should be on is "
                "not mounted; mount the persistent volume (the manifests mount the bucket with "
                "Cloud Storage FUSE at /gcs) or give a run directory on one"
            )
        return run_dir
    name = args.name or os.environ.get("JOBSET_NAME")
    if name is not None:
        if not name or "/" in name or name in (".", ".."):
            raise UsageError(f"run name {name!r} must be a plain directory name (no '/')")
        return RUNS_DIR / name
    return None


def _check_run_dir(run_dir: Path, identity: dict[str, Any]) -> None:
    """A new run directory must be creatable; an existing one must belong to the same run."""
    if not run_dir.exists():
        parent = run_dir.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(
                f"run directory {run_dir} cannot be created ({parent} is "
                f"{'not writable' if parent.is_dir() else 'not a directory'}); choose a --run-dir "
                "under a writable directory"
            )
        return
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} exists and is not a directory; choose another --run-dir")
    recorded_path = run_dir / COMMAND_FILE
    if not recorded_path.exists():
        from elastic_dew.record import EVENTS_FILE

        others = sorted(entry.name for entry in run_dir.iterdir())
        if others and not (run_dir / EVENTS_FILE).exists():
            raise UsageError(
                f"run directory {run_dir} is not an elastic_dew run (no {COMMAND_FILE} or "
                f"{EVENTS_FILE}, and it holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}); "
                "give a new or empty directory, or the directory of an earlier run to resume it"
            )
        return
    try:
        recorded = json.loads(recorded_path.read_text())
    except ValueError as err:
        raise UsageError(f"{recorded_path} is not valid JSON ({err}); is {run_dir} a run directory?") from None
    differences = [
        f"{key} {recorded.get(key)!r} -> {identity[key]!r}"
        for key in _IDENTITY
        if key in recorded and recorded[key] != identity[key]
    ]
    if differences:
        raise UsageError(
            f"{run_dir} holds another run ({'; '.join(differences)}); resume it with its own "
            "settings, or start a new run with another --run-dir or --name"
        )


def plan(args: argparse.Namespace) -> Plan:
    """Check every argument and decide the run, touching nothing; raises :class:`UsageError`."""
    from elastic_dew.elastic.config import ElasticConfig

    simulate = simulating()
    for name in ("steps", "slices", "devices_per_slice", "global_batch", "log_every", "min_slices"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    _positive("--snapshot-every", args.snapshot_every, zero_ok=True)
    _positive("--checkpoint-every", args.checkpoint_every, zero_ok=True)
    if args.poll_interval is not None and not args.poll_interval > 0:
        raise UsageError(f"--poll-interval {args.poll_interval} must be > 0 seconds")
    if not simulate:
        given = [f for f in ("slices", "devices_per_slice") if getattr(args, f) is not None]
        if given or args.chaos:
            flags = [("--" + f.replace("_", "-")) for f in given] + (["--chaos"] if args.chaos else [])
            raise UsageError(
                f"{', '.join(flags)} only apply to simulated slices, but JAX_PLATFORMS="
                f"{os.environ.get('JAX_PLATFORMS')!r} runs on the real allocation; drop them, or "
                "set JAX_PLATFORMS=cpu to simulate"
            )
    if args.checkpoint_kind == "multi_tier" and simulate:
        raise UsageError(
            "--checkpoint-kind multi_tier needs TPU workers with colocated-Python sidecars "
            "under Pathways (JAX_PLATFORMS=proxy); simulated slices use --checkpoint-kind orbax"
        )
    if args.checkpoint_dir is not None and _URL.match(args.checkpoint_dir) is None and not os.path.isabs(
        args.checkpoint_dir
    ):
        raise UsageError(
            f"--checkpoint-dir {args.checkpoint_dir} must be an absolute path or a gs:// URL"
        )
    slices = args.slices or DEFAULT_SLICES
    devices_per_slice = args.devices_per_slice or DEFAULT_DEVICES_PER_SLICE
    if args.min_slices is not None and simulate and args.min_slices > slices:
        raise UsageError(
            f"--min-slices {args.min_slices} is above the {slices} slices; use at most {slices}, "
            "or leave it out for pause-resume"
        )
    if args.chaos:
        from elastic_dew.simulate import parse_schedule

        try:
            schedule = parse_schedule(args.chaos)
        except ValueError as err:
            raise UsageError(f"--chaos: {err}") from None
        for fault in schedule:
            if fault.slice is not None and fault.slice >= slices:
                raise UsageError(
                    f"--chaos fault {fault} names slice {fault.slice}, but there are {slices} slices "
                    f"(0..{slices - 1}); fix the schedule or raise --slices"
                )

    module = _load_recipe(args.recipe)
    defaults = getattr(module, "DEFAULTS", {})
    steps = args.steps or defaults.get("steps", 100)
    global_batch = args.global_batch or defaults.get("global_batch", 32)
    poll = args.poll_interval or (SIMULATED_POLL_INTERVAL if simulate else None)
    try:
        config = ElasticConfig(
            minimum_slice_count=args.min_slices,
            global_batch=global_batch,
            snapshot_every=args.snapshot_every,
            checkpoint_every=args.checkpoint_every,
            checkpoint_kind=args.checkpoint_kind,
            checkpoint_dir=args.checkpoint_dir
            or (MULTI_TIER_DIR if args.checkpoint_kind == "multi_tier" else None),
            **({"poll_interval": poll} if poll is not None else {}),
        )
    except ValueError as err:
        raise UsageError(str(err)) from None
    if simulate:
        from elastic_dew.elastic.protocol import check_batch_for_every_slice_count

        try:
            check_batch_for_every_slice_count(config, slices, devices_per_slice)
        except ValueError as err:
            raise UsageError(f"--global-batch: {err}") from None

    overrides = _parse_overrides(args.overrides)
    result = Plan(
        recipe=module.__name__,
        module=module,
        overrides=overrides,
        steps=steps,
        global_batch=global_batch,
        simulate=simulate,
        slices=slices,
        devices_per_slice=devices_per_slice,
        chaos=args.chaos,
        config=config,
        run_dir=_run_dir_of(args),
        log_every=args.log_every,
        seed=args.seed,
        print_summary=not getattr(args, "no_summary", False),
    )
    if result.run_dir is not None:
        _check_run_dir(result.run_dir, result.identity())
    return result


def parse_recipe_args(recipe: str, argv: list[str] | None = None) -> argparse.Namespace:
    """The ``train`` options for one recipe (``python -m recipes.lm --steps 50``), checked.

    A bad option exits with status 2 and the message, as argparse does, before anything runs.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m {_module_name(recipe)}",
        description=f"Train the {recipe} recipe elastically (the options of elastic-dew train).",
    )
    _add_arguments(parser, recipe=False)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.recipe = recipe
    # This is a program's entry point: log as elastic-dew does (absl, imported by the
    # recipe's libraries, may have put its own handler on the root logger already).
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True
    )
    try:
        plan(args)
    except UsageError as err:
        parser.error(str(err))
    return args


def process_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``prepare_process`` arguments for this invocation: on CPU, the host device count."""
    if not simulating():
        return {}
    count = (args.slices or DEFAULT_SLICES) * (args.devices_per_slice or DEFAULT_DEVICES_PER_SLICE)
    return {"xla_flags": f"--xla_force_host_platform_device_count={count}"}


def _choose_run_dir(p: Plan) -> Path:
    if p.run_dir is not None:
        return p.run_dir
    from elastic_dew.runtime import run_timestamp

    run_dir = RUNS_DIR / run_timestamp()
    if run_dir.exists():
        raise UsageError(
            f"{run_dir} already exists (another run started this second); give --name or "
            "--run-dir to resume a run, or start again for a new timestamp"
        )
    return run_dir


def _record_command(run_dir: Path, p: Plan) -> None:
    path = run_dir / COMMAND_FILE
    if path.exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    entry = {**p.identity(), "steps": p.steps, "chaos": p.chaos, "argv": sys.argv}
    path.write_text(json.dumps(entry, indent=2) + "\n")


@contextlib.contextmanager
def _quiet_logs(tty: bool):
    """Keep the output about the run: the progress display reports steps (the trainer's own
    step lines would repeat them), and Orbax's per-file INFO lines (through absl) drown
    everything else unless ``-v`` asked for debug output. On a terminal, where the bar shows
    every stop and resume, pathwaysutils' INFO lines about attempts are left out too."""
    quiet = [logging.getLogger("elastic_dew.trainer")]
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        quiet.append(logging.getLogger("absl"))
        if tty:
            quiet.append(logging.getLogger("pathwaysutils"))
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


@contextlib.contextmanager
def _log_above(progress: Any):
    """On a terminal, route the root logger's terminal output above the progress bar."""
    from elastic_dew.progress import ProgressLogHandler

    root = logging.getLogger()
    swapped = []
    if progress.tty:
        for handler in list(root.handlers):
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and stream is progress.stream:
                replacement = ProgressLogHandler(progress, stream)
                replacement.setFormatter(handler.formatter)
                replacement.setLevel(handler.level)
                root.removeHandler(handler)
                root.addHandler(replacement)
                swapped.append((handler, replacement))
    try:
        yield
    finally:
        for handler, replacement in swapped:
            root.removeHandler(replacement)
            root.addHandler(handler)


def _train(p: Plan, build: Callable[..., dict]) -> int:
    from elastic_dew import record
    from elastic_dew.progress import Progress
    from elastic_dew.runtime import PREEMPTED_EXIT, Preempted
    from elastic_dew.trainer import Trainer

    run_dir = _choose_run_dir(p)
    try:
        parts = build(**p.overrides)
    except (TypeError, ValueError) as err:
        raise UsageError(f"--set: {err}") from None
    missing = {"init", "loss", "optimizer", "dataset"} - set(parts)
    if missing:
        raise UsageError(f"recipe {p.recipe}.build() returned no {', '.join(sorted(missing))}")
    resuming = (run_dir / record.EVENTS_FILE).exists()
    _record_command(run_dir, p)
    logger.info(
        "%s %s in %s: %d steps, global batch %d, %s",
        "resuming" if resuming else "training",
        p.recipe,
        run_dir,
        p.steps,
        p.global_batch,
        f"{p.slices} simulated slices of {p.devices_per_slice} devices" if p.simulate else "real slices",
    )

    progress = Progress(p.steps, total_slices=p.slices if p.simulate else None, log_every=p.log_every)
    with contextlib.ExitStack() as stack:
        if p.simulate:
            from elastic_dew.simulate import SimulatedSlices

            stack.enter_context(
                SimulatedSlices(
                    p.slices,
                    p.devices_per_slice,
                    schedule=p.chaos or None,
                    fault_log=run_dir / record.FAULTS_FILE,
                )
            )
        stack.enter_context(_log_above(progress))
        stack.enter_context(_quiet_logs(progress.tty))
        stack.callback(progress.close)
        trainer = Trainer(
            init=parts["init"],
            loss=parts["loss"],
            optimizer=parts["optimizer"],
            dataset=parts["dataset"],
            config=p.config,
            run_dir=run_dir,
            log_every=p.log_every,
            seed=p.seed,
            progress=progress,
        )
        try:
            result = trainer.fit(p.steps)
        except Preempted as stop:
            logger.warning(
                "preempted at step %d; its checkpoint is in %s: run the same command again to resume",
                stop.step,
                run_dir,
            )
            return PREEMPTED_EXIT

    if not p.print_summary:
        return 0
    picture = None
    try:
        picture = record.draw_timeline(run_dir)
    except RuntimeError as err:  # matplotlib missing
        logger.warning("%s", err)
    print(record.format_summary(result.summary, run_dir))
    if picture is not None:
        print(f"\ntimeline: {picture}")
    return 0


def _error(prog: str, err: Exception) -> int:
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 2


def train(args: argparse.Namespace, build: Callable[..., dict] | None = None) -> int:
    """Train ``args.recipe`` (with ``build``, else the recipe module's) after ``prepare_process``."""
    try:
        p = plan(args)
        return _train(p, build or p.module.build)
    except UsageError as err:
        return _error("elastic-dew train", err)


def run(args: argparse.Namespace) -> int:
    """The ``elastic-dew train`` command: check, prepare the process, train."""
    from elastic_dew.runtime import prepare_process

    try:
        plan(args)
    except UsageError as err:
        return _error("elastic-dew train", err)
    prepare_process(**process_options(args))  # before the backend opens: the host device count
    return train(args)
