"""What a user's command line runs: the Python interpreter (with its options) and the module,
script or console script it starts (``elastic-dew simulate -- COMMAND``'s COMMAND)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CommandError", "ResolvedCommand", "resolve", "check_interpreter"]

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?(\.exe)?$")
#: Interpreter options that take a value (``python -W error -m x``).
_VALUED = ("-W", "-X", "-Q")


class CommandError(ValueError):
    """COMMAND is not a Python program this command can run."""


@dataclasses.dataclass(frozen=True)
class ResolvedCommand:
    """COMMAND resolved: the interpreter (with its options) that runs it, and what it runs.

    ``form`` is ``module`` (``python -m``) or ``path`` (a script, or a console script's file).
    """

    interpreter: tuple[str, ...]
    form: str
    target: str
    args: tuple[str, ...]

    def launcher(self) -> list[str]:
        """The child's command: the launcher running this program under the simulator."""
        return [*self.interpreter, "-m", "elastic_dew.simulate.launcher", f"--{self.form}", self.target, *self.args]


def _which(word: str) -> str | None:
    if os.sep in word:
        return word if Path(word).is_file() else None
    return shutil.which(word)


def _shebang_interpreter(path: str) -> list[str] | None:
    """The Python interpreter a script's ``#!`` line names, or None."""
    try:
        with open(path, "rb") as source:
            first = source.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = shlex.split(first[2:])
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if not words or not _PYTHON.match(Path(words[0]).name):
        return None
    found = _which(words[0])
    return [found] if found else None


def resolve(command: Sequence[str]) -> ResolvedCommand:
    """What COMMAND runs; raises :class:`CommandError` saying what is wrong and what works."""
    forms = "python -m MODULE ..., python SCRIPT.py ... or a Python package's console script"
    if not command:
        raise CommandError(f"give the program after --: elastic-dew simulate -- COMMAND (COMMAND: {forms})")
    word, rest = command[0], list(command[1:])
    if _PYTHON.match(Path(word).name):
        interpreter = _which(word)
        if interpreter is None:
            raise CommandError(f"{word} is not on PATH")
        options: list[str] = []
        while rest and rest[0].startswith("-") and rest[0] != "-":
            option = rest.pop(0)
            if option == "-m":
                if not rest:
                    raise CommandError(f"{word} -m needs a module name")
                return ResolvedCommand((interpreter, *options), "module", rest[0], tuple(rest[1:]))
            if option.startswith("-m"):
                return ResolvedCommand((interpreter, *options), "module", option[2:], tuple(rest))
            if option.startswith("-c"):
                raise CommandError(f"{word} -c runs no program file; put the code in a script: {forms}")
            options.append(option)
            if option in _VALUED and rest:
                options.append(rest.pop(0))
        if not rest or rest[0] == "-":
            raise CommandError(f"{shlex.join(command)} names no program; COMMAND must be {forms}")
        if not Path(rest[0]).is_file():
            raise CommandError(f"{rest[0]}: no such file")
        return ResolvedCommand((interpreter, *options), "path", rest[0], tuple(rest[1:]))
    path = _which(word)
    if path is None:
        raise CommandError(f"{word}: command not found (COMMAND must be {forms})")
    named = _shebang_interpreter(path)
    if named is None:
        if path.endswith(".py"):
            named = [sys.executable]
        else:
            raise CommandError(f"{path} is not a Python program (no python #! line); COMMAND must be {forms}")
    return ResolvedCommand(tuple(named), "path", path, tuple(rest))


def check_interpreter(program: ResolvedCommand) -> None:
    """Refuse an interpreter that cannot import elastic_dew (the launcher is part of it)."""
    if os.path.realpath(program.interpreter[0]) == os.path.realpath(sys.executable):
        return
    probe = subprocess.run(
        [program.interpreter[0], "-c", "import importlib.util, sys; "
                                       "sys.exit(importlib.util.find_spec('elastic_dew') is None)"],
        capture_output=True, timeout=60, check=False,
    )
    if probe.returncode != 0:
        raise CommandError(f"{program.interpreter[0]} cannot import elastic_dew; install elastic_dew in the "
                           "environment that runs the program")
