"""The old module paths of the elastic layer, kept for one minor version.

A module that moved when ``elastic_dew/elastic/`` was split by job keeps its old path as a
small module whose names resolve to the module that now holds them, with a
``DeprecationWarning`` naming the new path in :func:`elastic_dew._deprecation.warn`'s one
wording (``CHANGELOG.md``, Deprecated).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from elastic_dew._deprecation import warn

__all__ = ["moved"]


def moved(old: str, new: str, public_only: bool = False) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``old`` that serves ``new``'s names with a warning.

    Args:
        old: the module path users imported (the shim's ``__name__``).
        new: the module path that now holds its names.
        public_only: serve only the names in ``new``'s ``__all__`` (for a package that took
            a module's place, so its submodules are never shadowed).

    Returns:
        The function to bind as the old module's ``__getattr__``.
    """

    def __getattr__(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module = importlib.import_module(new)
        if public_only and name not in module.__all__:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        value = getattr(module, name)
        warn(f"{old}.{name}", f"{new}.{name}")
        return value

    return __getattr__
