"""A package's public names, each imported from its module when first asked for (so importing
the package starts nothing heavy). It imports nothing of elastic_dew, so every layer may use it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of package ``package``: each name of ``homes`` from its module.

    Args:
        package: the package's ``__name__``.
        homes: each public name -> its module, relative to the package (``loop.protocol``).

    Returns:
        The function to bind as the package's ``__getattr__``.
    """

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return __getattr__
