"""Which dispatches are a step, in a loop that announces nothing: the simulator's step count.

Faults keyed to a step fire at elastic_dew's phase announcements in its own loop; in a loop
that announces nothing they fire at the dispatches of the step function, which
:class:`StepCount` finds by a rule that reads only the programs and their inputs, never the
time, so the same loop counts the same steps (``docs/simulator.md``, "Loops elastic_dew did
not write").
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["OWN_LOOP_MODULES", "LIBRARY_MODULES", "StepCount"]

logger = logging.getLogger(__name__)

#: elastic_dew's own loop and what runs it (it announces its steps): a dispatch with any
#: of these on the stack is never a counted step.
OWN_LOOP_MODULES: tuple[str, ...] = ("elastic_dew.elastic", "elastic_dew.trainer", "elastic_dew.run")
#: Callers whose dispatches are never a step: JAX itself (a primitive applied outside
#: ``jit``, ``jax.numpy``'s own helpers), and libraries a step may call that dispatch
#: programs of their own (Orbax's saves and loads, Grain, pathwaysutils' health probes).
LIBRARY_MODULES: tuple[str, ...] = ("jax", "jaxlib", "orbax", "grain", "pathwaysutils.elastic")


def _in(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == module or name.startswith(module + ".") for module in modules)


def _not_a_step_caller(caller: Any) -> bool:
    """Whether a dispatch whose caller is frame ``caller`` is made by a library
    (:data:`LIBRARY_MODULES`) or inside elastic_dew's own loop (:data:`OWN_LOOP_MODULES`,
    anywhere on the stack)."""
    if caller is None or _in(caller.f_globals.get("__name__", ""), LIBRARY_MODULES):
        return True
    frame = caller
    while frame is not None:
        if _in(frame.f_globals.get("__name__", ""), OWN_LOOP_MODULES):
            return True
        frame = frame.f_back
    return False


class StepCount:
    """The count of a loop's step dispatches (see :meth:`step_of` for the rule)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Count from nothing again (a simulator entered anew)."""
        self.steps = 0
        self._largest = 0
        self._names: set[str] = set()

    def step_of(
        self, arrays: list[Any], name: str | None, caller: Any, out_bytes: int = 0, *,
        step_function: str | None = None,
    ) -> int | None:
        """Whether this dispatch of program ``name`` on ``arrays`` (its results holding
        ``out_bytes`` bytes), called from frame ``caller``, is a step of the loop, and its
        number (1 for the first), or ``None``.

        With ``step_function`` set, a step is a dispatch of the function of that name (the
        name of the function given to ``jax.jit``, whether called or compiled). Otherwise it
        is a dispatch made by the loop itself (not by :data:`LIBRARY_MODULES`, not inside
        elastic_dew's own loop, :data:`OWN_LOOP_MODULES`) of the program that carries the
        most bytes through: a program's carried bytes are the smaller of its inputs' and its
        results' (the training step takes the state and a batch and returns the state; a
        data generator takes a key and returns a batch, an evaluation step takes the state
        and returns metrics, a metrics program takes and returns a few scalars). A dispatch
        counts when its program carries at least half as many bytes as the largest counted
        so far, or has the name of one counted (its name stays when a resize shrinks the
        batch). A program that carries more than twice the largest counted so far
        supersedes the programs counted before it (they were an initialiser or a data
        generator dispatched before the first step): only its name counts from then on, and
        the count starts again at 1. The rule reads only the programs and their inputs,
        never the time, so the same loop counts the same steps.

        Args:
            arrays: the dispatch's input arrays.
            name: the program's name, or ``None`` when it has none.
            caller: the frame that dispatched it.
            out_bytes: the bytes its results hold.
            step_function: the name of the loop's step function (the function given to
                ``jax.jit``), or ``None`` to find it by the rule.

        Returns:
            The step's number, or ``None`` when the dispatch is not a step.
        """
        size = sum(int(a.nbytes) for a in arrays)
        carried = min(size, out_bytes)
        if step_function is not None:
            if name != step_function:
                return None
        elif name not in self._names and (carried == 0 or 2 * carried < self._largest):
            return None
        elif _not_a_step_caller(caller):
            return None
        with self._lock:
            if step_function is None:
                if name not in self._names and self.steps and carried > 2 * self._largest:
                    logger.info("program %s carries %d bytes, more than twice %s: it is the step function",
                                name, carried, sorted(map(str, self._names)))
                    self._names, self.steps = set(), 0
                if name is not None:
                    self._names.add(name)
            self._largest = max(self._largest, carried)
            self.steps += 1
            return self.steps
