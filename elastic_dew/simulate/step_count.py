"""Which dispatches are a step, in a loop that announces nothing: the one step rule of both boundaries.

Faults keyed to a step fire at elastic_dew's phase announcements in its own loop; in a loop
that announces nothing they fire at the dispatches of the step function, which
:class:`StepCount` finds by one rule (:meth:`StepCount.count`) that reads only the programs
and their arrays, never the time, so the same loop counts the same steps. The in-process
simulator and the local Pathways backend both count with it; they differ only in the
evidence that a dispatch is the loop's own and carries its state (:meth:`StepCount.step_of`
reads the caller's frame in-process; the backend, which sees no caller, reads whether the
program chains its own results, :meth:`StepCount.chained`). No byte count is too small to be
a step: a loop whose state is two float32 scalars has a step like any other. When the rule
finds no step, the verdict says so and names ``--step-function`` (``docs/simulator.md``,
"Loops elastic_dew did not write").
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

from elastic_dew.simulate.frames import in_modules, module_of, own_loop_on_stack

__all__ = ["LIBRARY_MODULES", "NO_STEP_FOUND", "StepCount"]

logger = logging.getLogger(__name__)

#: Callers whose dispatches are never a step: JAX itself (a primitive applied outside
#: ``jit``, ``jax.numpy``'s own helpers), and libraries a step may call that dispatch
#: programs of their own (Orbax's saves and loads, Grain, pathwaysutils' health probes).
LIBRARY_MODULES: tuple[str, ...] = ("jax", "jaxlib", "orbax", "grain", "pathwaysutils.elastic")

#: What the verdict says of a step-keyed fault when the rule found no step at all.
NO_STEP_FOUND = ("no dispatch was found to be the loop's step (the step rule takes the program that carries "
                 "the loop's state from one dispatch to the next); name the step function with "
                 "--step-function NAME")


#: The JAX namespaces whose functions, applied outside ``jit``, reach a backend as programs of
#: their own name (``jnp.add`` as ``jit_add``): at the backend a program of such a name is
#: JAX's own dispatch, as in-process a dispatch whose caller is in :data:`LIBRARY_MODULES`.
LIBRARY_NAMESPACES: tuple[str, ...] = ("jax.numpy", "jax.lax", "jax.nn", "jax.random", "jax.extend.core.primitives")


@functools.lru_cache(maxsize=1)
def _library_programs() -> frozenset[str]:
    """The program names of JAX's own functions and primitives (``jit_add``, ``jit_mean``)."""
    import importlib

    names: set[str] = set()
    for namespace in LIBRARY_NAMESPACES:
        module = importlib.import_module(namespace)
        for attribute in dir(module):
            value = getattr(module, attribute, None)
            names.add(str(getattr(value, "name", "")) if attribute.endswith("_p") else attribute)
    return frozenset(f"jit_{name}" for name in names if name and not name.startswith("_"))


def _not_a_step_caller(caller: Any) -> bool:
    """Whether a dispatch whose caller is frame ``caller`` is made by a library
    (:data:`LIBRARY_MODULES`) or inside elastic_dew's own loop (:data:`OWN_LOOP_MODULES`,
    anywhere on the stack)."""
    return caller is None or in_modules(module_of(caller), LIBRARY_MODULES) or own_loop_on_stack(caller)


