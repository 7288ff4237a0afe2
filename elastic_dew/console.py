"""A run on a terminal: its options, its progress display, its logs and its summary.

``elastic-dew train`` and each recipe's ``python -m recipes.NAME`` take the same options and
show a run the same way, so both come here. The options are built from the fields' own
metadata (:func:`elastic_dew.elastic.config.setting`): :class:`~elastic_dew.run.RunSpec`'s
and the :class:`~elastic_dew.elastic.config.ElasticConfig` settings that have a flag, so a
setting's default, help and range are declared once. A flag left out is ``None`` here and
takes the recipe's or the config's default in :func:`elastic_dew.run.plan`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from elastic_dew import run
from elastic_dew.elastic.config import ElasticConfig, SettingError
from elastic_dew.observe import sinks as observing

__all__ = ["add_options", "flag_of", "refusal", "spec_of", "setup", "train", "Terminal", "main"]

logger = logging.getLogger(__name__)

def _flagged(cls: type) -> list[tuple[dataclasses.Field, type]]:
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        if "flag" not in field.metadata:
            continue
        kind = hints[field.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: the flag's X
            kind = next(t for t in typing.get_args(kind) if t is not type(None))
        out.append((field, kind))
    return out


def _add(parser: argparse.ArgumentParser, field: dataclasses.Field, kind: Any, *, dest: str) -> None:
    meta = field.metadata
    options: dict[str, Any] = {"dest": dest, "help": meta.get("help", "").format(default=field.default)}
    if "metavar" in meta:
        options["metavar"] = meta["metavar"]
    if "choices" in meta:
        options["choices"] = meta["choices"]
    elif typing.get_origin(kind) is tuple:
        options.update(action="append", default=[])
    elif kind in (int, float):
        options["type"] = kind
    parser.add_argument(meta["flag"], **options)


#: The configurations whose flagged fields are the run's options (field names are unique
#: across them).
_OPTION_CLASSES: tuple[type, ...] = (run.RunSpec, ElasticConfig)


def flag_of(field: str) -> str:
    """The command-line flag of a run setting, by field name (``snapshot_every`` ->
    ``--snapshot-every``), read from its declaration; the field name itself when it has none."""
    for cls in _OPTION_CLASSES:
        for f in dataclasses.fields(cls):
            if f.name == field:
                return f.metadata.get("flag", field)
    return field


def refusal(error: ValueError) -> str:
    """A refused setting worded for the command line: a
    :class:`~elastic_dew.elastic.config.SettingError` with its field's flag, anything else as it is."""
    return error.wording(flag_of(error.field)) if isinstance(error, SettingError) else str(error)


def add_options(parser: argparse.ArgumentParser, *, recipe: bool = True) -> None:
    """The run's options on ``parser`` (the recipe as a positional when ``recipe``)."""
    if recipe:
        field = next(f for f in dataclasses.fields(run.RunSpec) if f.name == "recipe")
        parser.add_argument("recipe", metavar=field.metadata["metavar"], help=field.metadata["help"])
    for field, kind in _flagged(run.RunSpec):
        _add(parser, field, kind, dest=field.name)
    for field, kind in _flagged(ElasticConfig):
        _add(parser, field, kind, dest="elastic." + field.name)
    observing.add_options(parser)  # --log-format, --tensorboard, --goodput-export
    # The demo prints its own summary after the last restart.
    parser.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)


def setup(args: argparse.Namespace, prog: str) -> Terminal:
    """A program's start: logging in the ``--log-format`` asked for, and the run's Terminal.

    An observability option that cannot be honoured (``--tensorboard`` without
    tensorboardX, say) is a usage error: ``PROG: error: ...`` and exit status 2, before
    anything is touched.
    """
    from elastic_dew.observe.logs import setup_logging

    try:
        options = observing.options_of(args)
    except ValueError as err:
        sys.stderr.write(f"{prog}: error: {err}\n")
        raise SystemExit(run.USAGE_EXIT) from None
    # Third-party libraries stay at INFO; -v (set by the command line) is elastic_dew's own.
    setup_logging(options.log_format, level=logging.INFO)
    return Terminal(prog, observe=options)


def spec_of(args: argparse.Namespace, recipe: str | None = None) -> run.RunSpec:
    """The :class:`~elastic_dew.run.RunSpec` that parsed options ask for."""
    values = vars(args)
    own = {
        field.name: values[field.name]
        for field in dataclasses.fields(run.RunSpec)
        if field.name in values and values[field.name] is not None
    }
    own["overrides"] = tuple(own.get("overrides", ()))
    elastic = {
        key.removeprefix("elastic."): value
        for key, value in values.items()
        if key.startswith("elastic.") and value is not None
    }
    if recipe is not None:
        own["recipe"] = recipe
    return run.RunSpec(**own, elastic=elastic, summary=not values.get("no_summary", False))


