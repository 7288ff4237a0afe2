"""A run on a terminal: its options, its progress display, its logs and its summary.

``elastic-dew train`` and each recipe's ``python -m recipes.NAME`` take the same options and
show a run the same way, so both come here. The options are built from the fields' own
metadata (:func:`elastic_dew.elastic.config.setting`): the flagged fields of each part of a
:class:`~elastic_dew.run.RunConfig` (its own, :class:`~elastic_dew.run.SimConfig`,
:class:`~elastic_dew.train_config.TrainConfig`,
:class:`~elastic_dew.elastic.config.ElasticConfig`,
:class:`~elastic_dew.observe.sinks.ObserveOptions`), so a setting's default, help and range
are declared once and every flag is built from it by one function (all of them by
:func:`add_options`, one alone by :func:`add_flag`). A flag left out takes its part's
default, as the Python API does. Only
here is a refused setting worded with its flag (:func:`refusal`): the library names a
setting as Python does (``minimum_slice_count=3``), and :func:`in_flags` words each such
mention as its flag (``--min-slices 3``).
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import contextlib
import dataclasses
import logging
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from elastic_dew import run
from elastic_dew.elastic.config import ElasticConfig, SettingError
from elastic_dew.observe import sinks as observing
from elastic_dew.train_config import TrainConfig

__all__ = ["add_options", "add_flag", "observe_of", "flag_of", "in_flags", "refusal", "config_of", "parse_overrides", "setup", "train", "Terminal", "main"]

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
    """``field``'s flag, from its declaration: a choice, a repeatable flag for a tuple or a
    mapping, an on/off field (``bool``) as a switch ``--X`` when it is off by default and as
    ``--X/--no-X`` otherwise, a number parsed as its type. A flag left out parses as ``None``
    (nothing given), so its part's own default applies."""
    meta = field.metadata
    options: dict[str, Any] = {"dest": dest, "help": meta.get("help", "").format(default=field.default)}
    if "metavar" in meta:
        options["metavar"] = meta["metavar"]
    if "choices" in meta:
        options["choices"] = meta["choices"]
    elif kind is bool:
        options.update(default=None,
                       action="store_true" if field.default is False else argparse.BooleanOptionalAction)
    elif typing.get_origin(kind) in (tuple, collections.abc.Mapping):  # repeatable
        options.update(action="append", default=[])
    elif kind in (int, float):
        options["type"] = kind
    parser.add_argument(meta["flag"], **options)


#: The parts of a :class:`~elastic_dew.run.RunConfig` whose flagged fields are the run's
#: options, by the name the run configuration gives each (field names are unique across
#: them; ``run`` is the run configuration's own fields).
_PARTS: dict[str, type] = {
    "run": run.RunConfig, "sim": run.SimConfig, "train": TrainConfig, "elastic": ElasticConfig,
    "observe": observing.ObserveOptions,
}


def _settings() -> Iterator[tuple[str, dataclasses.Field, type]]:
    """Each flagged field of the run's parts: its part's name, the field, the flag's type."""
    for part, cls in _PARTS.items():
        for field, kind in _flagged(cls):
            yield part, field, kind


def flag_of(field: str, owner: type | None = None) -> str:
    """The command-line flag of a run setting, by field name (``snapshot_every`` ->
    ``--snapshot-every``) and, where given, the configuration that declares it, read from
    its declaration; the field name itself when it has none."""
    parts = sorted(_PARTS.values(), key=lambda cls: cls is not owner)  # the owner's own first
    for cls in parts:
        for f in dataclasses.fields(cls):
            if f.name == field:
                return f.metadata.get("flag", field)
    return field


def _flags() -> dict[str, tuple[str, type]]:
    return {field.name: (field.metadata["flag"], kind) for _, field, kind in _settings()}


#: A setting named as Python names it, ``field=value``, or the keyword alone, ``field=``
#: (not an attribute, not a keyword's tail; the end of a range, ``0..slices=``, is one).
_MENTION = re.compile(r"(?<!\w)(?<!\w\.)([a-z][a-z0-9_]*)=([^\s,;)]\S*|(?=[\s,;)]|$))")


