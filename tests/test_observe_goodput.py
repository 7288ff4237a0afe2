"""Goodput counted as ml-goodput-measurement counts it, checked against the library itself.

The library's calculator reads its entries through a Cloud Logging client; here it reads
them from :class:`MemoryLogger`, a local object with the same two methods, because Cloud
Logging cannot be reached from a test. The entries themselves are written by the library's
own recorder (through :class:`~elastic_dew.observe.goodput_export.GoodputExport`).
"""

from __future__ import annotations

import pytest
from ml_goodput_measurement.src import goodput_utils

from elastic_dew.elastic.events import Resume, Save, Start, Step, Stop
from elastic_dew.record.goodput import BADPUT_CATEGORIES, NOT_APPLICABLE, account
from elastic_dew.observe.goodput_export import DATA_WAIT, SAVE, GoodputExport
from goodputlib import (
    T0,
    MemoryLogger,
    library_breakdown,
    library_goodput,
    library_only_rules,
    preempted_run_with_gap,
    step_events,
)

pytestmark = pytest.mark.libraries  # ml-goodput-measurement's own calculator


def test_the_gap_between_processes_is_infrastructure_recovery_and_part_of_the_wall_time():
    events = preempted_run_with_gap(gap=85.0)
    result = account(events)
    first_start, last_wall = T0, events[-1].wall
    assert result.wall_seconds == pytest.approx(last_wall - first_start)
    # The gap runs from the first process's stop line to the second one's process_start.
    assert result.badput["infrastructure_recovery_from_disruption"] == pytest.approx(85.0)
    assert result.productive_seconds + sum(result.badput.values()) == pytest.approx(
        result.wall_seconds
    )
    assert result.badput["training_prep"] == pytest.approx(0.5)
    assert result.badput["elastic_slice_down"] == pytest.approx(2.5)
    assert result.badput["wasted_progress_from_disruption"] == pytest.approx(13.0)


def test_goodput_matches_ml_goodput_measurement_on_a_preempted_run_with_a_gap(tmp_path):
    events = preempted_run_with_gap(gap=85.0)
    ours = 100 * account(events).goodput
    theirs = library_goodput(events, tmp_path)
    assert ours == pytest.approx(theirs, abs=1.0), (ours, theirs)
    assert ours < 40  # the 85 s gap is not productive


def test_a_longer_gap_lowers_goodput_in_step_with_the_library(tmp_path):
    short, long = preempted_run_with_gap(gap=5.0), preempted_run_with_gap(gap=300.0)
    assert account(long).goodput < account(short).goodput
    assert 100 * account(long).goodput == pytest.approx(
        library_goodput(long, tmp_path / "long"), abs=1.0
    )


def test_every_badput_type_of_the_library_is_a_category_or_explained():
    library = {member.name.lower() for member in goodput_utils.BadputType}
    assert library == set(BADPUT_CATEGORIES) | set(NOT_APPLICABLE)
    assert not set(BADPUT_CATEGORIES) & set(NOT_APPLICABLE)


def test_the_export_maps_elastic_waits_and_reinitialisations_onto_the_recorders_entries():
    memory = MemoryLogger()
    export = GoodputExport("run", cloud_logger=memory)
    for event in preempted_run_with_gap(gap=10.0):
        export(event)
    entries = [entry for _, entry in memory.entries]
    assert sum("job_start_time" in e for e in entries) == 2
    assert sum("job_end_time" in e for e in entries) == 2  # the preempted process's and the last
    # A save between steps is a custom badput event (the library takes those out of the
    # step they lie in); only the saves after a done process's last step are Orbax entries.
    assert not [e for e in entries if e.get("event_type") == "save"]
    assert _custom_seconds(entries, SAVE) == [pytest.approx(0.2)]
    assert len(_custom_seconds(entries, DATA_WAIT)) == 20 + 17 + 16
    waits = [e for e in entries if "elastic_wait_start_time" in e]
    assert [e["elastic_wait_event_type"] for e in waits] == ["slice_down"]
    ends = [e for e in entries if "elastic_wait_end_time" in e]
    assert ends[0]["elastic_wait_end_time"] - waits[0]["elastic_wait_start_time"] == pytest.approx(2.5)
    reinit = [e for e in entries if "elastic_reinit_start_time" in e]
    reinit_end = [e for e in entries if "elastic_reinit_end_time" in e]
    assert len(reinit) == 1
    assert reinit_end[0]["elastic_reinit_end_time"] - reinit[0]["elastic_reinit_start_time"] == (
        pytest.approx(1.5)
    )
    assert {e["active_slices"] for e in entries if "active_slices" in e} == {3, 4}
    # Each step's start, and step 21's at the preemption (the re-run records it again).
    assert sum("step_start_time" in e for e in entries) == 20 + 17 + 16 + 1
    assert sum("training_prep_start_time" in e for e in entries) == 1


def test_the_export_refuses_an_empty_job_name():
    with pytest.raises(ValueError, match="job_name"):
        GoodputExport("", cloud_logger=MemoryLogger())


