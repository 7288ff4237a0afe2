"""The run directory's fault log: each fired fault is stored as its ``fault`` event.

A fault's text has one grammar (:mod:`elastic_dew.simulate.fault_token`), which the schedule
parses and writes with; the log line is the fired fault's event (its ``action`` and ``slice``
among its fields), and readers take them from there.
"""

from __future__ import annotations

import json

import pytest

from elastic_dew import rundir
from elastic_dew.elastic import events
from elastic_dew.simulate.runner import ScheduleRunner
from elastic_dew.simulate.schedule import parse_schedule


class _Slices:
    """The simulator's side of a fired slice fault, recorded instead of acted on."""

    hung = frozenset()  # no slice hangs here: the runner lands a snapshot in flight first

    def __init__(self):
        self.lost = []

    def lose(self, index, code=None):
        self.lost.append(index)


def test_a_fired_fault_is_logged_as_its_fault_event_with_the_schedules_action_and_slice(tmp_path):
    log = rundir.FaultLog(tmp_path / rundir.FAULTS_FILE)
    slices = _Slices()
    runner = ScheduleRunner(parse_schedule("lose:2@3"), slices, log)

    runner.on_phase("step", 3)

    assert slices.lost == [2]
    (line,) = log.path.read_text().splitlines()
    (fault,) = rundir.read_faults(tmp_path)
    assert isinstance(fault, events.Fault) and json.loads(line) == fault.to_json()
    assert (fault.action, fault.slice, fault.step, fault.phase, fault.scheduled, fault.index) == (
        "lose", 2, 3, "step", "lose:2@3/step", 0)


def test_a_logged_fault_is_read_from_its_fields_not_from_its_text(tmp_path):
    path = tmp_path / rundir.FAULTS_FILE
    path.write_text(json.dumps(dict(event="fault", index=0, scheduled="kill@4", phase="step", step=4, wall=1.0,
                                    pid=7, action="preempt", slice=None)) + "\n")

    (entry,) = rundir.FaultLog(path).entries()

    assert (entry.action, entry.slice) == ("preempt", None)


def test_a_fault_log_line_that_is_not_a_fault_event_is_refused_unless_it_is_the_torn_last_line(tmp_path):
    path = tmp_path / rundir.FAULTS_FILE
    line = dict(index=0, fault="lose:1@5/step", phase="step", step=5, time=1.0, pid=7)
    path.write_text(json.dumps(line) + "\n" + json.dumps(line) + "\n")

    with pytest.raises(ValueError, match="line 1 is not a fault record"):
        rundir.FaultLog(path).entries()

    path.write_text(json.dumps(line) + "\n")
    assert rundir.FaultLog(path).entries() == []


def test_a_run_resumed_over_a_fault_log_fires_only_what_it_has_not_and_appends_events(tmp_path):
    path = tmp_path / rundir.FAULTS_FILE
    path.write_text(json.dumps(dict(event="fault", index=0, scheduled="lose:1@3/step", phase="step", step=3,
                                    wall=1.0, pid=7, action="lose", slice=1)) + "\n")
    slices = _Slices()
    runner = ScheduleRunner(parse_schedule("lose:1@3,lose:2@5"), slices, rundir.FaultLog(path))

    runner.on_phase("step", 5)

    assert slices.lost == [2]
    assert [(f.scheduled, f.index) for f in rundir.read_faults(tmp_path)] == [("lose:1@3/step", 0), ("lose:2@5/step", 1)]
    assert json.loads(path.read_text().splitlines()[1])["event"] == "fault"


def test_a_fault_recorded_as_never_fired_is_not_a_fired_one_and_a_later_process_fires_it(tmp_path):
    log = rundir.FaultLog(tmp_path / rundir.FAULTS_FILE)
    first = ScheduleRunner(parse_schedule("lose:1@3,lose:2@9"), _Slices(), log)
    first.on_phase("step", 3)
    assert [str(f) for f in first.report_unfired()] == ["lose:2@9/step"]
    (unfired,) = log.never_fired()
    assert (unfired.scheduled, unfired.step) == ("lose:2@9/step", 3)
    assert [e.scheduled for e in log.entries()] == ["lose:1@3/step"] and list(log.fired(["lose:1@3/step", "lose:2@9/step"])) == [0]
    assert [f.scheduled for f in rundir.read_faults(tmp_path)] == ["lose:1@3/step"]

    slices = _Slices()
    again = ScheduleRunner(parse_schedule("lose:1@3,lose:2@9"), slices, rundir.FaultLog(log.path))
    again.on_phase("step", 9)
    assert slices.lost == [2] and again.unfired == ()
