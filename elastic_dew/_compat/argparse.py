"""argparse's private names elastic_dew uses (read against Python 3.11 to 3.13).

argparse documents only its classes' names as public: a help formatter's methods and a
parser's list of actions are implementation details. The command line's subcommands are
reached through the object ``add_subparsers`` returns (public), so what is left is the one
formatter method that decides whether a flag's help shows its default, and the list of a
parser's actions the tests read.
"""

from __future__ import annotations

import argparse
from elastic_dew._compat import Private

__all__ = ["DefaultsHelpFormatter", "PRIVATE", "actions", "help_string"]

_GET_HELP_STRING = Private(
    "python",
    "argparse:ArgumentDefaultsHelpFormatter._get_help_string",
    why="the one place a formatter adds ' (default: ...)' to a flag's help; overriding it "
    "leaves the default off where there is none to show",
    instead="a public per-argument switch for the shown default (argparse has none)",
    params=("action",),
)
_ACTIONS = Private(
    "python",
    "argparse:ArgumentParser._actions",
    why="a parser's declared arguments, read by tests that compare two commands' flags",
    instead="none public; a parser built from one declaration whose fields the tests read",
    probe=argparse.ArgumentParser,
)

PRIVATE: tuple[Private, ...] = (_GET_HELP_STRING, _ACTIONS)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """A help formatter that shows a flag's default where :meth:`shows_default` says so.

    Subclass it and override :meth:`shows_default` (public), never argparse's own method.
    """

    def shows_default(self, action: argparse.Action) -> bool:
        """Whether ``action``'s help ends with its default (argparse's rule: always)."""
        return True

    def _get_help_string(self, action: argparse.Action) -> str:
        if not self.shows_default(action):
            return action.help or ""
        return super()._get_help_string(action) or ""


def actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument ``parser`` declares, in order (its help action included)."""
    return list(getattr(parser, _ACTIONS.name))


def help_string(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """``action``'s help as ``formatter`` will show it, before ``%`` formatting (its default
    added where the formatter adds it)."""
    return getattr(formatter, _GET_HELP_STRING.name)(action)
