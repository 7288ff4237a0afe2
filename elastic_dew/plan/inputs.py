"""What a plan is computed from: a run's measured costs and the cluster's rates, each with its origin.

Two frozen configurations, each setting declared once (:func:`~elastic_dew.settings.setting`:
default, range) and checked as it is built:

- :class:`Costs`: what the run's own program costs, in seconds, as its run record measures
  them (:func:`measured_costs` reads a run directory): a step, its wait for the batch, the
  loop's own time between steps, a snapshot save and a checkpoint save (the time each
  blocks the loop), a restore by source, an in-process recovery, a process restart and a
  scale-up;
- :class:`Cluster`: the cluster's side: the slice count, a slice's mean time between
  failures, whole-job preemptions per day, how long a lost slice takes to return, hot spare
  slices and how long a restarted controller takes to be rescheduled.

Every figure a plan uses is an :class:`Input`: its value and where it came from (measured in
a run directory, given, or a stated default), so a report can name the origin of each.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastic_dew.settings import Bound, SettingError, check_fields, mention, setting

__all__ = [
    "Costs",
    "KnownCosts",
    "known",
    "unknown",
    "Cluster",
    "Input",
    "COST_FIELDS",
    "CLUSTER_FIELDS",
    "DEFAULT_SLICE_MTBF_HOURS",
    "measured_costs",
    "resolve",
]

_SECONDS = Bound(0, unit="seconds")
_POSITIVE_SECONDS = Bound(0, strict=True, unit="seconds")

#: The slice MTBF assumed when none is given: Llama 3's pre-training saw 419 unexpected
#: interruptions in 54 days on 16,384 GPUs (one per GPU every ~50,700 hours); a slice of
#: 64 accelerators failing as often per accelerator fails every ~790 hours.
DEFAULT_SLICE_MTBF_HOURS = 790.0


def _check_finite(config: Any) -> None:
    """:func:`~elastic_dew.settings.check_fields`, and every number finite."""
    check_fields(config)
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise SettingError(type(config), field.name, value, problem=f"{mention(field.name, value)} must be finite")


@dataclasses.dataclass(frozen=True)
class Costs:
    """What the run's program costs, in seconds (``None``: not known yet).

    Args:
      step_seconds: seconds of one training step on every slice, less its wait for the batch
        (the productive time of the loop's step line).
      data_wait_seconds: seconds a step waits for its batch, the badput ``data_loading_sync``.
      loop_overhead_seconds: seconds per step the training loop spends outside the step, its
        wait for the batch and its saves. The host's work between steps (the loop's
        bookkeeping, its record, the next step's dispatch): in a run record, the ``other``
        badput of a run that meets no fault.
      snapshot_seconds: seconds one in-memory snapshot save blocks the loop.
      checkpoint_seconds: seconds one persistent checkpoint save blocks the loop.
      snapshot_restore_seconds: seconds to restore the state from a snapshot after a slice loss.
      checkpoint_restore_seconds: seconds to restore the state from the newest checkpoint.
      recovery_seconds: seconds of an in-process recovery less its restore and its wait for
        slices: detection, then the mesh and the compile of the step on the slices left.
      restart_seconds: seconds from a new process's start to its first resume, less the
        restore: start-up, mesh and compile.
      scale_up_seconds: seconds of a scale-up when a slice returns (the ``live`` resume).
      new_mesh_seconds: seconds a recovery or scale-up onto a set of slices the process has
        not yet run on costs beyond a typical one: the step's compile for that mesh (or its
        load from the compilation cache) and the restore's.

    Raises:
      elastic_dew.settings.SettingError: a field outside its declared range.
    """

    step_seconds: float | None = setting(None, bound=_POSITIVE_SECONDS)
    data_wait_seconds: float = setting(0.0, bound=_SECONDS)
    loop_overhead_seconds: float = setting(0.0, bound=_SECONDS)
    snapshot_seconds: float | None = setting(None, bound=_SECONDS)
    checkpoint_seconds: float | None = setting(None, bound=_SECONDS)
    snapshot_restore_seconds: float | None = setting(None, bound=_SECONDS)
    checkpoint_restore_seconds: float | None = setting(None, bound=_SECONDS)
    recovery_seconds: float | None = setting(None, bound=_SECONDS)
    restart_seconds: float | None = setting(None, bound=_SECONDS)
    scale_up_seconds: float | None = setting(None, bound=_SECONDS)
    new_mesh_seconds: float = setting(0.0, bound=_SECONDS)

    def __post_init__(self) -> None:
        _check_finite(self)



@dataclasses.dataclass(frozen=True)
class KnownCosts:
    """A :class:`Costs` with every figure known (:func:`known`): what the model computes with."""

    step_seconds: float
    data_wait_seconds: float
    loop_overhead_seconds: float
    snapshot_seconds: float
    checkpoint_seconds: float
    snapshot_restore_seconds: float
    checkpoint_restore_seconds: float
    recovery_seconds: float
    restart_seconds: float
    scale_up_seconds: float
    new_mesh_seconds: float


def unknown(costs: Costs) -> list[str]:
    """The fields of ``costs`` no one has given or measured (every one but
    ``data_wait_seconds``, ``loop_overhead_seconds`` and ``new_mesh_seconds``, 0 unless
    measured or given, is needed), in field order."""
    return [f.name for f in dataclasses.fields(costs) if getattr(costs, f.name) is None]


def known(costs: Costs) -> KnownCosts:
    """``costs`` as the model reads it, every figure known.

    Args:
        costs: the costs.

    Returns:
        The same costs.

    Raises:
        ValueError: a figure is not known yet (:func:`unknown`).
    """
    missing = unknown(costs)
    if missing:
        raise ValueError(f"a plan needs every cost; not known: {', '.join(missing)}")
    return KnownCosts(**dataclasses.asdict(costs))


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The cluster a run is planned for.

    Args:
      slices: slices the run trains on (every one healthy: the whole allocation).
      slice_mtbf_hours: a slice's mean time between failures, in hours; slices fail
        independently, each at this rate.
      preemptions_per_day: whole-job preemptions per day (maintenance, a higher-priority
        job): each ends the controller with SIGTERM after its checkpoint.
      return_minutes: the mean time a lost slice takes to return (repair or replacement),
        in minutes; exponentially distributed.
      spares: hot spare slices beside ``slices``: a lost slice is replaced by a healthy
        spare at once, and returns to the spares when it is repaired.
      reschedule_minutes: how long a restarted controller (a preempted or failed JobSet)
        takes to be rescheduled, in minutes.

    Raises:
      elastic_dew.settings.SettingError: a field outside its declared range.
    """

    slices: int = setting(1, bound=Bound(1, whole=True, unit="slices"))
    slice_mtbf_hours: float = setting(DEFAULT_SLICE_MTBF_HOURS, bound=Bound(0, strict=True, unit="hours"))
    preemptions_per_day: float = setting(0.0, bound=Bound(0))
    return_minutes: float = setting(60.0, bound=Bound(0, unit="minutes"))
    spares: int = setting(0, bound=Bound(0, whole=True, unit="slices"))
    reschedule_minutes: float = setting(5.0, bound=Bound(0, unit="minutes"))

    def __post_init__(self) -> None:
        _check_finite(self)


