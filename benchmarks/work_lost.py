"""Item 3: work lost per failure, read from a run's events with the run record's commit rule."""

from __future__ import annotations

from typing import Any

from elastic_dew.elastic.events import Event, Step, Stop
from elastic_dew.record import as_events, committed_step_lines

__all__ = ["work_lost"]


def work_lost(events: list[Event | dict[str, Any]]) -> dict[str, int]:
    """Steps recomputed (step lines a later resume re-did) and examples lost or repeated.

    ``events``: typed events or their JSON lines. Committed steps, ordered by step, must
    tile the example indices from 0 with no gap (an example lost) and no overlap (an
    example seen twice).
    """
    typed = as_events(events)
    steps = [e for e in typed if isinstance(e, Step)]
    committed = sorted(as_events(committed_step_lines(typed)), key=lambda e: e.step)
    lost = duplicated = 0
    position = 0
    for e in committed:
        start, end = e.examples
        if start > position:
            lost += start - position
        elif start < position:
            duplicated += min(position, end) - start
        position = max(position, end)
    failures = sum(1 for e in typed if isinstance(e, Stop) and e.reason in ("slice_lost", "preempted"))
    return {
        "steps_recomputed_total": len(steps) - len(committed),
        "failures": failures,
        "examples_lost": lost,
        "examples_duplicated": duplicated,
    }
