"""Shared helpers of the goodput tests: a hand-written preempted run, an in-memory stand-in
for Cloud Logging (which cannot be reached from a test), and ml-goodput-measurement's own
calculator fed through the export."""

from __future__ import annotations

import datetime

from ml_goodput_measurement.src import goodput_elastic, goodput_utils

from elastic_dew.elastic import events as ev
from elastic_dew.elastic.events import Fault, Resume, Save, Start, Step, Stop
from elastic_dew.observe.goodput_export import GoodputExport
from elastic_dew.record.log import as_events

from private_names import GOODPUT_TOTAL_JOB_TIME

T0 = 1_700_000_000.0


class MemoryLogger:
    """The library's Cloud Logging interface over a list (Cloud Logging is not reachable)."""

    def __init__(self) -> None:
        self.entries: list[tuple[datetime.datetime, dict]] = []
        self.last_entry_info = None

    def write_cloud_logging_entry(self, entry: dict) -> None:
        timestamp = goodput_utils.get_timestamp_from_log_entry(entry)
        if timestamp is not None:
            self.entries.append((timestamp, dict(entry)))
            self.last_entry_info = (timestamp, str(len(self.entries)))

    def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
        chosen = [
            entry
            for timestamp, entry in self.entries
            if (start_time is None or timestamp > start_time)
            and (end_time is None or timestamp <= end_time)
        ]
        return chosen, self.last_entry_info

    def flush(self) -> None:
        pass


def step_events(first: int, last: int, t: float, *, slices: int, seconds: float = 1.0):
    """Steps ``first..last`` back to back from ``t``; returns the events and the end time."""
    out = []
    for step in range(first, last + 1):
        t += seconds
        out.append(Step(wall=t, step=step, slices=slices, loss=1.0 / step,
                        examples=(8 * (step - 1), 8 * step), seconds=seconds, data_seconds=0.01))
    return out, t


def preempted_run_with_gap(gap: float = 85.0):
    """Two processes: a checkpoint at 10, preempted at 20, ``gap`` s away, then a lost slice.

    The second process resumes from the checkpoint (steps 11-20 are re-done), loses a slice
    after step 27, resumes from the snapshot of step 24 and finishes at step 40.
    """
    events = [Start(wall=T0 + 2.0, process_start=T0, pid=1),
              Resume(wall=T0 + 5.0, source="fresh", step=1,
                     durations={"mesh_and_compile": 1.5, "restore": 0.5})]
    steps, t = step_events(1, 10, T0 + 5.0, slices=4)
    events += steps
    events.append(Save(wall=t + 0.2, tier="checkpoint", step=10, taken=True, seconds=0.2))
    steps, t = step_events(11, 20, t + 0.2, slices=4)
    events += steps
    events.append(Fault(wall=t + 0.1, action="preempt", slice=None, step=20, phase="step",
                        scheduled="preempt@20"))
    events.append(Stop(wall=t + 0.2, reason="preempted", step=20))
    begin = t + 0.2 + gap
    events.append(Start(wall=begin + 2.0, process_start=begin, pid=2))
    events.append(Resume(wall=begin + 6.0, source="checkpoint", step=11,
                         durations={"mesh_and_compile": 1.5, "restore": 1.0}))
    steps, t = step_events(11, 27, begin + 6.0, slices=4)
    events += steps
    events.append(Stop(wall=t + 0.5, reason="slice_lost", step=27))
    t += 0.5 + 4.0
    events.append(Resume(wall=t, source="snapshot", step=25,
                         durations={"detection": 0.5, "wait_for_slices": 2.0,
                                    "mesh_and_compile": 1.0, "restore": 0.5}))
    steps, t = step_events(25, 40, t, slices=3)
    events += steps
    events.append(Stop(wall=t + 0.1, reason="done", step=40))
    return events


def library_goodput(events, tmp_path) -> float:
    """ml-goodput-measurement's own goodput (percent) of ``events``, fed through its recorder."""
    return library_breakdown(events, tmp_path)[0]


def library_breakdown(events, tmp_path):
    """The library's goodput (percent), its badput in seconds by lower-case name, and its
    total job time, of ``events`` fed through the export."""
    memory = MemoryLogger()
    export = GoodputExport("run", cloud_logger=memory, total_slices=4)
    for event in as_events(events):
        export(event)
    export.close()
    calculator = goodput_elastic.ElasticGoodputCalculator(
        "run", "goodput_run", cloud_logger=memory, using_pathways=True, cache_dir=str(tmp_path)
    )
    goodput, badput, _ = calculator.get_job_goodput(include_badput_breakdown=True)
    total = getattr(calculator, GOODPUT_TOTAL_JOB_TIME.name)(datetime.datetime.now(datetime.timezone.utc))
    return goodput, {k.name.lower(): v * total / 100 for k, v in badput.items()
                     if isinstance(v, float)}, total


def library_only_rules(events) -> tuple[float, float]:
    """The seconds by which two rules of ml-goodput-measurement 0.2.3 move its productive
    time away from elastic_dew's, given what the export writes (docs/observability.md):

    - ``first_step_excess``: in each segment of steps (a process's steps until one is
      recorded again), the first step's productive time above the average of the others is
      program start-up to the library (``_compute_segment_final_metrics``); elastic_dew
      counts the whole step.
    - ``tail``: the library counts the last step from its start to the job end, less the
      Orbax save entries only (``productive_training_time += job_end_time -
      step_start_data[last_step]``); elastic_dew counts its ``seconds`` less its data wait.

    The library's productive time is elastic_dew's less the first and plus the second.
    """
    events = as_events(events)
    segments, current = [], {}
    for event in events:
        if isinstance(event, ev.Step):
            if event.step in current:
                segments.append((current, event.step))
                current = {}
            current[event.step] = event
        elif isinstance(event, ev.Stop) and event.reason == "preempted" and current:
            current[max(current) + 1] = None  # the export's step start at the stop
    segments.append((current, max(current)))
    excess = 0.0
    for segment, upto in segments:
        productive = [segment[s].seconds - min(segment[s].data_seconds, segment[s].seconds)
                      for s in sorted(segment) if s + 1 in segment and s + 1 <= upto]
        if len(productive) > 1:
            excess += max(0.0, productive[0] - sum(productive[1:]) / (len(productive) - 1))
    stop, last = events[-1], [e for e in events if isinstance(e, ev.Step)][-1]
    assert isinstance(stop, ev.Stop) and stop.reason == "done"
    saves_after = sum(e.seconds for e in events[events.index(last):] if isinstance(e, ev.Save))
    tail = (stop.wall - (last.wall - last.seconds)) - (
        last.seconds - min(last.data_seconds, last.seconds)) - saves_after
    return excess, tail
