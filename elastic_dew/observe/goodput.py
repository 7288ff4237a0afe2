"""Goodput and badput of a run, counted the way ml-goodput-measurement counts them.

ml-goodput-measurement (0.2.3) measures a job from its first start to its end, so the time
between one process's end and the next one's start (a preempted pod waiting to be
rescheduled) is part of the job and is badput, ``infrastructure_recovery_from_disruption``.
:func:`account` does the same over elastic_dew's run events:

- ``wall_seconds`` runs from the first process's start (its ``process_start``) to the run's
  last event;
- each gap between one process's last event and the next process's start is
  ``infrastructure_recovery_from_disruption``;
- productive time is the ``seconds`` of committed steps less their ``data_seconds``, and the
  rest of the wall time is split into the other categories of :data:`BADPUT_CATEGORIES`,
  with ``other`` the remainder, so productive time and badput add up to the wall time.

Every ``BadputType`` of the library that elastic_dew can measure is a category, under its
lower-case name; :data:`NOT_APPLICABLE` names the others and says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_dew.elastic.events import DURATION_KEYS, Event

__all__ = ["BADPUT_CATEGORIES", "NOT_APPLICABLE", "Goodput", "account"]

#: ml-goodput-measurement's ``BadputType`` names (lower-cased) that elastic_dew measures.
BADPUT_CATEGORIES: tuple[str, ...] = (
    "program_startup",
    "training_prep",
    "unproductive_checkpoint_save_time",
    "unproductive_checkpoint_restore_time",
    "elastic_slice_down",
    "elastic_scale_up",
    "elastic_reinitialization",
    "wasted_progress_from_disruption",
    "infrastructure_recovery_from_disruption",
    "data_loading_sync",
    "other",
)

#: The library's other ``BadputType`` names, with why elastic_dew has no such time.
NOT_APPLICABLE: dict[str, str] = {
    "tpu_initialization": (
        "JAX initialises the TPU backend inside program start-up and the first mesh build; "
        "elastic_dew does not time it apart, so it is counted in program_startup and "
        "elastic_reinitialization"
    ),
    "data_loading_async": (
        "the read-ahead threads load batches while steps run; the library itself leaves this "
        "time out of badput, and the time a step waits for a batch is data_loading_sync"
    ),
    "custom_badput_events": (
        "elastic_dew has no user-defined badput intervals; every interval it measures has a "
        "category of its own"
    ),
}


@dataclasses.dataclass(frozen=True)
class Goodput:
    """A run's wall time split into productive time and badput seconds by category."""

    wall_seconds: float
    productive_seconds: float
    badput: Mapping[str, float]
    processes: int

    @property
    def goodput(self) -> float:
        """Productive time over wall time (0 for an empty run)."""
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


def _as_json(event: Event | Mapping[str, Any]) -> dict[str, Any]:
    return event.to_json() if isinstance(event, Event) else dict(event)


