"""Goodput and badput of a run, and the commit rule of its step lines.

A step line is *committed* if and only if no later ``resume`` line has a ``step`` at or
below its own: a resume at step R means the run went back to R and re-did every step from
there, so the earlier lines for those steps describe work that was thrown away.

The summary splits the run's wall time (the sum of every process's span) into productive
step time and badput, under the lower-case names of ml-goodput-measurement's
``BadputType``; ``other`` is the remainder, so productive time and the categories add up to
the wall time exactly. The summary's keys are a contract (``docs/trainer.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elastic_dew.elastic import events as ev
from elastic_dew.record.log import as_events, has_wall
from elastic_dew.record.params import state_digest

__all__ = ["BADPUT_CATEGORIES", "committed_flags", "committed_steps", "summarize"]

#: ml-goodput-measurement's ``BadputType`` names, lower-cased, in the order the summary lists them.
BADPUT_CATEGORIES: tuple[str, ...] = (
    "program_startup",
    "unproductive_checkpoint_save_time",
    "unproductive_checkpoint_restore_time",
    "elastic_slice_down",
    "elastic_scale_up",
    "elastic_reinitialization",
    "wasted_progress_from_disruption",
    "data_loading_sync",
    "other",
)


def committed_flags(events: list[ev.Event]) -> list[bool]:
    """For each event, whether it is a committed step line (see :func:`committed_steps`)."""
    flags = [False] * len(events)
    lowest_later_resume = float("inf")
    for i in range(len(events) - 1, -1, -1):
        event = events[i]
        if isinstance(event, ev.Resume):
            lowest_later_resume = min(lowest_later_resume, event.step)
        elif isinstance(event, ev.Step):
            flags[i] = event.step < lowest_later_resume
    return flags


def committed_steps(events: Iterable[ev.Event | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The step lines that count: those with no later ``resume`` at or below their step.

    Returned as JSON lines (a given mapping is copied as it was), in file order, so after a
    rollback the re-done steps come last.
    """
    lines = [e for e in events if not isinstance(e, Mapping) or e.get("event") in ev.KINDS]
    typed = as_events(lines)
    return [
        e.to_json() if isinstance(e, ev.Event) else dict(e)
        for e, ok in zip(lines, committed_flags(typed), strict=True)
        if ok
    ]


def _processes(events: list[tuple[ev.Event, bool]]) -> list[list[tuple[ev.Event, bool]]]:
    """Split the record (events with their commit flags) into the runs of one process each."""
    processes: list[list[tuple[ev.Event, bool]]] = []
    for event, ok in events:
        if isinstance(event, ev.Start) or not processes:
            processes.append([])
        processes[-1].append((event, ok))
    return processes


def _begin(start: ev.Start) -> float | None:
    """When a process began: its own start, or failing that its ``start`` line."""
    for value in (start.process_start, start.wall):
        if value == value:  # not nan
            return value
    return None


def _span(process: list[ev.Event]) -> float:
    """Seconds from the process's start (or first event) to its last event."""
    walls = [e.wall for e in process if has_wall(e)]
    if not walls:
        return 0.0
    first = process[0]
    begin = _begin(first) if isinstance(first, ev.Start) else None
    if begin is None:
        begin = min(walls)
    return max(0.0, max(walls) - begin)


