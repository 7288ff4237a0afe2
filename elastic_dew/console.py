"""A run on a terminal: its options, and the program that runs what they ask for.

``elastic-dew train`` and each recipe's ``python -m elastic_dew.recipes.NAME`` take the same options and
show a run the same way (:class:`~elastic_dew.terminal.Terminal`), so both come here. The
options are the command line's words for the settings of a :class:`~elastic_dew.run.RunConfig`'s
parts (its own, :class:`~elastic_dew.run.SimConfig`, :class:`~elastic_dew.train_config.TrainConfig`,
:class:`~elastic_dew.elastic.config.ElasticConfig`,
:class:`~elastic_dew.observe.sinks.ObserveOptions`): which fields are offered, each flag's
metavar, what a flag left out means, and the two flags that are not their field's name
(:data:`RUN_FLAGS`). The parts declare each setting once, in Python terms: its default,
its range, and what it means (its docstring entry, the flag's help); one builder
(:mod:`elastic_dew.settings`) makes the flags from both (all of them: :func:`add_options`,
one alone: :func:`add_flag`), and a refused setting, whose error carries its field and
the settings it names as data, is worded with their flags (:func:`refusal`).
"""

from __future__ import annotations

import argparse
import ast
import logging
import sys
from collections.abc import Callable
from typing import Any, Literal, cast

from elastic_dew import run
from elastic_dew.runtime import PREEMPTED_EXIT
from elastic_dew.run import recipes
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.observe import sinks as observing
from elastic_dew.flags import Flag, add_flags, command_line_text, flag_name, flag_namer, given
from elastic_dew.mentions import name_mentions
from elastic_dew.settings import SettingError
from elastic_dew.terminal import Terminal
from elastic_dew.train_config import TrainConfig

__all__ = ["RUN_FLAGS", "add_options", "add_flag", "observe_of", "flag_of", "refusal", "config_of", "parse_overrides",
           "setup", "train", "Terminal", "main"]

_SECONDS = "SECONDS"

#: The run's options: each part of a :class:`~elastic_dew.run.RunConfig` (by the name the
#: run configuration gives it; ``run`` is its own fields), its configuration class and the
#: fields the command line offers, each with its :class:`~elastic_dew.flags.Flag`, in
#: ``--help``'s order. Field names are unique across the parts.
RUN_FLAGS: dict[str, tuple[type, dict[str, Flag]]] = {
    "run": (run.RunConfig, {
        "overrides": Flag("a recipe setting, e.g. --set d_model=128 (repeatable)", "KEY=VALUE", "--set"),
        "steps": Flag(metavar="N", default="default: the recipe's"),
        "run_dir": Flag(metavar="DIR"),
        "name": Flag(default="default $JOBSET_NAME, else a timestamp"),
    }),
    "sim": (run.SimConfig, {"slices": Flag(metavar="S"), "devices_per_slice": Flag(metavar="D"), "schedule": Flag()}),
    "train": (TrainConfig, {
        "log_every": Flag(metavar="L"),
        "seed": Flag(),
        "sharding": Flag(),
        "microbatch": Flag(metavar="M", default="default: the whole per-device batch at once"),
        "eval_every": Flag(metavar="E", default="default: never"),
    }),
    "elastic": (ElasticConfig, {
        "minimum_slice_count": Flag(metavar="K", name="--min-slices",
                                    default="default: pause-resume, wait for every slice"),
        "poll_interval": Flag(metavar=_SECONDS, default="default 0.5 on simulated slices, pathwaysutils' 10 on real ones"),
        "timeout": Flag(metavar=_SECONDS),
        "max_attempts": Flag(metavar="N"),
        "retry_reset_steps": Flag(metavar="STEPS"),
        "step_timeout": Flag(metavar=_SECONDS, default="default: 20 times the median step, at least 60 s, or 600 s when "
                             "the run waits for every slice; 600 s before 5 steps are timed"),
        "model_axis": Flag(metavar="N", default="default 1"),
        "global_batch": Flag(metavar="B", default="default: the recipe's"),
        "snapshot_every": Flag(metavar="K"),
        "checkpoint_every": Flag(metavar="M"),
        "checkpoint_dir": Flag(metavar="DIR", default="default RUN_DIR/checkpoints; for multi_tier the workers' local "
                               "directory, default /tmp/mtc_checkpoints"),
        "checkpoint_kind": Flag(),
        "mtc_backup_minutes": Flag(metavar="MINUTES", default="default {default}, the guide's"),
        "mtc_init_timeout": Flag(metavar=_SECONDS, default="default {default}, Orbax's"),
        "storage_timeout": Flag(metavar=_SECONDS, default="default: 10 times the state's transfer time at the "
                                "bandwidth measured so far, at least 180 s"),
        "grace_period": Flag(metavar=_SECONDS, default="default: $ELASTIC_DEW_GRACE_PERIOD, which the rendered JobSets "
                             "set, else 30"),
        "max_failed_saves": Flag(metavar="N"),
        "max_uncommitted_seconds": Flag(metavar=_SECONDS, default="default: no limit"),
        "quarantine_damaged": Flag(),
    }),
    "observe": (observing.ObserveOptions, {
        "log_format": Flag(),
        "tensorboard": Flag(default="default: on when tensorboardX, the observe extra, is installed"),
        "goodput_export": Flag(),
    }),
}


