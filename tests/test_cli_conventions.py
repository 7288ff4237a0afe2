"""One set of conventions across ``elastic-dew``'s subcommands (issue 13).

Usage errors exit 2 with ``error:``; global options work before or after the subcommand;
every subcommand has a description and every flag with a default shows it in ``--help``.
These run the real parser in-process: nothing here starts JAX or trains.
"""

from __future__ import annotations

import argparse

import pytest

from elastic_dew import cli
from elastic_dew._compat.argparse import actions, help_string


def _parse(argv):
    parser, module = cli._parser(argv)
    return parser.parse_args(argv), module


@pytest.mark.parametrize("argv", [["-v", "report", "somewhere"], ["report", "somewhere", "-v"]])
def test_verbose_works_before_or_after_the_subcommand(argv):
    args, _ = _parse(argv)
    assert args.verbose is True


def test_verbose_before_the_subcommand_is_not_reset_by_the_subcommand():
    args, _ = _parse(["-v", "launch", "-n", "2", "--", "true"])
    assert args.verbose is True
    args, _ = _parse(["launch", "-n", "2", "--", "true"])
    assert args.verbose is False


def test_launch_without_a_command_is_a_usage_error_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["launch", "-n", "2"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "elastic-dew launch: error:" in err and "after --" in err


def _all_parsers(parser, prefix=()):
    """Every (command words, parser) pair under ``parser``, nested subcommands included."""
    yield prefix, parser
    subcommands = getattr(parser, "subcommands", None)  # what add_subparsers returned (cli._Parser)
    for word, sub in ({} if subcommands is None else subcommands.choices).items():
        yield from _all_parsers(sub, (*prefix, word))


def _parsers_of(name):
    argv = [name, "mlp"] if name == "train" else [name]
    parser, _ = cli._parser(argv)
    return [(words, p) for words, p in _all_parsers(parser) if words and words[0] == name]


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_every_subcommand_has_a_description_and_every_flag_help_with_its_default(name):
    for words, sub in _parsers_of(name):
        assert sub.description, f"elastic-dew {' '.join(words)} has no description"
        text = " ".join(sub.format_help().split())
        for action in actions(sub):
            if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
                continue
            where = f"elastic-dew {' '.join(words)} {'/'.join(action.option_strings)}"
            assert action.help, f"{where} has no help"
            shown = " ".join(help_string(sub.formatter_class(prog="x"), action).split())
            assert shown.split("%(")[0].strip()[:20] in text, f"{where}: its help is not in --help"
            if action.default not in (None, False, argparse.SUPPRESS, []) and not action.required:
                assert "default" in shown, f"{where} does not show its default {action.default!r}"


@pytest.mark.parametrize("argv", [["k8s", "validate", "x.yaml", "-v"], ["k8s", "render", "-v", "--help"]])
def test_verbose_works_after_a_nested_subcommand_too(argv):
    parser, _ = cli._parser(argv)
    if "--help" in argv:
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 0
    else:
        assert parser.parse_args(argv).verbose is True
