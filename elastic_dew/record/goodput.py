"""Goodput and badput of a run, and the commit rule of its step lines.

A step line is *committed* if and only if no later ``resume`` line has a ``step`` at or
below its own: a resume at step R means the run went back to R and re-did every step from
there, so the earlier lines for those steps describe work that was thrown away.

The summary splits the run's wall time into productive step time and badput the way
ml-goodput-measurement (0.2.3) does: the wall time runs from the first process's start to
the run's last event, so the time between one process's last event and the next one's start
(a preempted pod waiting to be rescheduled) is in it, as
``infrastructure_recovery_from_disruption``. Every ``BadputType`` of the library that
elastic_dew measures is a category under its lower-case name (:data:`BADPUT_CATEGORIES`);
:data:`NOT_APPLICABLE` names the others and says why. ``other`` is the remainder, so
productive time and the categories add up to the wall time exactly. The summary's keys are
a contract (``docs/trainer.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_dew.elastic import events as ev
from elastic_dew.record.log import as_events, has_wall
from elastic_dew.record.params import state_digest

__all__ = [
    "BADPUT_CATEGORIES",
    "CUSTOM_BADPUT_TYPES",
    "NOT_APPLICABLE",
    "Goodput",
    "account",
    "committed_evals",
    "committed_flags",
    "committed_step_lines",
    "storage_summary",
    "STORAGE_BOUND_SHARE",
    "summarize",
]

#: The share of the wall time that checkpoint saves held the loop above which the summary
#: calls a run storage-bound (a checkpoint skipped while a commit was in flight does too).
STORAGE_BOUND_SHARE = 0.1

#: ml-goodput-measurement's ``BadputType`` names (lower-cased) that elastic_dew measures, in
#: the order the summary lists them.
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
    "custom_badput_events",
    "other",
)

#: The custom badput event types elastic_dew records, under ``custom_badput_events``: the
#: names ml-goodput-measurement's ``record_custom_badput_event_start_time`` is given (MaxText
#: records its evaluation loop as ``eval_step``); the summary's ``custom_badput`` splits the
#: category by them, as the library's ``CUSTOM_BADPUT_EVENTS`` entry does.
CUSTOM_BADPUT_TYPES: tuple[str, ...] = ("eval_step",)

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
}


def committed_flags(events: list[ev.Event], kind: type[ev.Step] | type[ev.Eval] = ev.Step) -> list[bool]:
    """For each event, whether it is a committed line of ``kind`` (step lines by default,
    or ``ev.Eval``: see :func:`committed_step_lines`)."""
    flags = [False] * len(events)
    lowest_later_resume = float("inf")
    for i in range(len(events) - 1, -1, -1):
        event = events[i]
        if isinstance(event, ev.Resume):
            lowest_later_resume = min(lowest_later_resume, event.step)
        elif isinstance(event, kind):
            flags[i] = event.step < lowest_later_resume
    return flags


def committed_evals(events: Iterable[ev.Event | Mapping[str, Any]]) -> list[ev.Eval]:
    """The evaluation passes that count, by the step lines' commit rule: an ``eval`` of step
    S is committed unless a later ``resume`` went back to S or before it (the run re-did
    the step, and evaluated it again). One per evaluated step: of two committed lines of
    one step, the later (a pass a preemption cut short is owed by its checkpoint, and a run
    that resumes from that checkpoint twice runs it twice).

    Args:
        events: the run's events in record order.

    Returns:
        The committed ``eval`` events, one per evaluated step.
    """
    typed = as_events(events)
    committed = [e for e, ok in zip(typed, committed_flags(typed, ev.Eval), strict=True) if ok and isinstance(e, ev.Eval)]
    last = {e.step: i for i, e in enumerate(committed)}
    return [e for i, e in enumerate(committed) if last[e.step] == i]


def committed_step_lines(events: Iterable[ev.Event | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The step lines that count: those with no later ``resume`` at or below their step.

    Returned as JSON lines (a given mapping is copied as it was), in file order, so after a
    rollback the re-done steps come last.

    Args:
        events: the run's events in record order.

    Returns:
        The committed step lines.
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


def _span(process: list[ev.Event]) -> tuple[float, float] | None:
    """A process's start (its ``process_start``, else its first event) and last event."""
    walls = [e.wall for e in process if has_wall(e)]
    if not walls:
        return None
    first = process[0]
    begin = _begin(first) if isinstance(first, ev.Start) else None
    return (min(walls) if begin is None else begin), max(walls)