#: The fields of each configuration, in the order a report lists them.
COST_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Costs))
CLUSTER_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Cluster))


@dataclasses.dataclass(frozen=True)
class Input:
    """One figure of a plan: its value and where it came from (``measured: ...``,
    ``given``, ``default: ...``)."""

    value: Any
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


def measured_costs(run_dir: str | os.PathLike[str]) -> dict[str, Input]:
    """The :class:`Costs` fields a run directory's record measures, each with its origin.

    From ``events.jsonl`` (and the simulator's fault log), by the record's own readers: the
    steps' and saves' figures each a mean (a plan's figures are expectations: a slow first
    save counts as often as it happens), the resumes' and restarts' each a median (a
    recovery that compiles for a set of slices the run meets for the first time happens
    once per set, which the compilation cache then keeps, so over a long run the typical
    recovery is the cost, and a mean of a short run's few would let that one compile set
    it). The figures: the committed steps on the run's largest slice count (after the run's
    first checkpoint at the cadence when there are such steps after it: the steady state,
    without the start-up of the data pipeline and the first compiles), less their wait
    for the batch, and that wait; the loop's time between two consecutive of those steps
    with nothing but saves between them (no fault, stop, resume or evaluation),
    less the second step and the saves (the wall time from one step's line to the next's
    over the step's own time; a mean, 0 when clock noise makes it negative); the taken
    snapshot and checkpoint saves at the cadence (not an attempt's closing save, before a
    ``stop`` that is ``done`` or ``preempted``: it waits for every write to finish); the restore of
    snapshot and of checkpoint resumes; the detection plus mesh and compile of snapshot
    resumes, with their wait for slices where no slice returned during it (an in-process
    recovery: :func:`_recoveries`); the time from each restarted process's start (or the
    previous process's last event, when that is later: a restart inside one Python process)
    to its first resume less that resume's restore (a restart; the first process's when the
    run never restarted); the ``live`` resume (a scale-up). A figure the run never measured
    (no checkpoint resume, say) is left out.

    Args:
        run_dir: a run directory a run wrote.

    Returns:
        Each measured :class:`Costs` field, with its figure and its origin.

    Raises:
        ValueError: the directory holds no run record, or a record with no committed step.
    """
    from elastic_dew import record
    from elastic_dew.record.goodput import committed_flags
    from elastic_dew.elastic import events as ev

    run_dir = Path(run_dir)
    events = _run_events(run_dir)
    flags = committed_flags(events)
    steps = [e for e, ok in zip(events, flags, strict=True) if ok and isinstance(e, ev.Step)]
    if not steps:
        raise ValueError(f"{run_dir / record.EVENTS_FILE} holds no committed step; give a run that trained")
    widest = max(e.slices for e in steps)
    out: dict[str, Input] = {}
    where = str(run_dir)

    def put(name: str, values: list[float], what: str, *, typical: bool = False) -> None:
        if values:
            how, value = ("median", statistics.median(values)) if typical else ("mean", statistics.fmean(values))
            out[name] = Input(round(value, 6), f"measured: {where} ({how} of {len(values)} {what})")

    # The loop's figures in the steady state the model describes (and ``plan --check``
    # measures): from the run's first checkpoint at the cadence on, when there are steps on
    # the widest slice count after it, so a short run's start-up (its data pipeline's first
    # batches, its first compiles) is not spread over every step of a plan.
    closing = _closing_saves(events)
    first = next((i for i, e in enumerate(events) if isinstance(e, ev.Save) and e.taken and e.tier == "checkpoint"
                  and not closing[i]), None)
    steady = events[first + 1:] if first is not None else events
    on_all = [e for e, ok in zip(events, flags, strict=True) if ok and isinstance(e, ev.Step) and e.slices == widest]
    later = {id(e) for e in steady}
    if first is not None and any(id(e) in later for e in on_all):
        on_all = [e for e in on_all if id(e) in later]
        what = f"steps on {widest} slices after the first checkpoint"
    else:
        steady, what = events, f"steps on {widest} slices"
    waits = [min(float(e.data_seconds), float(e.seconds)) for e in on_all]
    put("step_seconds", [e.seconds - w for e, w in zip(on_all, waits, strict=True)], what)
    put("data_wait_seconds", waits, what)
    overheads = _loop_overheads(steady, widest)
    put("loop_overhead_seconds", overheads, f"gaps between consecutive {what}")
    if "loop_overhead_seconds" in out and out["loop_overhead_seconds"].value < 0:
        out["loop_overhead_seconds"] = dataclasses.replace(out["loop_overhead_seconds"], value=0.0)
    saves = [e for e, closing in zip(events, _closing_saves(events), strict=True)
             if isinstance(e, ev.Save) and e.taken and not closing]
    put("snapshot_seconds", [e.seconds for e in saves if e.tier == "snapshot"], "snapshot saves")
    put("checkpoint_seconds", [e.seconds for e in saves if e.tier == "checkpoint"], "checkpoint saves")
    resumes = [e for e in events if isinstance(e, ev.Resume)]
    put("snapshot_restore_seconds", [e.durations["restore"] for e in resumes if e.source == "snapshot"],
        "snapshot resumes", typical=True)
    put("checkpoint_restore_seconds", [e.durations["restore"] for e in resumes if e.source == "checkpoint"],
        "checkpoint resumes", typical=True)
    put("recovery_seconds", _recoveries(events), "snapshot resumes' detection, mesh and compile, and their wait "
        "where no slice returned", typical=True)
    put("scale_up_seconds", [sum(e.durations.values()) for e in resumes if e.source == "live"], "scale-ups",
        typical=True)
    new, again = _by_slice_set(events)
    if new and again:
        # Medians, as the resumes': a set's first compile, which the compilation cache then
        # keeps for every later process, would set a mean alone.
        extra = max(0.0, statistics.median(new) - statistics.median(again))
        out["new_mesh_seconds"] = Input(round(extra, 6), f"measured: {where} (median of {len(new)} resumes onto a "
                                        f"set of slices new to the process, less the median of {len(again)} others)")
    restarts = []
    started: float | None = None
    previous = -math.inf  # the wall time of the last event before this process's start
    for event in events:
        if isinstance(event, ev.Start):
            begin = event.process_start if math.isfinite(event.process_start) else event.wall
            # A process restarted inside one Python process (an in-process supervisor) shares
            # its process start with the first: it began after the last one's last event.
            started = max(begin, previous)
        elif isinstance(event, ev.Resume) and started is not None and math.isfinite(event.wall):
            restarts.append(max(0.0, event.wall - started - event.durations["restore"]))
            started = None
        if math.isfinite(event.wall):
            previous = event.wall
    # A restart is a process after the first (the first starts cold, with nothing cached);
    # a run that never restarted gives its one start.
    put("restart_seconds", restarts[1:] or restarts, "restarts" if len(restarts) > 1 else "process starts",
        typical=True)
    return out


