"""The optional libraries of the observability sinks: whether each is installed, and the one
wording of a missing one, naming the extra that installs it.

No library is imported until a sink asks for it (:func:`require`), so importing this
module costs nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["EXTRAS", "available", "missing", "require"]

#: Each optional top-level module: its distribution's name and the elastic-dew extra that
#: installs it.
EXTRAS: dict[str, tuple[str, str]] = {
    "tensorboardX": ("tensorboardX", "observe"),
    "ml_goodput_measurement": ("ml-goodput-measurement", "gke"),
}


def available(module: str) -> bool:
    """Whether the optional top-level ``module`` (a key of :data:`EXTRAS`) is installed."""
    return importlib.util.find_spec(module) is not None


def missing(what: str, module: str) -> str:
    """Why ``what`` cannot run without ``module``, and the extra that installs it."""
    distribution, extra = EXTRAS[module]
    return f"{what} needs {distribution}; install it with pip install 'elastic-dew[{extra}]'"


def require(what: str, module: str, name: str | None = None) -> ModuleType:
    """Import ``name`` (by default ``module`` itself) from the optional ``module``; raises
    ``ImportError`` worded by :func:`missing` when it is not installed."""
    try:
        return importlib.import_module(name or module)
    except ImportError as error:
        raise ImportError(missing(what, module)) from error
