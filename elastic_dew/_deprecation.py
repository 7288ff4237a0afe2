"""How a public name renamed or moved after 0.2.0 keeps working for one minor version.

A public name (``docs/api.md``) that is renamed or moved still works from its old place
until the next minor version, with a ``DeprecationWarning`` in :func:`warn`'s one wording;
``CHANGELOG.md`` lists it under "Deprecated". One shape per kind of rename: a module's name
(:func:`moved_names`), a keyword (:func:`renamed_keywords`), a method (:func:`renamed_method`).
This module imports nothing of elastic_dew, so every layer may use it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["REMOVED_IN", "warn", "moved_names", "renamed_keywords", "renamed_method"]

#: The version that removes what the coming release deprecates (one minor version later).
REMOVED_IN = "0.3"

_F = TypeVar("_F", bound=Callable[..., Any])


def warn(old: str, new: str, *, stacklevel: int = 2) -> None:
    """Warn (``DeprecationWarning``): ``OLD is deprecated and will be removed in REMOVED_IN; use NEW``.

    Args:
        old: the old spelling, as a user wrote it (``Checkpoints(num_slices=...)``).
        new: what to write instead.
        stacklevel: as :func:`warnings.warn`'s, counted from the caller of :func:`warn`.
    """
    message = f"{old} is deprecated and will be removed in {REMOVED_IN}; use {new}"
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)


def moved_names(module: str, names: Mapping[str, str],
                fallback: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves each renamed or moved name from its old place.

    Bind it as the old module's ``__getattr__``: ``__getattr__ = moved_names(__name__,
    {"Plan": "elastic_dew.run.planning.RunPlan"})``. Reading an old name imports its new
    module and returns the same object, with a :func:`warn`.

    Args:
        module: the old module's path (its ``__name__``).
        names: each old name -> the full path of what replaced it (``"package.module.Name"``).
        fallback: the module's own ``__getattr__`` (a package's lazy exports), asked first.

    Returns:
        The function to bind as the module's ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        if fallback is not None:
            try:
                return fallback(name)
            except AttributeError:
                pass
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = target.rpartition(".")
        value = getattr(importlib.import_module(where), new)
        warn(f"{module}.{name}", target)
        return value

    return __getattr__


def renamed_keywords(owner: str, **renames: str) -> Callable[[_F], _F]:
    """A decorator: each old keyword (a key of ``renames``) is accepted as its new name (the
    value), with a :func:`warn`. The decorated function's signature is the new one.

    Args:
        owner: how the user calls it, for the warning (``Checkpoints``).
        renames: old keyword -> new keyword.

    Returns:
        The decorator.

    Raises:
        TypeError: (from the decorated function) a call gives both the old and the new name.
    """

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{owner}() got {old}= and {new}=; {old} is the old name of {new}: "
                                    f"give {new}= only")
                warn(f"{owner}({old}=...)", f"{owner}({new}=...)", stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_method(owner: str, old: str, new: _F) -> _F:
    """``new`` under its old name ``old``, with a :func:`warn` at each call.

    Bind it in the class body after ``new``: ``save = renamed_method("Checkpoints", "save",
    commit)``. Its docstring is ``new``'s, led by ``Deprecated:`` (the public API's snapshot leaves it out).

    Args:
        owner: the class as the user names it, for the warning.
        old: the method's old name.
        new: the method that replaces it (the function, as defined in the class body).

    Returns:
        The method to bind as ``old``.
    """

    @functools.wraps(new)
    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        warn(f"{owner}.{old}", f"{owner}.{new.__name__}", stacklevel=2)
        return new(self, *args, **kwargs)

    alias.__name__ = old
    alias.__qualname__ = f"{owner}.{old}"
    lead = f"Deprecated: use :meth:`{new.__name__}` (this name goes in {REMOVED_IN})."
    alias.__doc__ = f"{lead}\n\n{inspect.getdoc(new) or ''}"
    return alias  # type: ignore[return-value]
