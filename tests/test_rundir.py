"""The run directory's fault log: each fired fault is stored with the schedule's own reading.

The schedule's grammar (:mod:`elastic_dew.simulate.schedule`) is the one parser of a fault's
text; the log line carries its ``action`` and ``slice``, and readers take them from there.
"""

from __future__ import annotations

import json

from elastic_dew import rundir
from elastic_dew.simulate.schedule import ScheduleRunner, parse_schedule


class _Slices:
    """The simulator's side of a fired slice fault, recorded instead of acted on."""

    hung = frozenset()  # no slice hangs here: the runner lands a snapshot in flight first

    def __init__(self):
        self.lost = []

    def lose(self, index, code=None):
        self.lost.append(index)


def test_a_fired_fault_is_logged_with_the_schedules_action_and_slice(tmp_path):
    log = rundir.FaultLog(tmp_path / rundir.FAULTS_FILE)
    slices = _Slices()
    runner = ScheduleRunner(parse_schedule("lose:2@3"), slices, log)

    runner.on_phase("step", 3)

    assert slices.lost == [2]
    (line,) = log.path.read_text().splitlines()
    assert {k: json.loads(line)[k] for k in ("index", "fault", "action", "slice")} == {
        "index": 0, "fault": "lose:2@3/step", "action": "lose", "slice": 2,
    }
    (entry,) = log.entries()
    assert (entry.action, entry.slice, entry.step, entry.phase) == ("lose", 2, 3, "step")
    (fault,) = rundir.read_faults(tmp_path)
    assert (fault.action, fault.slice, fault.scheduled) == ("lose", 2, "lose:2@3/step")


def test_a_logged_fault_is_read_from_its_fields_not_from_its_text(tmp_path):
    path = tmp_path / rundir.FAULTS_FILE
    path.write_text(json.dumps(dict(index=0, fault="kill@4", phase="step", step=4, time=1.0, pid=7,
                                    action="preempt", slice=None)) + "\n")

    (entry,) = rundir.FaultLog(path).entries()

    assert (entry.action, entry.slice) == ("preempt", None)


def test_a_fault_log_written_before_lines_carried_action_and_slice_is_read_from_the_fault_text(tmp_path):
    path = tmp_path / rundir.FAULTS_FILE
    path.write_text(
        json.dumps(dict(index=0, fault="lose:1@5/dispatch", phase="dispatch", step=5, time=1.0, pid=7)) + "\n"
        + json.dumps(dict(index=1, fault="preempt@9", phase="step", step=9, time=2.0, pid=7)) + "\n"
    )

    entries = rundir.FaultLog(path).entries()

    assert [(e.action, e.slice) for e in entries] == [("lose", 1), ("preempt", None)]


def test_a_fault_recorded_as_never_fired_is_not_a_fired_one_and_a_later_process_fires_it(tmp_path):
    log = rundir.FaultLog(tmp_path / rundir.FAULTS_FILE)
    first = ScheduleRunner(parse_schedule("lose:1@3,lose:2@9"), _Slices(), log)
    first.on_phase("step", 3)
    assert [str(f) for f in first.report_unfired()] == ["lose:2@9/step"]
    (unfired,) = log.never_fired()
    assert (unfired.fault, unfired.step) == ("lose:2@9/step", 3)
    assert [e.fault for e in log.entries()] == ["lose:1@3/step"] and log.fired(["lose:1@3/step", "lose:2@9/step"]) == {0}
    assert [f.scheduled for f in rundir.read_faults(tmp_path)] == ["lose:1@3/step"]

    slices = _Slices()
    again = ScheduleRunner(parse_schedule("lose:1@3,lose:2@9"), slices, rundir.FaultLog(log.path))
    again.on_phase("step", 9)
    assert slices.lost == [2] and again.unfired == ()