def flag_of(field: str) -> str:
    """The command-line flag of a run setting, by field name (``snapshot_every`` ->
    ``--snapshot-every``, ``minimum_slice_count`` -> ``--min-slices``).

    Raises:
      KeyError: no run option sets ``field``.
    """
    for _, flags in RUN_FLAGS.values():
        if field in flags:
            return flag_name(field, flags[field])
    raise KeyError(f"no run option sets {field!r}")


def refusal(error: ValueError) -> str:
    """A refusal worded for the command line: each setting it mentions
    (:func:`~elastic_dew.settings.mention`) named by its flag, a
    :class:`~elastic_dew.settings.SettingError` headed by its own flag unless it starts
    with it."""
    if isinstance(error, SettingError):
        return command_line_text(error, RUN_FLAGS.values())
    if isinstance(error, run.UsageError):
        return error.wording(flag_namer(RUN_FLAGS.values()))
    return name_mentions(str(error), flag_namer(RUN_FLAGS.values()))


def add_options(parser: argparse.ArgumentParser, *, recipe: bool = True) -> None:
    """The run's options on ``parser`` (the recipe as a positional when ``recipe``)."""
    if recipe:
        parser.add_argument("recipe", metavar="RECIPE",
                            help="a recipe name (lm, mlp, ...) or a module path with build() (mypkg.myrecipe)")
    for part, (owner, flags) in RUN_FLAGS.items():
        add_flags(parser, owner, flags, part=part)
    # The demo prints its own summary after the last restart.
    parser.add_argument("--no-summary", action="store_true", help=argparse.SUPPRESS)


def add_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """The flag of the run setting ``name`` alone on ``parser``, built as :func:`add_options`
    builds it (for a command that passes one setting on, as ``demo`` passes ``--log-format``
    to its training processes); read it back with :func:`config_of` or :func:`observe_of`.

    Raises:
      KeyError: no run option sets ``name``.
    """
    for part, (owner, flags) in RUN_FLAGS.items():
        if name in flags:
            add_flags(parser, owner, {name: flags[name]}, part=part)
            return
    raise KeyError(f"no run option sets {name!r}")


def _given(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The settings parsed options give, by part and field."""
    return {part: given(args, owner, flags, part=part) for part, (owner, flags) in RUN_FLAGS.items()}


def observe_of(args: argparse.Namespace) -> observing.ObserveOptions:
    """The :class:`~elastic_dew.observe.sinks.ObserveOptions` that parsed options ask for
    (raises its :class:`~elastic_dew.settings.SettingError`)."""
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
        sys.stderr.write(f"{prog}: error: {refusal(err)}\n")
        raise SystemExit(run.USAGE_EXIT) from None
    # Third-party libraries stay at INFO; -v (set by the command line) is elastic_dew's own.
    # ObserveOptions checked log_format against LOG_FORMATS, as setup_logging checks it again.
    setup_logging(cast('Literal["auto", "text", "json"]', options.log_format), level=logging.INFO)
    return Terminal(prog, observe=options, summary=not getattr(args, "no_summary", False), word=refusal)


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
    :class:`~elastic_dew.settings.SettingError` for a value outside its field's
    declaration, :class:`~elastic_dew.run.UsageError` for a bad ``--set`` or an unknown recipe.
    """
    given = _given(args)
    own = given["run"]
    recipe = recipe if recipe is not None else args.recipe
    own["overrides"] = parse_overrides(own.get("overrides", ()))
    elastic = None
    if given["elastic"]:
        batch = recipes.recipe_defaults(recipe).get("global_batch", ElasticConfig.global_batch)
        elastic = ElasticConfig(**{"global_batch": batch, **given["elastic"]})
    return run.RunConfig(
        recipe=recipe,
        **own,
        elastic=elastic,
        train=TrainConfig(**given["train"]),
        sim=run.SimConfig(**given["sim"]) if given["sim"] else None,
        observe=observe if observe is not None else observe_of(args),
    )


def main(recipe: str, build: Callable[..., dict], argv: list[str] | None = None) -> int:
    """A recipe's ``python -m elastic_dew.recipes.NAME [options]``: the same run as ``elastic-dew train NAME``."""
    prog = f"python -m {recipe if '.' in recipe else 'elastic_dew.recipes.' + recipe}"
    parser = argparse.ArgumentParser(
        prog=prog, description=f"Train the {recipe} recipe elastically (the options of elastic-dew train)."
    )
    add_options(parser, recipe=False)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    code = train(args, prog, recipe=recipe, build=build)
    if argv is None and code == PREEMPTED_EXIT:  # the program itself: leave once the stop is durable
        from elastic_dew.runtime.preemption import exit_preempted

        exit_preempted()
    return code


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
