"""One set of conventions across ``elastic-dew``'s subcommands (issue 13).

Usage errors exit 2 with ``error:``; global options work before or after the subcommand;
every subcommand has a description and every flag with a default shows it in ``--help``.
These run the real parser in-process: nothing here starts JAX or trains.
"""

from __future__ import annotations

import argparse

import pytest

from elastic_dew import cli


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


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_every_subcommand_has_a_description_and_shows_its_defaults(name, capsys):
    argv = [name, "--help"] if name != "train" else [name, "mlp", "--help"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert cli.SUBCOMMANDS[name][1] in out
    parser, _ = cli._parser(argv)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    for action in sub._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        assert action.help, f"{name} {action.option_strings} has no help"
        shown = sub.formatter_class(prog="x")._get_help_string(action)
        if action.default not in (None, False, argparse.SUPPRESS) and not action.required:
            assert "default" in shown, f"{name} {action.option_strings} does not show its default"