def _processes(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The record split into one list per process, at every ``start`` line."""
    processes: list[list[dict[str, Any]]] = []
    for event in events:
        if event.get("event") == "start" or not processes:
            processes.append([])
        processes[-1].append(event)
    return processes


def _begin(process: list[dict[str, Any]]) -> float | None:
    """When a process started: its ``process_start``, else its first timed event."""
    first = process[0]
    if first.get("event") == "start":
        begin = first.get("process_start", first.get("wall"))
        if begin is not None:
            return float(begin)
    walls = [float(e["wall"]) for e in process if "wall" in e]
    return min(walls) if walls else None


def _end(process: list[dict[str, Any]]) -> float | None:
    walls = [float(e["wall"]) for e in process if "wall" in e]
    return max(walls) if walls else None


def _durations(resume: Mapping[str, Any]) -> dict[str, float]:
    given = resume.get("durations") or {}
    return {k: float(given.get(k, 0.0) or 0.0) for k in DURATION_KEYS}


def _committed(events: list[dict[str, Any]]) -> set[int]:
    """Indices of the committed step lines, by the run record's own commit rule."""
    from elastic_dew.record import committed_steps  # the commit rule's one home

    tagged = [{**e, "_index": i} for i, e in enumerate(events)]
    return {e["_index"] for e in committed_steps(tagged)}


def account(events: Iterable[Event | Mapping[str, Any]]) -> Goodput:
    """Split a run's wall time into productive seconds and badput by category.

    ``events`` are the run's events in record order, typed or as run-record lines (faults
    may be among them; they take no time). The categories:

    - ``program_startup``: each process's start to its first resume, less that resume's own
      durations (counted below);
    - ``training_prep``: the ``restore`` of a ``fresh`` resume (building the initial state);
    - ``unproductive_checkpoint_save_time``: the ``seconds`` of ``save`` events (both tiers);
    - ``unproductive_checkpoint_restore_time``: ``restore`` of snapshot and checkpoint resumes;
    - ``elastic_slice_down``: ``detection`` and ``wait_for_slices`` of resumes after a
      ``slice_lost`` stop;
    - ``elastic_scale_up``: every duration of ``live`` resumes;
    - ``elastic_reinitialization``: ``mesh_and_compile`` of snapshot, checkpoint and fresh
      resumes;
    - ``wasted_progress_from_disruption``: the ``seconds`` of step lines not committed;
    - ``infrastructure_recovery_from_disruption``: from one process's last event to the next
      process's start;
    - ``data_loading_sync``: the ``data_seconds`` of committed steps;
    - ``other``: the remainder.
    """
    events = [_as_json(e) for e in events]
    committed = _committed(events)
    for index, event in enumerate(events):
        event["_index"] = index
    badput = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    productive = 0.0
    processes = _processes(events) if events else []

    first_begin: float | None = None
    last_end: float | None = None
    for process in processes:
        begin, end = _begin(process), _end(process)
        if begin is not None:
            if first_begin is None:
                first_begin = begin
            if last_end is not None:
                badput["infrastructure_recovery_from_disruption"] += max(0.0, begin - last_end)
        if end is not None:
            last_end = end if last_end is None else max(last_end, end)

        start = process[0] if process[0].get("event") == "start" else None
        last_stop: Mapping[str, Any] | None = None
        first_resume_seen = False
        for event in process:
            kind = event.get("event")
            if kind == "save":
                badput["unproductive_checkpoint_save_time"] += float(event.get("seconds", 0.0))
            elif kind == "stop":
                last_stop = event
            elif kind == "resume":
                source = str(event.get("source"))
                d = _durations(event)
                if source == "live":
                    badput["elastic_scale_up"] += sum(d.values())
                else:
                    if source == "fresh":
                        badput["training_prep"] += d["restore"]
                    else:
                        badput["unproductive_checkpoint_restore_time"] += d["restore"]
                    badput["elastic_reinitialization"] += d["mesh_and_compile"]
                    if last_stop is not None and last_stop.get("reason") == "slice_lost":
                        badput["elastic_slice_down"] += d["detection"] + d["wait_for_slices"]
                if not first_resume_seen and start is not None and begin is not None:
                    first_resume_seen = True
                    if "wall" in event:
                        # The resume's own durations are counted in their own categories.
                        startup = float(event["wall"]) - begin - sum(d.values())
                        badput["program_startup"] += max(0.0, startup)
                last_stop = None
            elif kind == "step":
                seconds = float(event.get("seconds", 0.0))
                data = min(float(event.get("data_seconds", 0.0)), seconds)
                if event["_index"] in committed:
                    productive += seconds - data
                    badput["data_loading_sync"] += data
                else:
                    badput["wasted_progress_from_disruption"] += seconds

    wall = max(0.0, last_end - first_begin) if first_begin is not None and last_end is not None else 0.0
    accounted = productive + sum(v for k, v in badput.items() if k != "other")
    badput["other"] = wall - accounted
    if -1e-6 < badput["other"] < 0:
        badput["other"] = 0.0
    return Goodput(
        wall_seconds=round(wall, 6),
        productive_seconds=round(productive, 6),
        badput={k: round(v, 6) for k, v in badput.items()},
        processes=len(processes),
    )
