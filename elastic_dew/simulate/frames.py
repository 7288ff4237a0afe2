"""Whose code made a call: the frames the simulator's patches and its watch look at.

A patched call (a dispatch, a copy, a save) is the program's own when the first frame
outwards that is not JAX's, NumPy's or a model library's is not a library's that acts on the
program's behalf (Orbax, Grain, pathwaysutils, etils, elastic_dew). Python's public frame
access only (``inspect.currentframe``).
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["LIBRARIES", "OWN_LOOP_MODULES", "THROUGH", "caller", "in_modules", "module_of", "own_loop_on_stack",
           "user_frame"]

#: elastic_dew's own loop and what runs it (it announces its steps): a dispatch with any
#: of these on the stack is never a counted step.
OWN_LOOP_MODULES: tuple[str, ...] = ("elastic_dew.elastic", "elastic_dew.trainer", "elastic_dew.run")
#: Modules whose frames are passed over to find the code that made a call (JAX itself and
#: the libraries a model is written with).
THROUGH = ("jax", "jaxlib", "numpy", "flax", "optax", "functools", "contextlib", "elastic_dew._compat")
#: Modules whose calls are never the program's own: the libraries that place and read on
#: the program's behalf (Orbax, Grain, pathwaysutils, etils) and elastic_dew itself.
LIBRARIES = ("orbax", "grain", "pathwaysutils", "etils", "elastic_dew")


def module_of(frame: Any) -> str:
    """The name of the module whose code ``frame`` runs (``""`` for none)."""
    return frame.f_globals.get("__name__", "") if frame is not None else ""


def in_modules(name: str, modules: tuple[str, ...]) -> bool:
    """Whether module ``name`` is one of ``modules`` or inside one of them."""
    return any(name == module or name.startswith(module + ".") for module in modules)


def caller() -> Any:
    """The frame that called the function calling this (Python's public frame access)."""
    frame = inspect.currentframe()
    try:
        return frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    finally:
        del frame  # a frame kept in its own local is a cycle: it would hold the caller's arrays until gc


def user_frame(frame: Any) -> Any:
    """The first frame from ``frame`` outwards that is the program's own code, or ``None``
    when the call was made by a library (Orbax, Grain, pathwaysutils, elastic_dew) or by
    nothing but JAX.

    Args:
        frame: the innermost frame of the call.

    Returns:
        The program's frame, or ``None``.
    """
    while frame is not None and in_modules(module_of(frame), THROUGH):
        frame = frame.f_back
    if frame is None or in_modules(module_of(frame), LIBRARIES):
        return None
    return frame


def own_loop_on_stack(frame: Any) -> bool:
    """Whether elastic_dew's own loop (:data:`OWN_LOOP_MODULES`) is on the stack from
    ``frame`` outwards: it announces its steps and its tiers itself.

    Args:
        frame: the innermost frame to look from.

    Returns:
        Whether one of its frames is there.
    """
    while frame is not None:
        if in_modules(module_of(frame), OWN_LOOP_MODULES):
            return True
        frame = frame.f_back
    return False
