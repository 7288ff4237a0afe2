"""The text of one scheduled fault, ``ACTION[:SLICE]@WHEN[/PHASE]``: its one grammar.

``WHEN`` is a step (a whole number) or ``+SECONDS`` after the previous fault fired. This
module is the shape of a token and the reading of its numbers, nothing more: the simulator's
schedule (:func:`elastic_dew.simulate.parse_schedule`) splits and writes its tokens here and
checks what the parts name (a known action, whether it takes a slice, a known phase); the
planner writes the schedules it draws (:mod:`elastic_dew.plan.faults`) with :class:`Token`.
It imports nothing of elastic_dew, so the planner reads the simulator's grammar without the
simulator (``tests/test_layering.py``: the schedule's text is a layer of its own, below both).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = ["FORMS", "Token", "seconds", "split", "whole"]

#: The two forms of a token: keyed to a step, and keyed to time after the previous fault.
FORMS: tuple[str, str] = ("ACTION[:SLICE]@STEP[/PHASE]", "ACTION[:SLICE]@+SECONDS[/PHASE]")

_TOKEN = re.compile(r"^(?P<action>[^:@/]*)(?::(?P<slice>[^@/]*))?@(?P<when>[^/]*)(?:/(?P<phase>.*))?$")
_SECONDS = re.compile(r"^\+(?P<seconds>\d+(?:\.\d*)?|\.\d+)$")


@dataclasses.dataclass(frozen=True)
class Token:
    """A fault's text in its parts, each as written (``None``: the part was left out);
    ``str()`` writes it back."""

    action: str
    slice: str | None
    when: str
    phase: str | None

    @classmethod
    def of(cls, action: str, slice: int | None, step: int, after: float | None, phase: str) -> Token:
        """The token of a fault: ``action`` on ``slice`` at ``step``, or ``after`` seconds
        after the previous fault when it is set, at ``phase``."""
        when = f"+{after:g}" if after is not None else str(step)
        return cls(action, None if slice is None else str(slice), when, phase)

    def __str__(self) -> str:
        where = f":{self.slice}" if self.slice is not None else ""
        phase = f"/{self.phase}" if self.phase is not None else ""
        return f"{self.action}{where}@{self.when}{phase}"


def split(text: str) -> Token | None:
    """``text`` in its parts, or ``None`` when it is not of the shape ``ACTION[:SLICE]@WHEN[/PHASE]``."""
    match = _TOKEN.match(text)
    return None if match is None else Token(*match.group("action", "slice", "when", "phase"))


def whole(text: str) -> int | None:
    """A slice or a step as written: a whole number >= 0, or ``None`` when it is not one."""
    return int(text) if text.isascii() and text.isdigit() else None


def seconds(when: str) -> float | None:
    """A ``WHEN`` of the form ``+SECONDS`` (a number >= 0), or ``None`` when it is not one."""
    match = _SECONDS.match(when)
    return None if match is None else float(match.group("seconds"))
