"""A setting named inside a refusal's text, as data, for each surface to word.

A refusal that names other settings names each with :func:`mention`, so the same
:class:`~elastic_dew.settings.SettingError` reads ``minimum_slice_count=3`` from Python and
``--min-slices 3`` on a command line; :func:`name_mentions` words the text for one surface
with its :data:`Namer`. Not public: ``elastic_dew.settings`` offers :func:`mention`; the
command line's namer is :func:`elastic_dew.flags.flag_namer`. Imports nothing of elastic_dew.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["mention", "name_mentions", "mentions_first", "python_name", "Namer"]

_NO_VALUE = object()

# A mention of a setting inside a refusal's text: the field and, optionally, its value,
# between private-use characters that no message holds otherwise.
_OPEN, _IS, _CLOSE = "\ue000", "\ue001", "\ue002"
_MENTION = re.compile(f"{_OPEN}(\\w+)(?:{_IS}([^{_CLOSE}]*))?{_CLOSE}")


def mention(field: str, value: Any = _NO_VALUE) -> str:
    """``field`` (given ``value``) named inside a :class:`~elastic_dew.settings.SettingError`'s ``problem``: from
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


def python_name(field: str, value: str | None) -> str:
    """How Python names a mentioned setting: ``field=value`` (``field=`` without a value).

    Args:
      field: the setting's field name.
      value: its value as text, ``None`` for a mention without one.

    Returns:
      The name.
    """
    return f"{field}={'' if value is None else value}"


def mentions_first(text: str, field: str) -> bool:
    """Whether ``text`` starts by mentioning ``field`` (so a refusal needs no head naming it).

    Args:
      text: a refusal's text, with settings named by :func:`mention`.
      field: the refused setting's field name.

    Returns:
      ``True`` when the first thing the text says is ``field``.
    """
    return re.match(f"{_OPEN}{field}[{_IS}{_CLOSE}]", text) is not None


def name_mentions(text: str, name: Namer | None = None) -> str:
    """``text`` with each setting it mentions named.

    Args:
      text: a refusal's text, with settings named by :func:`mention`.
      name: names each (default: as Python does, ``field=value``).

    Returns:
      The text as the surface of ``name`` says it.
    """
    return _MENTION.sub(lambda m: (name or python_name)(m[1], m[2]), text)