def _run_events(run_dir: Path) -> list[Any]:
    """The typed events of ``run_dir``'s record; ``ValueError`` when it holds none."""
    from elastic_dew import record

    if not (run_dir / record.EVENTS_FILE).is_file():
        raise ValueError(f"{run_dir} holds no {record.EVENTS_FILE}; give the directory a run wrote (runs/NAME)")
    return record.as_events(record.read_events(run_dir))


def _recoveries(events: list[Any]) -> list[float]:
    """Each snapshot resume's in-process recovery less its restore: its detection, its mesh and
    compile, and its wait for slices where no slice returned between its ``stop`` and it (the
    recovery's own time from the loss's report to the next attempt). A wait during which a
    slice returned waited for the cluster, which the model counts as the pool's shortage."""
    from elastic_dew.elastic import events as ev

    out: list[float] = []
    returned = False
    for event in events:
        if isinstance(event, ev.Stop):
            returned = False
        elif isinstance(event, ev.Fault) and event.action == "restore":
            returned = True
        elif isinstance(event, ev.Resume) and event.source == "snapshot":
            d = event.durations
            out.append(d["detection"] + d["mesh_and_compile"] + (0.0 if returned else d["wait_for_slices"]))
    return out


def _by_slice_set(events: list[Any]) -> tuple[list[float], list[float]]:
    """Each snapshot resume's and scale-up's whole time, split by whether its set of slices
    (every slice but those the fault log has down) was new to its process: a new one
    compiles (or loads) the step for that mesh; the process's first set is its start's."""
    from elastic_dew.elastic import events as ev

    new: list[float] = []
    again: list[float] = []
    down: set[int] = set()
    seen: set[frozenset[int]] = set()
    for event in events:
        if isinstance(event, ev.Start):
            seen = set()
        elif isinstance(event, ev.Fault) and event.slice is not None:
            if event.action == "lose":
                down.add(event.slice)
            elif event.action == "restore":
                down.discard(event.slice)
        elif isinstance(event, ev.Resume):
            key = frozenset(down)
            if event.source in ("snapshot", "live"):
                (again if key in seen else new).append(sum(event.durations.values()) -
                                                       event.durations.get("wait_for_slices", 0.0))
            seen.add(key)
    return new, again


