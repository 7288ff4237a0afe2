"""The command line's builder of flags from settings: every ``elastic-dew`` command's.

A command line offers some fields of a configuration as flags (:class:`Flag`: the metavar,
and the flag where it is not the field's name, ``--min-slices`` for
``minimum_slice_count``; the help is the first sentence of the field's entry in its class's
docstring); :func:`add_flags` puts them on an :mod:`argparse` parser, :func:`given` reads
the fields back, and :func:`command_line_text` words a
:class:`~elastic_dew.settings.SettingError` with the flags. Not public: the settings'
declarations are (:mod:`elastic_dew.settings`); this is how the command line offers them.
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import dataclasses
import functools
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from elastic_dew.mentions import Namer, python_name
from elastic_dew.settings import SettingError

__all__ = ["Flag", "Flags", "flag_name", "add_flags", "given", "flag_namer", "command_line_text"]


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a command line offers one setting.

    Args:
      help: what the flag does; ``{default}`` is filled with the field's default. Left out:
        the first sentence of the field's entry in its class's docstring, the one
        declaration of what the setting means, and ``default``.
      metavar: the value's name in the help (default: the field's name in capitals).
      name: the flag, where it is not the field's name with dashes (``--min-slices`` for
        ``minimum_slice_count``).
      required: whether the flag must be given (default: when the field has no default).
      short: a one-letter spelling beside the flag (``-n``).
      default: with the docstring's help, what the flag left out means, in parentheses
        (default: ``default VALUE``, ``default: on`` or ``off`` for a switch, nothing for ``None``).
    """

    help: str | None = None
    metavar: str | None = None
    name: str | None = None
    required: bool | None = None
    short: str | None = None
    default: str | None = None


_ROLE = re.compile(r":\w+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``(\w+)(?:=(\w+))?``|``([^`]+)``")


def _field_help(owner: type, field: str, name: Callable[[str, str | None], str | None]) -> str:
    """The first sentence of ``field``'s entry (``field: ...``) in ``owner``'s docstring, the
    one place the setting is described, in plain words: a literal is its text (a setting
    quoted in it, alone or with a value, as ``name`` words it unless that gives ``None``), a
    cross-reference its name. A sentence ends at a full stop and a space (so the entry says
    "for example", not "e.g."); an entry left out is a ``KeyError`` as the command is built."""
    entry, indent, doc = None, 0, _doc(owner)
    for line in doc.splitlines():
        depth = len(line) - len(line.lstrip())
        if entry is not None and line.strip() and depth > indent:
            entry += " " + line.strip()
        elif entry is not None:
            break
        elif re.match(rf" *{field}(?: / \w+)*: ", line):
            entry, indent = line.split(": ", 1)[1], depth
    if entry is None:
        if not doc:  # no docstring and no source (python -OO from bytecode alone): the default alone
            return ""
        raise KeyError(f"{owner.__name__}'s docstring has no entry for {field!r}")
    entry = re.split(r"\.(?:\s|$)", entry, maxsplit=1)[0]
    entry = _ROLE.sub(lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], entry)

    def plain(m: re.Match[str]) -> str:
        named = name(m[1], m[2]) if m[1] is not None else None
        return named or m[0].strip("`")

    return _LITERAL.sub(plain, entry)


@functools.cache
def _doc(owner: type) -> str:
    """``owner``'s docstring, read from its source where ``python -OO`` dropped it."""
    if sys.flags.optimize < 2:
        return inspect.getdoc(owner) or ""
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(owner))).body[0]
        return (ast.get_docstring(node) if isinstance(node, ast.ClassDef) else None) or ""
    except (OSError, TypeError):
        return ""


def _help(owner: type, field: str, flag: Flag, default: Any, shown: bool,
          name: Callable[[str, str | None], str | None]) -> str:
    """A flag's help: its own, else its field's documented meaning and what leaving it out means."""
    if flag.help is not None:
        return flag.help.format(default=default)
    after = flag.default
    if after is None and not shown and default not in (None, ""):
        after = f"default: {'on' if default else 'off'}" if isinstance(default, bool) else f"default {default}"
    text = _field_help(owner, field, name)
    return " ".join(filter(None, (text, after and f"({after.format(default=default)})")))


#: A command's flags: each offered field of a configuration and its :class:`Flag`, in the
#: order of its ``--help``.
Flags = Mapping[str, Flag]


_hints = functools.cache(typing.get_type_hints)


def _kind(owner: type, field: str) -> Any:
    """The type a flag parses for ``field`` (``X`` for ``X | None``)."""
    kind = _hints(owner)[field]
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(t for t in typing.get_args(kind) if t is not type(None))
    return kind


