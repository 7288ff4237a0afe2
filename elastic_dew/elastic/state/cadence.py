"""A tier's save cadence, and what a save's seconds are.

:class:`Cadence` is a tier's cadence: a save every ``every`` steps, announced as the tier's
phase (:mod:`~elastic_dew.elastic.hooks`) first, so the simulator can fire a fault inside it,
and timed by :func:`timed_save`, which runs the wait for the step in flight off the save's
clock (see :mod:`~elastic_dew.elastic.state.tiers` for what a save's seconds are).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax

from elastic_dew.elastic import hooks
from elastic_dew.elastic.events import Save

__all__ = ["StepWait", "timed_save", "Cadence"]


#: Waits for the step in flight (the protocol's, bounded by its step deadline).
StepWait = Callable[[], Any]


def timed_save(tier: str, step: int, save: Callable[[], bool], wait_step: StepWait | None = None) -> Save:
    """Run ``save`` (which returns whether the tier took the state) and describe it.

    ``wait_step`` (the wait for the step in flight, when one is) runs first, off the clock:
    the event's ``seconds`` are ``save``'s alone (the module's rule).
    """
    if wait_step is not None:
        wait_step()
    started = time.monotonic()
    taken = bool(save())
    return Save(tier=tier, step=step, taken=taken, seconds=time.monotonic() - started)


class Cadence:
    """A tier's cadence: a save every ``every`` steps (never when ``every`` is 0), announced
    as the tier's phase and timed by :func:`timed_save`."""

    name: str
    every: int

    def due(self, step: int) -> bool:
        """Whether ``step`` is on the cadence (its :meth:`on_step` saves)."""
        return bool(self.every) and not step % self.every

    def _save(self, step: int, state: Any, meta: dict, mesh: jax.sharding.Mesh) -> bool:
        raise NotImplementedError

    def on_step(
        self, step: int, state: Any, meta: dict, mesh: jax.sharding.Mesh, wait_step: StepWait | None = None
    ) -> Save | None:
        """Save ``state`` if ``step`` is on the cadence; the save event, or ``None``."""
        if not self.due(step):
            return None
        hooks.phase(self.name, step)
        return timed_save(self.name, step, lambda: self._save(step, state, meta, mesh), wait_step)