def _closing_saves(events: list[Any]) -> list[bool]:
    """For each event, whether it is a save that closes an attempt: one followed, with only
    saves between, by a ``stop`` of reason ``done`` or ``preempted``. Such a save waits for
    its write to finish (and for every write before it), which a save at the cadence does
    not."""
    from elastic_dew.elastic import events as ev

    out = [False] * len(events)
    closing = False
    for i in range(len(events) - 1, -1, -1):
        event = events[i]
        if isinstance(event, ev.Stop):
            closing = event.reason in ("done", "preempted")
        elif isinstance(event, ev.Save):
            out[i] = closing
        else:
            closing = False
    return out


def _loop_overheads(events: list[Any], slices: int) -> list[float]:
    """For each step on ``slices`` slices that follows the step before it with nothing but
    saves between them, the wall time between the two steps' lines less the step's own
    time and the saves': the loop's time between steps."""
    from elastic_dew.elastic import events as ev

    out = []
    previous: ev.Step | None = None
    saves = 0.0
    for event in events:
        if isinstance(event, ev.Step):
            if (previous is not None and event.slices == slices and event.step == previous.step + 1
                    and math.isfinite(event.wall) and math.isfinite(previous.wall)):
                out.append(event.wall - previous.wall - float(event.seconds) - saves)
            previous, saves = event, 0.0
        elif isinstance(event, ev.Save):
            saves += float(event.seconds)
        else:  # a fault, a stop, a resume, an evaluation: not the loop's own time
            previous, saves = None, 0.0
    return out


def resolve(
    given: Mapping[str, Any], measured: Mapping[str, Input], defaults: Mapping[str, Input] | None = None
) -> dict[str, Input]:
    """Each field's figure: a given value over a measured one over a default; a field with
    none of them is left out."""
    out = dict(defaults or {})
    out.update(measured)
    out.update({name: Input(value, "given") for name, value in given.items() if value is not None})
    return out