def summarize(events: Iterable[ev.Event | Mapping[str, Any]], *, params: Any = None) -> dict[str, Any]:
    """The ``summary.json`` fields of a run, from its events (and final parameters).

    ``events`` are typed events or their JSON lines.
    ``final_step``: the highest committed step (``None`` before any step).
    ``state_digest``: :func:`~elastic_dew.record.params.state_digest` of ``params``
    (``None`` without them).
    ``examples_consumed``: the end of the committed example ranges; with exactly-once data
    they tile ``[0, examples_consumed)``.
    ``goodput``: productive step time (the ``seconds`` of committed steps less their
    ``data_seconds``) over wall time.
    ``badput``: seconds by category:

    - ``program_startup``: each process's start to its first resume, less that resume's
      own durations (counted below), plus the time a ``fresh`` resume took to build the
      initial state;
    - ``unproductive_checkpoint_save_time``: the ``seconds`` of ``save`` events (both tiers);
    - ``unproductive_checkpoint_restore_time``: ``durations.restore`` of snapshot and
      checkpoint resumes;
    - ``elastic_slice_down``: ``detection`` and ``wait_for_slices`` of resumes that follow
      a ``slice_lost`` stop;
    - ``elastic_scale_up``: every duration of ``live`` resumes;
    - ``elastic_reinitialization``: ``mesh_and_compile`` of snapshot, checkpoint and fresh
      resumes;
    - ``wasted_progress_from_disruption``: the ``seconds`` of step lines that were not
      committed;
    - ``data_loading_sync``: the ``data_seconds`` of committed steps;
    - ``other``: the remainder, so that productive time and badput add up to the wall time.
    """
    events = as_events(events)
    flags = committed_flags(events)
    committed = [e for e, ok in zip(events, flags, strict=True) if ok]

    badput = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    productive = 0.0
    wall = 0.0
    counts: dict[str, dict[str, int]] = {"stops": {}, "resumes": {}, "faults": {}}

    def count(group: str, key: str) -> None:
        counts[group][key] = counts[group].get(key, 0) + 1

    processes = _processes(list(zip(events, flags, strict=True)))
    for process in processes:
        wall += _span([event for event, _ in process])
        start = process[0][0] if isinstance(process[0][0], ev.Start) else None
        last_stop: ev.Stop | None = None
        first_resume_seen = False
        for event, is_committed in process:
            if isinstance(event, ev.Save):
                badput["unproductive_checkpoint_save_time"] += float(event.seconds)
            elif isinstance(event, ev.Stop):
                last_stop = event
                count("stops", event.reason)
            elif isinstance(event, ev.Fault):
                count("faults", event.action)
            elif isinstance(event, ev.Resume):
                count("resumes", event.source)
                d = event.durations
                if event.source == "live":
                    badput["elastic_scale_up"] += sum(d.values())
                else:
                    if event.source == "fresh":  # building a fresh state is part of starting up
                        badput["program_startup"] += d["restore"]
                    else:
                        badput["unproductive_checkpoint_restore_time"] += d["restore"]
                    badput["elastic_reinitialization"] += d["mesh_and_compile"]
                    if last_stop is not None and last_stop.reason == "slice_lost":
                        badput["elastic_slice_down"] += d["detection"] + d["wait_for_slices"]
                if not first_resume_seen and start is not None:
                    first_resume_seen = True
                    begin = _begin(start)
                    if begin is not None and has_wall(event):
                        # The resume's own durations are counted in their own categories.
                        startup = event.wall - begin - sum(d.values())
                        badput["program_startup"] += max(0.0, startup)
                last_stop = None
            elif isinstance(event, ev.Step):
                # A step's ``seconds`` span all of it, its ``data_seconds`` (waiting for the
                # batch) included.
                seconds = float(event.seconds)
                data = min(float(event.data_seconds), seconds)
                if is_committed:
                    productive += seconds - data
                    badput["data_loading_sync"] += data
                else:
                    badput["wasted_progress_from_disruption"] += seconds

    accounted = productive + sum(v for k, v in badput.items() if k != "other")
    badput["other"] = wall - accounted
    if -1e-6 < badput["other"] < 0:
        badput["other"] = 0.0

    ranges = [e.examples for e in committed if e.examples is not None]
    return {
        "final_step": max((e.step for e in committed), default=None),
        "state_digest": state_digest(params) if params is not None else None,
        "examples_consumed": max((int(r[1]) for r in ranges), default=0),
        "goodput": productive / wall if wall > 0 else 0.0,
        "badput": {k: round(v, 6) for k, v in badput.items()},
        "wall_seconds": round(wall, 6),
        "productive_seconds": round(productive, 6),
        "committed_steps": len(committed),
        "processes": len(processes),
        "stops": counts["stops"],
        "resumes": counts["resumes"],
        "faults": counts["faults"],
    }