@dataclasses.dataclass(frozen=True)
class Goodput:
    """A run's wall time split into productive seconds and badput seconds by category.

    Args:
        wall_seconds: from the first process's start to the last event.
        productive_seconds: the committed steps' ``seconds`` less their ``data_seconds``.
        badput: seconds by category (:data:`BADPUT_CATEGORIES`).
        processes: how many processes ran.
        custom: ``custom_badput_events`` by type (``eval_step``).
    """

    wall_seconds: float
    productive_seconds: float
    badput: Mapping[str, float]
    processes: int
    custom: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def goodput(self) -> float:
        """Productive time over wall time (0 for an empty run)."""
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


def account(events: Iterable[ev.Event | Mapping[str, Any]]) -> Goodput:
    """Split a run's wall time into productive seconds and badput by category.

    ``events`` are the run's events in record order, typed or as JSON lines (faults among
    them take no time). The wall time runs from the first process's start to the last
    event. Productive time is the ``seconds`` of committed steps less their
    ``data_seconds``. The categories:

    - ``program_startup``: each process's start to its first resume, less that resume's own
      durations (counted below);
    - ``training_prep``: ``durations.restore`` of ``fresh`` resumes (building the state);
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
    - ``infrastructure_recovery_from_disruption``: from each process's last event to the
      next process's start;
    - ``data_loading_sync``: the ``data_seconds`` of committed steps (the time the loop
      waited for a batch; a read that ended while the step before it still computed
      overlapped the device and is not in it);
    - ``custom_badput_events``: the ``seconds`` of ``eval`` events (every evaluation pass
      that finished; a pass cut short by a fault is in the time it was lost in), split by
      type in :attr:`Goodput.custom` (``eval_step``);
    - ``other``: the remainder, so that productive time and badput add up to the wall time.

    Args:
        events: the run's events in record order.

    Returns:
        The :class:`Goodput` split.
    """
    events = as_events(events)
    flags = committed_flags(events)
    badput = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    custom = dict.fromkeys(CUSTOM_BADPUT_TYPES, 0.0)
    productive = 0.0
    first_begin: float | None = None
    last_end: float | None = None

    processes = _processes(list(zip(events, flags, strict=True)))
    for process in processes:
        span = _span([event for event, _ in process])
        began: float | None = None
        if span is not None:
            began, end = span
            if first_begin is None:
                first_begin = began
            if last_end is not None:
                # A process restarted inside one Python process (an in-process supervisor)
                # shares its process start with the first: it began after the last one's end.
                badput["infrastructure_recovery_from_disruption"] += max(0.0, began - last_end)
                began = max(began, last_end)
            last_end = end if last_end is None else max(last_end, end)
        start = process[0][0] if isinstance(process[0][0], ev.Start) else None
        last_stop: ev.Stop | None = None
        first_resume_seen = False
        for event, is_committed in process:
            if isinstance(event, ev.Save):
                badput["unproductive_checkpoint_save_time"] += float(event.seconds)
            elif isinstance(event, ev.Eval):
                badput["custom_badput_events"] += float(event.seconds)
                custom["eval_step"] += float(event.seconds)
            elif isinstance(event, ev.Stop):
                last_stop = event
            elif isinstance(event, ev.Resume):
                d = event.durations
                if event.source == "live":
                    badput["elastic_scale_up"] += sum(d.values())
                else:
                    if event.source == "fresh":
                        badput["training_prep"] += d["restore"]
                    else:
                        badput["unproductive_checkpoint_restore_time"] += d["restore"]
                    badput["elastic_reinitialization"] += d["mesh_and_compile"]
                    if last_stop is not None and last_stop.reason == "slice_lost":
                        badput["elastic_slice_down"] += d["detection"] + d["wait_for_slices"]
                if not first_resume_seen and start is not None:
                    first_resume_seen = True
                    if began is not None and has_wall(event):
                        # The resume's own durations are counted in their own categories.
                        startup = event.wall - began - sum(d.values())
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
        custom={k: round(v, 6) for k, v in custom.items()},
    )