class StepCount:
    """The count of a loop's step dispatches (see :meth:`count` for the rule).

    Args:
        step_function: the name of the loop's step function (the function given to
            ``jax.jit``, whose program is ``jit_NAME``), or ``None`` to find it by the rule.
    """

    def __init__(self, step_function: str | None = None) -> None:
        self.step_function = step_function
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Count from nothing again (a simulator entered anew, a new process of the run)."""
        self.steps = 0
        self._largest = 0
        self._names: set[str] = set()
        self._seen: dict[str, int] = {}

    def count(self, name: str | None, carried: int, *, own: Any = True, carries: bool = True,
              earlier: int = 0) -> int | None:
        """Whether this dispatch of program ``name``, carrying ``carried`` bytes of state, is a
        step of the loop, and its number (1 for the first), or ``None``.

        With :attr:`step_function` set, a step is a dispatch of the function of that name
        (``NAME`` or its program ``jit_NAME``). Otherwise it is a dispatch of the program that
        carries the most bytes through: a program's carried bytes are those of its state (the
        smaller of its inputs' and its results'; the training step takes the state and a
        batch and returns the state, a data generator takes a key and returns a batch, a
        metrics program takes and returns a few scalars). A dispatch counts when its program
        is the loop's own (``own``: a bool, or a callable giving one, asked last) and has the
        name of one counted (its name stays when a resize shrinks the batch), or carries at
        least half as many bytes as the largest counted so far and ``carries`` its state
        through: then its ``earlier`` dispatches, before that was seen, count too. A
        program that carries more than twice the largest counted so far supersedes the
        programs counted before it (an initialiser, a data generator's key): only its name
        counts from then on, and the count starts again. Any number of bytes above none can
        be a step.

        Args:
            name: the program's name, or ``None`` when it has none.
            carried: the bytes of state it carries.
            own: whether the boundary sees it as the loop's own dispatch (in-process: not a
                library's, nor elastic_dew's own loop's).
            carries: whether the boundary sees it carry its state through (through the
                backend: it chains its own results).
            earlier: its dispatches before this one that were not counted.

        Returns:
            The step's number, or ``None`` when the dispatch is not a step.
        """
        function = self.step_function
        if function is not None:
            if name not in (function, f"jit_{function}"):
                return None
        elif name not in self._names and (carried == 0 or 2 * carried < self._largest):
            return None
        elif name not in self._names and not carries:
            return None
        elif not (own() if callable(own) else own):
            return None
        with self._lock:
            if function is None and name not in self._names:
                if self.steps and carried > 2 * self._largest:
                    logger.info("program %s carries %d bytes, more than twice %s: it is the step function",
                                name, carried, sorted(map(str, self._names)))
                    self._names, self.steps = set(), 0
                if name is not None:
                    self._names.add(name)
                self.steps += earlier
            self._largest = max(self._largest, carried)
            self.steps += 1
            return self.steps

    def is_step(self, name: str) -> bool:
        """Whether the dispatches of program ``name`` count as the loop's steps now."""
        function = self.step_function
        return name in (function, f"jit_{function}") if function is not None else name in self._names

    def step_of(self, arrays: list[Any], name: str | None, caller: Any, out_bytes: int = 0) -> int | None:
        """:meth:`count` of an in-process dispatch of program ``name`` on ``arrays`` (its
        results holding ``out_bytes`` bytes), called from frame ``caller``: it carries the
        smaller of its inputs' and its results' bytes, and its evidence is that neither a
        library (:data:`LIBRARY_MODULES`) nor elastic_dew's own loop (:data:`OWN_LOOP_MODULES`)
        dispatched it.

        Returns:
            The step's number, or ``None`` when the dispatch is not a step.
        """
        carried = min(sum(int(a.nbytes) for a in arrays), out_bytes)
        return self.count(name, carried, own=lambda: not _not_a_step_caller(caller))

    def chained(self, name: str, in_bytes: int, out_bytes: int, chained: int) -> int | None:
        """:meth:`count` of a dispatch at the local Pathways backend, which sees no caller:
        ``chained`` bytes of its arguments are results of this program's own previous
        dispatch (the state it carries; at most its results' bytes count). Its evidence that
        it is the loop's own is its name: not one of JAX's own functions applied outside
        ``jit`` (:data:`LIBRARY_NAMESPACES`: ``random.normal``'s two ``multiply``, an eager
        ``x + 1``); that it carries its state, that it takes its previous dispatch's results.
        Its dispatches before that was seen count too (the first took the initial state).

        Returns:
            The step's number, or ``None`` when the dispatch is not a step.
        """
        with self._lock:
            seen = self._seen[name] = self._seen.get(name, 0) + 1
        carried = min(chained, out_bytes) if chained else min(in_bytes, out_bytes)
        return self.count(name, carried, own=lambda: name not in _library_programs(), carries=chained > 0,
                          earlier=seen - 1)