def test_every_process_records_a_job_end_however_it_ends():
    """Done and preempted stops end a process; a process that fails records its end when
    the export closes."""
    memory = MemoryLogger()
    export = GoodputExport("run", cloud_logger=memory)
    for event in preempted_run_with_gap(gap=10.0):
        export(event)
    ends = [e["job_end_time"] for _, e in memory.entries if "job_end_time" in e]
    stops = [e.wall for e in preempted_run_with_gap(gap=10.0)
             if isinstance(e, Stop) and e.reason in ("preempted", "done")]
    assert ends == pytest.approx(stops)

    failed = MemoryLogger()
    export = GoodputExport("run", cloud_logger=failed)
    export(Start(wall=T0 + 1, process_start=T0, pid=3))
    export(Resume(wall=T0 + 2, source="fresh", step=1,
                  durations={"mesh_and_compile": 0.5, "restore": 0.5}))
    export(Step(wall=T0 + 3, step=1, slices=4, loss=1.0, examples=(0, 8), seconds=1.0))
    assert not [e for _, e in failed.entries if "job_end_time" in e]
    export.close()  # the run failed: no stop line, and the display closes its sinks
    (end,) = [e["job_end_time"] for _, e in failed.entries if "job_end_time" in e]
    assert end >= T0 + 3
    export.close()
    assert len([e for _, e in failed.entries if "job_end_time" in e]) == 1


def test_a_graceful_preemption_gap_is_infrastructure_recovery_to_the_library_too(tmp_path):
    """ml-goodput-measurement 0.2.3 finds a disruption only where a step is recorded twice;
    elastic_dew's graceful stop checkpoints the stopped step and the re-run starts at the
    next one, so the export records that next step's start at the stop, and the library
    counts the gap as unproductive, as elastic_dew does."""
    events = [Start(wall=T0 + 1.0, process_start=T0, pid=1),
              Resume(wall=T0 + 2.0, source="fresh", step=1,
                     durations={"mesh_and_compile": 0.5, "restore": 0.5})]
    steps, t = step_events(1, 20, T0 + 2.0, slices=4)
    events += steps + [Save(wall=t + 0.3, tier="checkpoint", step=20, taken=True, seconds=0.3),
                       Stop(wall=t + 0.4, reason="preempted", step=20)]
    begin = t + 0.4 + 60.0
    events += [Start(wall=begin + 1.0, process_start=begin, pid=2),
               Resume(wall=begin + 2.0, source="checkpoint", step=21,
                      durations={"mesh_and_compile": 0.5, "restore": 0.5})]
    steps, t = step_events(21, 40, begin + 2.0, slices=4)
    events += steps + [Stop(wall=t + 0.1, reason="done", step=40)]
    ours = account(events)
    assert ours.badput["infrastructure_recovery_from_disruption"] == pytest.approx(60.0)
    theirs, badput, total = library_breakdown(events, tmp_path)
    assert badput["infrastructure_recovery_from_disruption"] == pytest.approx(60.0)
    assert theirs == pytest.approx(100 * ours.goodput, abs=1.0)
    assert theirs < 50  # 60 s of the ~105 s are the gap


def _custom_seconds(entries, kind):
    starts = [e["custom_badput_event_start_time"] for e in entries
              if e.get("custom_badput_event_type") == kind and "custom_badput_event_start_time" in e]
    ends = [e["custom_badput_event_end_time"] for e in entries
            if e.get("custom_badput_event_type") == kind and "custom_badput_event_end_time" in e]
    return [end - start for start, end in zip(starts, ends, strict=True)]


def test_the_library_differs_only_by_its_first_step_and_last_step_rules(tmp_path):
    """A slow first step after each start and a long wait after the last step (the final
    checkpoint, then host time) are where the library's productive time differs; the
    difference is exactly those two rules."""
    events = [Start(wall=T0 + 1.0, process_start=T0, pid=1),
              Resume(wall=T0 + 2.0, source="fresh", step=1,
                     durations={"mesh_and_compile": 0.5, "restore": 0.5})]
    first, t = step_events(1, 1, T0 + 2.0, slices=4, seconds=3.0)
    steps, t = step_events(2, 20, t, slices=4)
    events += first + steps + [Stop(wall=t + 0.1, reason="preempted", step=20)]
    begin = t + 20.0
    events += [Start(wall=begin + 1.0, process_start=begin, pid=2),
               Resume(wall=begin + 2.0, source="checkpoint", step=21,
                      durations={"mesh_and_compile": 0.5, "restore": 0.5})]
    first, t = step_events(21, 21, begin + 2.0, slices=4, seconds=3.0)
    steps, t = step_events(22, 40, t, slices=4)
    events += first + steps + [
        Save(wall=t + 1.0, tier="checkpoint", step=40, taken=True, seconds=1.0),
        Stop(wall=t + 3.0, reason="done", step=40),
    ]
    ours = account(events)
    excess, tail = library_only_rules(events)
    # Two segments, each with a first step 2 s over the others; after the last step's
    # 1 s, its data wait (0.01 s) and the 2 s after the final checkpoint.
    assert excess == pytest.approx(4.0) and tail == pytest.approx(2.01)
    theirs, badput, total = library_breakdown(events, tmp_path)
    assert total == pytest.approx(ours.wall_seconds)
    assert badput["program_startup"] == pytest.approx(excess, abs=1e-3)
    assert theirs == pytest.approx(
        100 * (ours.productive_seconds - excess + tail) / ours.wall_seconds, abs=0.01
    )