def summarize(events: Iterable[ev.Event | Mapping[str, Any]], *, params: Any = None) -> dict[str, Any]:
    """The ``summary.json`` fields of a run, from its events (and final parameters).

    ``events`` are typed events or their JSON lines.
    ``final_step``: the highest committed step (``None`` before any step).
    ``state_digest``: :func:`~elastic_dew.record.params.state_digest` of ``params``
    (``None`` without them).
    ``examples_consumed``: the end of the committed example ranges; with exactly-once data
    they tile ``[0, examples_consumed)``.
    ``goodput``, ``badput``, ``wall_seconds``, ``productive_seconds``, ``processes``: see
    :func:`account`.
    ``custom_badput``: ``custom_badput_events`` by type (``eval_step``).
    ``stops``, ``resumes``, ``faults``: counts by reason, source and action.
    ``eval``: the last committed evaluation (``step`` and ``metrics``), or ``None``.
    ``storage``: the persistent tier's checkpoints (:func:`storage_summary`).

    Args:
        events: the run's events in record order.
        params: the final parameters, for ``state_digest``, or ``None``.

    Returns:
        The summary's fields.
    """
    events = as_events(events)
    flags = committed_flags(events)
    committed = [e for e, ok in zip(events, flags, strict=True) if ok and isinstance(e, ev.Step)]
    counts: dict[str, dict[str, int]] = {"stops": {}, "resumes": {}, "faults": {}}
    for event in events:
        group, key = (
            ("stops", event.reason) if isinstance(event, ev.Stop)
            else ("resumes", event.source) if isinstance(event, ev.Resume)
            else ("faults", event.action) if isinstance(event, ev.Fault)
            else (None, None)
        )
        if group is not None and key is not None:
            counts[group][key] = counts[group].get(key, 0) + 1
    time = account(events)
    ranges = [e.examples for e in committed if e.examples is not None]
    return {
        "final_step": max((e.step for e in committed), default=None),
        "state_digest": state_digest(params) if params is not None else None,
        "examples_consumed": max((int(r[1]) for r in ranges), default=0),
        "goodput": time.goodput,
        "badput": dict(time.badput),
        "wall_seconds": time.wall_seconds,
        "productive_seconds": time.productive_seconds,
        "committed_steps": len(committed),
        "processes": time.processes,
        "stops": counts["stops"],
        "resumes": counts["resumes"],
        "faults": counts["faults"],
        "custom_badput": dict(time.custom),
        "eval": (
            {"step": evals[-1].step, "metrics": dict(evals[-1].metrics)} if (evals := committed_evals(events)) else None
        ),
        "storage": storage_summary(events, time.wall_seconds),
    }


def storage_summary(events: Iterable[ev.Event], wall_seconds: float) -> dict[str, Any]:
    """The persistent tier's checkpoints over the whole run, slow told from stuck.

    ``committed``, ``skipped``, ``abandoned``: checkpoints committed (``commit`` events),
    skipped (``storage`` events of outcome ``skipped``: queued behind a commit and replaced,
    or not fitting the grace window) and abandoned (failed, or no storage activity for the
    storage timeout). ``commit_seconds``: each commit's start-to-commit time, in order.
    ``retries``, ``bytes``: what the storage clients saw and moved during the commits.
    ``waited_seconds``: the loop's time held by checkpoint saves (the ``save`` events'
    seconds: the start of each write, a wait for a commit in flight, a preemption's or a
    finished run's commit), and ``waited_share`` its share of ``wall_seconds``.
    ``storage_bound``: whether that share is above :data:`STORAGE_BOUND_SHARE` or a
    checkpoint was skipped.

    Args:
        events: the run's typed events.
        wall_seconds: the run's wall time.

    Returns:
        The fields.
    """
    commits = [e for e in events if isinstance(e, ev.Commit)]
    outcomes = [e.outcome for e in events if isinstance(e, ev.Storage)]
    waited = sum(e.seconds for e in events if isinstance(e, ev.Save) and e.tier == "checkpoint")
    share = waited / wall_seconds if wall_seconds > 0 else 0.0
    skipped = outcomes.count("skipped")
    return {
        "committed": len(commits),
        "skipped": skipped,
        "abandoned": outcomes.count("abandoned"),
        "commit_seconds": [round(e.seconds, 3) for e in commits],
        "retries": sum(e.retries for e in commits),
        "bytes": sum(e.nbytes for e in commits),
        "waited_seconds": round(waited, 3),
        "waited_share": round(share, 4),
        "storage_bound": bool(share > STORAGE_BOUND_SHARE or skipped),
    }