def _worded(flag: str, kind: type, value: str) -> str:
    """``flag`` given ``value`` as the command line gives it: a switch alone (``--X``, or
    ``--no-X`` for off), the flag alone for the keyword alone, else ``--flag value``."""
    if kind is bool and value in ("True", "False"):
        return flag if value == "True" else f"--no-{flag[2:]}"
    return f"{flag} {value}" if value else flag


def in_flags(text: str, *, keep: str | None = None,
             flags: collections.abc.Mapping[str, tuple[str, type]] | None = None) -> str:
    """``text`` with each ``field=value`` that names a setting with a flag worded as that flag
    (``minimum_slice_count=3`` -> ``--min-slices 3``, ``tensorboard=False`` ->
    ``--no-tensorboard``, the keyword alone ``run_dir=`` -> ``--run-dir``). ``flags`` maps
    each field to its flag and its type (``bool`` for an on/off one); by default the run's
    and the observability settings'. ``keep`` is a field whose mentions stay as they are (a
    refusal already headed by its flag)."""
    flags = _flags() if flags is None else flags

    def worded(match: re.Match) -> str:
        field = match[1]
        if field == keep or field not in flags:
            return match[0]
        return _worded(*flags[field], match[2])

    return _MENTION.sub(worded, text)


def refusal(error: ValueError) -> str:
    """A refused setting worded for the command line: a
    :class:`~elastic_dew.elastic.config.SettingError` headed by its field's flag, and in any
    refusal each other setting it names worded as its flag (:func:`in_flags`)."""
    if isinstance(error, SettingError):
        return in_flags(error.wording(flag_of(error.field, error.owner)), keep=error.field)
    return in_flags(str(error))


def add_options(parser: argparse.ArgumentParser, *, recipe: bool = True) -> None:
    """The run's options on ``parser`` (the recipe as a positional when ``recipe``)."""
    if recipe:
        field = next(f for f in dataclasses.fields(run.RunConfig) if f.name == "recipe")
        parser.add_argument("recipe", metavar=field.metadata["metavar"], help=field.metadata["help"])
    for part, field, kind in _settings():
        _add(parser, field, kind, dest=f"{part}.{field.name}")
    # The demo prints its own summary after the last restart.
    parser.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)


def add_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """The flag of the run setting ``name`` alone on ``parser``, built as :func:`add_options`
    builds it (for a command that passes one setting on, as ``demo`` passes ``--log-format``
    to its training processes); read it back with :func:`config_of` or :func:`observe_of`."""
    for part, field, kind in _settings():
        if field.name == name:
            _add(parser, field, kind, dest=f"{part}.{name}")
            return
    raise KeyError(f"no run setting {name!r} has a flag")


