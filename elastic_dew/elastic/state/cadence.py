"""What a save's seconds are: :func:`timed_save` runs the wait for the step in flight off the
save's clock (see :mod:`~elastic_dew.elastic.state.tiers` for the rule).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from elastic_dew.elastic.events import Save

__all__ = ["StepWait", "timed_save"]


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
