"""Settings declared once, in Python terms, checked once, and offered on a command line.

A configuration dataclass declares each setting with :func:`setting`: its default and its
range (:class:`Bound`) or ``choices``; :func:`check_fields`, called as it is built, raises
one :class:`SettingError` that carries the configuration, the field and the value as data.
A refusal that names other settings names them with :func:`mention`, so the same error reads
``minimum_slice_count=3`` from Python and ``--min-slices 3`` on a command line, and nothing
rewrites its prose.

A command line offers some of those fields as flags (:class:`Flag`: the metavar, and the
flag where it is not the field's name, ``--min-slices`` for ``minimum_slice_count``; the
help is the first sentence of the field's entry in its class's docstring);
:func:`add_flags` puts them on an :mod:`argparse` parser, :func:`given` reads the fields
back, and :func:`wording` words a :class:`SettingError` with the flags. This module is the
one builder of every ``elastic-dew`` command's settings; it imports nothing of elastic_dew.
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import dataclasses
import functools
import inspect
import numbers
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["Bound", "setting", "check_fields", "SettingError", "mention", "worded", "Flag", "Flags", "flag_name",
           "add_flags", "given", "flag_namer", "wording"]

_NO_VALUE = object()


@dataclasses.dataclass(frozen=True)
class Bound:
    """The range of a numeric setting, declared once and worded for each way it is given.

    Args:
      low: the smallest value.
      strict: values must exceed ``low``.
      unit: what is counted (``seconds``), for the refusal.
      off: 0 turns the setting off (the refusal says so).
      none: ``None`` is allowed (and, if text, what it means: ``pause-resume``).
      whole: the value must be an ``int`` (not a ``bool``).
    """

    low: float
    strict: bool = False
    unit: str = ""
    off: bool = False
    none: bool | str = False
    whole: bool = False

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is in the range.

        Args:
          value: the setting's value.

        Returns:
          ``True`` when the range holds it.
        """
        if value is None:
            return bool(self.none)
        if self.whole and (not isinstance(value, numbers.Integral) or isinstance(value, bool)):
            return False
        return value > self.low if self.strict else value >= self.low

    def refusal(self, value: Any, *, name: str | None = None, flag: str | None = None) -> str:
        """Why ``value`` is refused, as ``name=value ...`` (Python) or ``--flag value ...``.

        Args:
          value: the refused value.
          name: the field, for Python's wording.
          flag: the flag, for a command line's (whose help already says it counts steps, so
            it names only other units).

        Returns:
          The refusal's text.
        """
        rule = f"must be {'>' if self.strict else '>='} {self.low}"
        if flag is not None:  # the command line parses a whole-number flag as an int already
            unit = f" {self.unit}" if self.unit and self.unit != "steps" else ""
            return f"{flag} {value} {rule}{unit}{' (0 turns it off)' if self.off else ''}"
        unit = f" {self.unit}" if self.unit else ""
        if self.whole:
            rule = rule.replace("must be ", "must be a whole number ")
        none = ""
        if self.none:
            none = ", or None" + (f" for {self.none}" if isinstance(self.none, str) else "")
        return f"{name}={value} {rule}{unit}{' (0 turns it off)' if self.off else ''}{none}"


def setting(default: Any = dataclasses.MISSING, help: str | None = None, *, bound: Bound | None = None,
            choices: tuple[Any, ...] | None = None, or_callable: bool = False,
            factory: Callable[[], Any] | None = None, flag: str | None = None, metavar: str | None = None) -> Any:
    """A configuration field with its range or choices, checked by :func:`check_fields`.

    Args:
      default: the field's default (left out: the field is required).
      bound: its range, for a number.
      choices: the values it takes, for a name.
      or_callable: besides its ``choices``, the field takes a callable (a policy the Python
        API gives as a function; a command line offers only the named ones).
      factory: makes each default anew (a mapping's), in place of ``default``.
      help, flag, metavar: deprecated and ignored: a command line's words are its own
        (:class:`Flag`).

    Returns:
      The :func:`dataclasses.field`, its declaration in its metadata.
    """
    if help is not None or flag is not None or metavar is not None:
        from elastic_dew._deprecation import warn

        warn("setting(help=, flag=, metavar=)", "a command line's own Flag (elastic_dew.settings.Flag)")
    metadata = {k: v for k, v in (("bound", bound), ("choices", choices), ("or_callable", or_callable or None))
                if v is not None}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# A mention of a setting inside a refusal's text: the field and, optionally, its value,
# between private-use characters that no message holds otherwise.
_OPEN, _IS, _CLOSE = "\ue000", "\ue001", "\ue002"
_MENTION = re.compile(f"{_OPEN}(\\w+)(?:{_IS}([^{_CLOSE}]*))?{_CLOSE}")


def mention(field: str, value: Any = _NO_VALUE) -> str:
    """``field`` (given ``value``) named inside a :class:`SettingError`'s ``problem``: from
    Python it reads ``field=value`` (``field=`` alone without a value), on a command line as
    the field's flag (``--flag value``, a switch alone for ``True``, ``--no-X`` for ``False``).

    Args:
      field: the setting's field name.
      value: the value it is given (left out: the setting alone).

    Returns:
      The mention, to put in the text (private-use characters mark it as data).
    """
    return f"{_OPEN}{field}{'' if value is _NO_VALUE else _IS + str(value)}{_CLOSE}"


