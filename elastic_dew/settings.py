"""Settings declared once, in Python terms, and checked once.

A configuration dataclass declares each setting with :func:`setting`: its default and its
range (:class:`Bound`) or ``choices``; :func:`check_fields`, called as it is built, raises
one :class:`SettingError` that carries the configuration, the field and the value as data.
A refusal that names other settings names them with :func:`mention`, so the same error reads
``minimum_slice_count=3`` from Python and ``--min-slices 3`` on a command line, and nothing
rewrites its prose.

A command line offers some of those fields as flags, built from these declarations by the
command line's own builder (``elastic_dew.flags``, not public). This module imports nothing
of elastic_dew but the mentions' markup (``elastic_dew.mentions``).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any

from elastic_dew import mentions as _mentions
from elastic_dew.mentions import Namer, mention

__all__ = ["Bound", "setting", "check_fields", "SettingError", "mention"]


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


def setting(default: Any = dataclasses.MISSING, *, bound: Bound | None = None, choices: tuple[Any, ...] | None = None,
            or_callable: bool = False, factory: Callable[[], Any] | None = None) -> Any:
    """A configuration field with its range or choices, checked by :func:`check_fields`.

    Args:
      default: the field's default (left out: the field is required).
      bound: its range, for a number.
      choices: the values it takes, for a name.
      or_callable: besides its ``choices``, the field takes a callable (a policy the Python
        API gives as a function; a command line offers only the named ones).
      factory: makes each default anew (a mapping's), in place of ``default``.

    Returns:
      The :func:`dataclasses.field`, its declaration in its metadata.
    """
    metadata = {k: v for k, v in (("bound", bound), ("choices", choices), ("or_callable", or_callable or None))
                if v is not None}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class SettingError(ValueError):
    """A setting outside what its field declares: which configuration, which field, the value.

    Raised once, before any state is touched: by a configuration's own check as it is built
    (:func:`check_fields`: ``bound`` or ``choices`` says which rule), or by a rule that
    spans settings, with ``problem`` (its text, naming other settings with :func:`mention`).
    ``str()`` is the Python wording (``invalid ElasticConfig: snapshot_every=-1 must be >= 0
    steps (0 turns it off)``); :meth:`wording` with a namer is another surface's (the
    command line's ``--snapshot-every -1 must be >= 0 (0 turns it off)``).

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
        if self._problem is not None:
            text = _mentions.name_mentions(self._problem, name)
            head = flag if flag is not None else (self.field if name is None else None)
            names_itself = _mentions.mentions_first(self._problem, self.field)  # needs no head naming it
            return text if head is None or names_itself else f"{head}: {text}"
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
        return None if self._problem is None else _mentions.name_mentions(self._problem)


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
        _check(field, getattr(config, field.name), type(config), field.name)


def check_value(declared_by: type, field: str, value: Any, *, owner: type | str, name: str) -> None:
    """Check ``value`` against the declaration of ``declared_by``'s ``field``, for another
    owner that takes the same setting under its own name (``Checkpoints(max_to_keep=)``
    against ``ElasticConfig.max_to_keep``): one range, declared once.

    Args:
      declared_by: the configuration dataclass that declares the setting.
      field: its field there.
      value: the value given.
      owner: what took it, for the refusal.
      name: the name it took it by.

    Raises:
      SettingError: ``value`` is outside the declaration.
    """
    declared = {f.name: f for f in dataclasses.fields(declared_by)}[field]
    _check(declared, value, owner, name)


def _check(field: dataclasses.Field, value: Any, owner: type | str, name: str) -> None:
    bound, choices = field.metadata.get("bound"), field.metadata.get("choices")
    if value is None and (field.default is None or (bound is not None and bound.none)):
        return
    if bound is not None and not bound.holds(value):
        raise SettingError(owner, name, value, bound)
    if choices is not None and value not in choices and not (field.metadata.get("or_callable") and callable(value)):
        raise SettingError(owner, name, value, choices=choices)