def flag_name(field: str, flag: Flag) -> str:
    """The flag of ``field``: its override, else ``--`` and the field's name with dashes.

    Args:
      field: the field's name.
      flag: how the command line offers it.

    Returns:
      The flag (``--snapshot-every``).
    """
    return flag.name or "--" + field.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser | Any, owner: type, flags: Flags, *, part: str | None = None,
              defaults: bool = False) -> None:
    """Offer the fields of the configuration ``owner`` named in ``flags`` on ``parser``.

    Each is built from its declaration: its choices, a repeatable flag for a tuple or a
    mapping, an on/off field (``bool``) as a switch ``--X`` when it is off by default and as
    ``--X/--no-X`` otherwise, a number parsed as its type. A field without a default is a
    required flag. A flag left out parses as ``None`` (nothing given), so the field's own
    default applies, or, with ``defaults``, as that default (which ``--help`` then shows).
    ``part`` prefixes each ``dest`` (``part.field``), so fields of several configurations
    can share one parser (read them back with :func:`given`).

    Args:
      parser: an :mod:`argparse` parser or argument group.
      owner: the configuration dataclass.
      flags: the fields offered, each with its :class:`Flag`, in ``--help``'s order.
      part: the prefix of each ``dest``.
      defaults: a flag left out parses as its field's default, which ``--help`` shows.
    """
    fields = {f.name: f for f in dataclasses.fields(owner)}
    namer = flag_namer([(owner, flags)])
    for name, flag in flags.items():
        field, kind = fields[name], _kind(owner, name)
        default = None if field.default is dataclasses.MISSING else field.default
        required = flag.required
        if required is None:
            required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        text = _help(owner, name, flag, default, defaults or required,
                     lambda f, value: namer(f, value) if f in flags else None)
        options: dict[str, Any] = {"dest": f"{part}.{name}" if part else name, "help": text}
        if required:
            options["required"] = True
        elif defaults and default is not None:
            options["default"] = default
        if "choices" in field.metadata:
            options["choices"] = field.metadata["choices"]
        elif kind is bool:
            options.update(default=None, action="store_true" if default is False else argparse.BooleanOptionalAction)
        elif typing.get_origin(kind) in (tuple, collections.abc.Mapping):
            options.update(action="append", default=[])
        elif kind in (int, float):
            options["type"] = kind
        if flag.metavar or (kind is not bool and "choices" not in field.metadata):
            options["metavar"] = flag.metavar or name.upper()
        parser.add_argument(*filter(None, (flag.short, flag_name(name, flag))), **options)


def given(args: argparse.Namespace, owner: type, flags: Flags, *, part: str | None = None) -> dict[str, Any]:
    """The fields of ``owner`` that parsed options give.

    Args:
      args: the parsed options.
      owner: the configuration dataclass the flags were built for.
      flags: its flags, as :func:`add_flags` took them.
      part: the prefix :func:`add_flags` took.

    Returns:
      Each field whose flag was given (not ``None``, not an empty repeatable one), by name:
      the keywords of ``owner``.
    """
    values = {name: getattr(args, f"{part}.{name}" if part else name, None) for name in flags}
    return {name: value for name, value in values.items() if value is not None and value != []}


def flag_namer(commands: Iterable[tuple[type, Flags]], first: type | str | None = None) -> Namer:
    """How a command line names a setting a refusal mentions.

    Args:
      commands: the command's configurations, each with its flags.
      first: the configuration whose flags win where two offer a field of one name.

    Returns:
      A namer: a field and its value to ``--flag value`` (a switch alone for ``True``,
      ``--no-X`` for ``False``); a field no flag offers keeps its Python name.
    """
    named: dict[str, tuple[str, Any]] = {}
    for owner, flags in sorted(commands, key=lambda command: command[0] is not first):
        for field, flag in flags.items():
            named.setdefault(field, (flag_name(field, flag), _kind(owner, field)))

    def name(field: str, value: str | None) -> str:
        if field not in named:
            return python_name(field, value)
        flag, kind = named[field]
        if kind is bool and value in ("True", "False"):
            return flag if value == "True" else f"--no-{flag[2:]}"
        return flag if value is None else f"{flag} {value}"

    return name


def command_line_text(error: SettingError, commands: Iterable[tuple[type, Flags]]) -> str:
    """``error`` as a command line says it.

    Args:
      error: the refusal.
      commands: the command's configurations, each with its flags.

    Returns:
      The refusal with each setting it mentions, and the refused one, named by its flag
      (:func:`flag_namer`).
    """
    commands = sorted(commands, key=lambda command: command[0] is not error.owner)
    flag = next((flag_name(error.field, flags[error.field]) for _, flags in commands if error.field in flags), None)
    return error.wording(flag_namer(commands), flag)