#: How a refusal names one setting it mentions: the field and the value as text (``None``
#: for a mention without a value).
Namer = Callable[[str, "str | None"], str]


def _python_name(field: str, value: str | None) -> str:
    return f"{field}={'' if value is None else value}"


class SettingError(ValueError):
    """A setting outside what its field declares: which configuration, which field, the value.

    Raised once, before any state is touched: by a configuration's own check as it is built
    (:func:`check_fields`: ``bound`` or ``choices`` says which rule), or by a rule that
    spans settings, with ``problem`` (its text, naming other settings with :func:`mention`).
    ``str()`` is the Python wording (``invalid ElasticConfig: snapshot_every=-1 must be >= 0
    steps (0 turns it off)``); :meth:`wording` with a namer is another surface's (the
    command line's ``--snapshot-every -1 must be >= 0 (0 turns it off)``, :func:`wording`).

    Args:
      owner: the configuration class (or, for settings of no class, its name).
      field: the setting refused.
      value: the value it was given.
      bound: the range it is outside.
      choices: the values it may take, which it is not one of.
      problem: what is wrong, for any other rule; it may name settings with :func:`mention`.
    """

    def __init__(self, owner: type | str, field: str, value: Any, bound: Bound | None = None,
                 *, choices: tuple[Any, ...] | None = None, problem: str | None = None) -> None:
        self.owner, self.field, self.value, self.bound, self.choices = owner, field, value, bound, choices
        self._problem = problem  # as given: its mentions marked, for each surface to name
        text = self.wording()
        super().__init__(text if problem is not None else f"invalid {getattr(owner, '__name__', owner)}: {text}")

    def wording(self, name: Namer | None = None, flag: str | None = None) -> str:
        """The refusal, worded for Python or for another surface (a command line's).

        A ``problem`` that does not start by mentioning the field is headed by it
        (``field: ...`` from Python, ``--flag: ...`` given ``name``).

        Args:
          name: names each setting the text mentions (default: Python's ``field=value``).
          flag: the refused field's own flag, to word a range or a choice as ``--flag value ...``.

        Returns:
          The refusal's text.
        """
        if isinstance(name, str):  # the old wording(flag)
            name, flag = None, name
        if self._problem is not None:
            text = worded(self._problem, name)
            head = flag if flag is not None else (self.field if name is None else None)
            return text if head is None or self.names_itself else f"{head}: {text}"
        if self.bound is not None:
            return self.bound.refusal(self.value, name=self.field, flag=flag)
        allowed = ", ".join(map(str, self.choices or ()))
        if dataclasses.is_dataclass(self.owner) and any(
            f.name == self.field and f.metadata.get("or_callable") for f in dataclasses.fields(self.owner)
        ):
            allowed += ", or a callable"
        if flag is not None:
            return f"{flag} {self.value} must be one of {allowed}"
        return f"{self.field}={self.value!r} must be one of {allowed}"

    @property
    def marked_problem(self) -> str | None:
        """What is wrong as given, each setting it mentions still marked (:func:`mention`), for
        another refusal to carry so each surface names them its way; ``None`` for a range or
        choices."""
        return self._problem

    @property
    def problem(self) -> str | None:
        """What is wrong, for a rule other than a range or choices, as Python says it (each
        setting it mentions as ``field=value``); ``None`` for a range or choices."""
        return None if self._problem is None else worded(self._problem)

    @property
    def names_itself(self) -> bool:
        """Whether the problem's text starts by mentioning the refused field (so it needs
        no head naming it)."""
        return self._problem is not None and re.match(f"{_OPEN}{self.field}[{_IS}{_CLOSE}]", self._problem) is not None


def check_fields(config: Any) -> None:
    """Check every field of a configuration dataclass against its declared ``bound`` and
    ``choices``.

    ``None`` is accepted where the bound allows it or the field's default is ``None`` (not
    given).

    Args:
      config: the dataclass instance, as it is built (``__post_init__``).

    Raises:
      SettingError: for the first field outside its declaration.
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        bound, choices = field.metadata.get("bound"), field.metadata.get("choices")
        if value is None and (field.default is None or (bound is not None and bound.none)):
            continue
        if bound is not None and not bound.holds(value):
            raise SettingError(type(config), field.name, value, bound)
        if choices is not None and value not in choices and not (
            field.metadata.get("or_callable") and callable(value)
        ):
            raise SettingError(type(config), field.name, value, choices=choices)


# ----------------------------------------------------------------------- the command line


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
        return ast.get_docstring(ast.parse(textwrap.dedent(inspect.getsource(owner))).body[0]) or ""
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
            return _python_name(field, value)
        flag, kind = named[field]
        if kind is bool and value in ("True", "False"):
            return flag if value == "True" else f"--no-{flag[2:]}"
        return flag if value is None else f"{flag} {value}"

    return name


def worded(text: str, name: Namer | None = None) -> str:
    """``text`` with each setting it mentions named.

    Args:
      text: a refusal's text, with settings named by :func:`mention`.
      name: names each (default: as Python does, ``field=value``).

    Returns:
      The text as the surface of ``name`` says it.
    """
    return _MENTION.sub(lambda m: (name or _python_name)(m[1], m[2]), text)


def wording(error: SettingError, commands: Iterable[tuple[type, Flags]]) -> str:
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
