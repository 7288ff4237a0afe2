"""Settings declared once (``elastic_dew.settings``): one refusal, worded for Python and for a
command line from the same data, and flags built by one rule from the fields' names."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types

import pytest

from elastic_dew._compat.argparse import actions
from elastic_dew.flags import Flag, add_flags, given
from elastic_dew.flags import command_line_text as wording
from elastic_dew.settings import Bound, SettingError, check_fields, mention, setting


@dataclasses.dataclass(frozen=True)
class _Pool:
    slices: int = setting(4, bound=Bound(1, whole=True))
    minimum_slice_count: int | None = setting(None, bound=Bound(1, none=True))
    verbose_logs: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if self.minimum_slice_count is not None and self.minimum_slice_count > self.slices:
            raise SettingError(_Pool, "minimum_slice_count", self.minimum_slice_count, problem=(
                f"{mention('minimum_slice_count', self.minimum_slice_count)} is above {mention('slices', self.slices)}; "
                f"lower it, or turn on {mention('verbose_logs', True)}"))


_FLAGS = {"slices": Flag("slices"), "minimum_slice_count": Flag("floor", "K", "--min-slices"),
          "verbose_logs": Flag("log more")}


def test_a_refusal_names_the_settings_it_mentions_as_python_does_and_by_their_flags_on_a_command_line():
    with pytest.raises(SettingError) as refused:
        _Pool(slices=2, minimum_slice_count=3)
    assert refused.value.field == "minimum_slice_count" and refused.value.value == 3
    assert str(refused.value) == "minimum_slice_count=3 is above slices=2; lower it, or turn on verbose_logs=True"
    assert wording(refused.value, [(_Pool, _FLAGS)]) == "--min-slices 3 is above --slices 2; lower it, or turn on --verbose-logs"
    # what a caller reads of the refusal is plain text, its settings named as Python does
    assert refused.value.problem == "minimum_slice_count=3 is above slices=2; lower it, or turn on verbose_logs=True"


def test_the_flags_are_the_fields_names_with_dashes_unless_overridden_and_parse_back_into_the_configuration():
    parser = argparse.ArgumentParser()
    add_flags(parser, _Pool, _FLAGS)
    args = parser.parse_args(["--min-slices", "2", "--verbose-logs"])
    assert _Pool(**given(args, _Pool, _FLAGS)) == _Pool(minimum_slice_count=2, verbose_logs=True)
    assert given(parser.parse_args([]), _Pool, _FLAGS) == {}  # a flag left out: the field's own default
    with pytest.raises(SettingError) as refused:
        _Pool(**given(parser.parse_args(["--slices", "0"]), _Pool, _FLAGS))
    assert str(refused.value) == "invalid _Pool: slices=0 must be a whole number >= 1"
    assert refused.value.problem is None  # a range says what is wrong by its bound
    assert wording(refused.value, [(_Pool, _FLAGS)]) == "--slices 0 must be >= 1"


@dataclasses.dataclass(frozen=True)
class _Documented:
    """A configuration whose docstring is its flags' help.

    Args:
      every: steps between saves (:class:`~elastic_dew.elastic.config.ElasticConfig`'s
        ``snapshot_every`` is one); ``loud=False`` keeps them quiet. What follows the
        first sentence is for Python only.
      loud: log each save.
      label: the save's ``name``, for example ``save``.
    """

    every: int = 10
    loud: bool = True
    label: str | None = None


def test_a_flag_without_help_says_its_fields_first_documented_sentence_with_settings_named_by_their_flags():
    parser = argparse.ArgumentParser()
    add_flags(parser, _Documented, {"every": Flag(), "loud": Flag(), "label": Flag(default="default: none")})
    helps = {a.dest: a.help for a in actions(parser) if a.dest != "help"}
    assert helps == {
        "every": "steps between saves (ElasticConfig's snapshot_every is one); --no-loud keeps them quiet (default 10)",
        "loud": "log each save (default: on)",
        "label": "the save's name, for example save (default: none)",
    }


def test_a_flags_documented_help_survives_python_dropping_docstrings(monkeypatch):
    """Under ``python -OO`` a class's ``__doc__`` is gone (a dataclass makes its signature
    one); the help is read from the source instead."""

    @dataclasses.dataclass(frozen=True)
    class Stripped:
        """Args:
          loud: log each save.
        """

        loud: bool = True

    parser = argparse.ArgumentParser()
    monkeypatch.setattr(sys, "flags", types.SimpleNamespace(optimize=2))
    monkeypatch.setattr(Stripped, "__doc__", "Stripped(loud: bool = True)")
    add_flags(parser, Stripped, {"loud": Flag()})
    assert [a.help for a in actions(parser) if a.dest == "loud"] == ["log each save (default: on)"]


def test_a_flag_whose_field_has_no_documented_entry_fails_as_the_command_is_built():
    with pytest.raises(KeyError, match="_Pool's docstring has no entry for 'slices'"):
        add_flags(argparse.ArgumentParser(), _Pool, {"slices": Flag(metavar="S")})


def test_a_usage_error_is_worded_for_python_by_str_and_for_a_command_line_by_its_namer():
    from elastic_dew import console
    from elastic_dew.run import UsageError

    error = UsageError(f"give {mention('run_dir')} or {mention('name')}")
    assert str(error) == "give run_dir= or name="
    assert console.refusal(error) == "give --run-dir or --name"