def _given(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The settings parsed options give, by part: each flag that was given (not ``None``,
    not an empty repeatable one), by its field name."""
    given: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
    for key, value in vars(args).items():
        part, dot, name = key.partition(".")
        if dot and part in given and value is not None and value != []:
            given[part][name] = value
    return given


def observe_of(args: argparse.Namespace) -> observing.ObserveOptions:
    """The :class:`~elastic_dew.observe.sinks.ObserveOptions` that parsed options ask for
    (raises its :class:`~elastic_dew.elastic.config.SettingError`)."""
    return observing.ObserveOptions(**_given(args)["observe"])


def setup(args: argparse.Namespace, prog: str) -> Terminal:
    """A program's start: logging in the ``--log-format`` asked for, and the run's Terminal.

    An observability option that cannot be honoured (``--tensorboard`` without
    tensorboardX, say) is a usage error: ``PROG: error: ...`` and exit status 2, before
    anything is touched.
    """
    from elastic_dew.observe.logs import setup_logging

    try:
        options = observe_of(args)
    except ValueError as err:
        sys.stderr.write(f"{prog}: error: {in_flags(str(err))}\n")
        raise SystemExit(run.USAGE_EXIT) from None
    # Third-party libraries stay at INFO; -v (set by the command line) is elastic_dew's own.
    setup_logging(options.log_format, level=logging.INFO)
    return Terminal(prog, observe=options, summary=not getattr(args, "no_summary", False))


def parse_overrides(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` texts as recipe settings: a Python literal, else the text as a string."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise run.UsageError(f"--set {item!r} is not KEY=VALUE; write e.g. --set d_model=128")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text  # a plain word is a string
        overrides[key.strip()] = value
    return overrides


def config_of(args: argparse.Namespace, recipe: str | None = None,
              observe: observing.ObserveOptions | None = None) -> run.RunConfig:
    """The :class:`~elastic_dew.run.RunConfig` that parsed options ask for.

    A part none of whose options is given is left to the run configuration's own default
    (``sim``, ``elastic``: ``None``); elastic options given take the recipe's global batch
    unless ``--global-batch`` is one of them, as ``RunConfig(elastic=None)`` does. Raises
    :class:`~elastic_dew.elastic.config.SettingError` for a value outside its field's
    declaration, :class:`~elastic_dew.run.UsageError` for a bad ``--set`` or an unknown recipe.
    """
    given = _given(args)
    own = given["run"]
    recipe = recipe if recipe is not None else args.recipe
    own["overrides"] = parse_overrides(own.get("overrides", ()))
    elastic = None
    if given["elastic"]:
        batch = run.recipe_defaults(recipe).get("global_batch", ElasticConfig.global_batch)
        elastic = ElasticConfig(**{"global_batch": batch, **given["elastic"]})
    return run.RunConfig(
        recipe=recipe,
        **own,
        elastic=elastic,
        train=TrainConfig(**given["train"]),
        sim=run.SimConfig(**given["sim"]) if given["sim"] else None,
        observe=observe if observe is not None else observe_of(args),
    )


@contextlib.contextmanager
def _quiet_logs(tty: bool) -> Iterator[None]:
    """Keep the output about the run: the progress display reports steps (the trainer's own
    step lines would repeat them), and Orbax's per-file INFO lines (through absl) drown
    everything else unless ``-v`` asked for debug output. On a terminal every routine line
    goes to the run log rather than the terminal (``elastic_dew.observe.logs``), so only the
    trainer's step lines are left out there."""
    from elastic_dew.observe.logs import is_verbose

    quiet = [logging.getLogger("elastic_dew.trainer")]
    if not is_verbose() and not tty:
        # On a terminal the routine lines go to the run log instead (observe.logs.RunLog).
        quiet.append(logging.getLogger("absl"))
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


class Terminal:
    """A run shown on a terminal: ``PROG: error: ...`` for a refusal, a progress display with
    the logs routed above it while it runs, then the summary table and the timeline's path."""

    def __init__(
        self,
        prog: str,
        out: TextIO | None = None,
        err: TextIO | None = None,
        observe: observing.ObserveOptions | None = None,
        summary: bool = True,
    ) -> None:
        self.prog = prog
        self._out = out
        self._err = err
        #: The observability options the program started with (its log format among them).
        self.observe = observe if observe is not None else observing.ObserveOptions()
        #: Whether the summary is shown at the end (the demo shows its own).
        self.summary = summary

    def refused(self, error: run.UsageError | SettingError) -> None:
        (self._err or sys.stderr).write(f"{self.prog}: error: {refusal(error)}\n")

    @contextlib.contextmanager
    def running(self, plan: run.Plan) -> Iterator[list[Any]]:
        from elastic_dew.observe.logs import is_terminal

        from elastic_dew.observe.logs import attach_run_log

        if getattr(plan, "run_dir", None) is not None:
            attach_run_log(plan.run_dir)  # a terminal's routine lines go to RUN_DIR/run.log
        total_slices = plan.sim.slices if plan.sim is not None else None
        progress: Any
        tty = is_terminal(sys.stderr)
        if tty:
            # tqdm's bar: it fits the width, has an ETA, and writes log records above it.
            from elastic_dew.observe.progress_bar import ProgressBar

            progress = ProgressBar(plan.steps, total_slices=total_slices)
            above: contextlib.AbstractContextManager[None] = progress.redirect_logging()
        else:
            from elastic_dew.observe.progress import Progress

            progress = Progress(plan.steps, total_slices=total_slices, log_every=plan.train.log_every)
            above = contextlib.nullcontext()
        try:
            with above, _quiet_logs(tty):
                yield [progress]
        finally:
            progress.close()

    def finished(self, plan: run.Plan, outcome: run.Outcome) -> None:
        if outcome.status != 0 or not self.summary:
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
        config = config_of(args, recipe, terminal.observe)
    except (SettingError, run.UsageError) as err:  # a setting outside its declaration
        terminal.refused(err)
        return run.USAGE_EXIT
    return run.main(config, build, terminal)