@contextlib.contextmanager
def _quiet_logs(tty: bool) -> Iterator[None]:
    """Keep the output about the run: the progress display reports steps (the trainer's own
    step lines would repeat them), and Orbax's per-file INFO lines (through absl) drown
    everything else unless ``-v`` asked for debug output. On a terminal, where the bar shows
    every stop and resume, pathwaysutils' INFO lines about attempts are left out too."""
    from elastic_dew.observe.logs import is_verbose

    quiet = [logging.getLogger("elastic_dew.trainer")]
    if not is_verbose():
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
def _log_above(progress: Any) -> Iterator[None]:
    """On a terminal, route the root logger's terminal output above the progress bar."""
    from elastic_dew.observe.progress import ProgressLogHandler

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


class Terminal:
    """A run shown on a terminal: ``PROG: error: ...`` for a refusal, a progress display with
    the logs routed above it while it runs, then the summary table and the timeline's path."""

    def __init__(
        self,
        prog: str,
        out: TextIO | None = None,
        err: TextIO | None = None,
        observe: observing.ObserveOptions | None = None,
    ) -> None:
        self.prog = prog
        self._out = out
        self._err = err
        self.observe = observe if observe is not None else observing.ObserveOptions()
        self._observers: list[Any] | None = None

    def refused(self, error: run.UsageError | SettingError) -> None:
        (self._err or sys.stderr).write(f"{self.prog}: error: {refusal(error)}\n")

    @contextlib.contextmanager
    def running(self, plan: run.Plan) -> Iterator[list[Any]]:
        from elastic_dew.observe.progress import Progress

        total_slices = plan.slices if plan.simulate else None
        progress: Any = Progress(plan.steps, total_slices=total_slices, log_every=plan.log_every)
        above, tty = _log_above(progress), progress.tty
        if tty and observing.progress_bar_available():
            # On a terminal, tqdm's bar: it fits the width, has an ETA, keeps logs above.
            from elastic_dew.observe.progress_bar import ProgressBar

            progress = ProgressBar(plan.steps, total_slices=total_slices)
            above = progress.redirect_logging()
        assert plan.run_dir is not None, "the run hands the display its chosen run directory"
        self._observers = observers = observing.chosen(
            self.observe, plan.run_dir, job_name=plan.run_dir.name, total_slices=total_slices,
        )
        try:
            with above, _quiet_logs(tty):
                yield [progress, *observers]
        except BaseException:
            observing.close(observers)
            self._observers = None
            raise
        finally:
            progress.close()

    def finished(self, plan: run.Plan, outcome: run.Outcome) -> None:
        if self._observers is not None:  # TensorBoard's last points are the summary's goodput
            ok = outcome.status == 0 and outcome.result is not None
            observing.close(self._observers, outcome.result.summary if ok else None)
            self._observers = None
        if outcome.status != 0 or not plan.print_summary:
            return
        from elastic_dew import record

        picture = None
        try:
            picture = record.draw_timeline(outcome.run_dir)
        except RuntimeError as err:  # matplotlib missing
            logger.warning("%s", err)
        out = self._out or sys.stdout
        out.write(record.format_summary(outcome.result.summary, outcome.run_dir) + "\n")
        if picture is not None:
            out.write(f"\ntimeline: {picture}\n")


def main(recipe: str, build: Callable[..., dict], argv: list[str] | None = None) -> int:
    """A recipe's ``python -m recipes.NAME [options]``: the same run as ``elastic-dew train NAME``."""
    prog = f"python -m {recipe if '.' in recipe else 'recipes.' + recipe}"
    parser = argparse.ArgumentParser(
        prog=prog, description=f"Train the {recipe} recipe elastically (the options of elastic-dew train)."
    )
    add_options(parser, recipe=False)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return train(args, prog, recipe=recipe, build=build)


def train(args: argparse.Namespace, prog: str, *, recipe: str | None = None,
          build: Callable[..., dict] | None = None) -> int:
    """Run what parsed options ask for on this terminal; the exit status (0, 143, 1 or 2).

    This is a program's entry point: it logs as elastic-dew does (:func:`setup` replaces any
    handler absl, imported by the recipe's libraries, may have put on the root logger)."""
    terminal = setup(args, prog)
    try:
        spec = spec_of(args, recipe)
    except SettingError as err:  # a run setting outside its declaration
        terminal.refused(err)
        return run.USAGE_EXIT
    return run.main(spec, build, terminal)
