"""The run record: events.jsonl, the commit rule, the summary, the parameter files, the timeline.

The events here are written by hand, the way the elastic layer's protocol emits them, so every
number in the summary can be checked against arithmetic done in the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from elastic_dew import record
from elastic_dew.record import (
    BADPUT_CATEGORIES,
    RunRecord,
    committed_step_lines,
    draw_timeline,
    load_params,
    read_events,
    state_digest,
    summarize,
)
from elastic_dew.record.goodput import committed_evals
from elastic_dew.record.log import process_start_time
from elastic_dew.record.summary import write_summary


def _step(step, wall, *, slices=2, batch=4, seconds=1.0, data=0.0, loss=1.0):
    return {
        "event": "step", "step": step, "slices": slices, "loss": loss,
        "examples": [step * batch, (step + 1) * batch], "wall": wall,
        "seconds": seconds, "data_seconds": data,
    }


def _resume(step, wall, source, **durations):
    d = {"detection": 0.0, "wait_for_slices": 0.0, "mesh_and_compile": 0.0, "restore": 0.0}
    d.update(durations)
    return {"event": "resume", "source": source, "step": step, "wall": wall, "durations": d}


def _a_run_with_every_kind_of_disruption():
    """Two processes: a slice loss rolled back to a snapshot, a scale-up, then a preemption.

    Process 1 starts at 0, is ready at 3 (2 s of it compiling, 0.5 s building the fresh
    state), runs steps 0..4, loses a
    slice during step 5 (a wasted step), restores the snapshot of step 3 and re-runs 3..5
    (so the first 3 and 4 are wasted too), scales up live, runs 6, is preempted at 7.
    Process 2 starts at 100 and resumes at 7 from the checkpoint and runs 7..8, done.
    """
    return [
        {"event": "start", "wall": 0.5, "process_start": 0.0, "pid": 1},
        _resume(0, 3.0, "fresh", mesh_and_compile=2.0, restore=0.5),
        _step(0, 4.0), _step(1, 5.0), _step(2, 6.0),
        {"event": "save", "tier": "snapshot", "step": 2, "seconds": 0.5, "taken": True, "wall": 6.5},
        _step(3, 7.5), _step(4, 8.5, data=0.25),
        _step(5, 9.5),  # computed but its result never read: slice 1 was lost
        {"event": "fault", "action": "lose", "slice": 1, "step": 5, "phase": "step", "wall": 9.0},
        {"event": "stop", "reason": "slice_lost", "step": 5, "wall": 10.0},
        _resume(3, 14.0, "snapshot", detection=0.5, wait_for_slices=1.0,
                mesh_and_compile=1.5, restore=0.5),
        _step(3, 15.0, slices=1), _step(4, 16.0, slices=1), _step(5, 17.0, slices=1),
        {"event": "stop", "reason": "scale_up", "step": 5, "wall": 17.5},
        _resume(6, 18.5, "live", detection=0.1, mesh_and_compile=0.7, restore=0.2),
        _step(6, 19.5),
        {"event": "stop", "reason": "preempted", "step": 7, "wall": 20.0},
        {"event": "save", "tier": "checkpoint", "step": 7, "seconds": 1.0, "taken": True, "wall": 21.0},
        {"event": "start", "wall": 100.5, "process_start": 100.0, "pid": 2},
        _resume(7, 104.0, "checkpoint", mesh_and_compile=2.0, restore=1.0),
        _step(7, 105.0), _step(8, 106.0),
        {"event": "stop", "reason": "done", "step": 9, "wall": 106.5},
    ]


def test_events_are_appended_one_json_line_each_and_read_back_in_order(tmp_path):
    run = tmp_path / "run"
    with RunRecord(run) as rec:
        rec.append({"event": "start", "wall": 1.0, "process_start": 0.5, "pid": 7})
        rec.append(_step(0, 2.0, loss=np.float32(2.5)))
        assert rec.events()[1]["loss"] == 2.5
    lines = (run / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["start", "step"]


def test_an_event_without_a_kind_is_refused_before_anything_is_written(tmp_path):
    with RunRecord(tmp_path) as rec:
        with pytest.raises(ValueError, match="'event' key"):
            rec.append({"step": 3})
    assert (tmp_path / "events.jsonl").read_text() == ""


def test_a_torn_last_line_from_a_killed_writer_is_ignored_and_the_next_writer_starts_fresh(tmp_path):
    with RunRecord(tmp_path) as rec:
        rec.append(_step(0, 1.0))
        rec.append(_step(1, 2.0))
    with open(tmp_path / "events.jsonl", "ab") as f:
        f.write(b'{"event": "step", "step": 2, "sli')  # SIGKILL mid-write
    assert [e["step"] for e in read_events(tmp_path)] == [0, 1]
    with RunRecord(tmp_path) as rec:  # the restarted process
        rec.append({"event": "start", "wall": 5.0, "process_start": 4.0, "pid": 2})
        assert [e["event"] for e in rec.events()] == ["step", "step", "start"]


@pytest.mark.slow
def test_a_writer_killed_with_sigkill_keeps_every_line_up_to_its_last_save_and_no_later_line_breaks_reading(tmp_path):
    """A real process appends steps, a save and more steps, starts a line and is SIGKILLed:
    the steps before the save and the save itself are on disk; of the step lines after it,
    which wait for their batch, whatever was written is a prefix in order."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from elastic_dew.record import RunRecord
        rec = RunRecord({str(tmp_path)!r})
        for i in range(150):
            rec.append({{"event": "step", "step": i, "wall": float(i), "pad": "x" * 5000}})
        rec.append({{"event": "save", "tier": "checkpoint", "step": 149, "wall": 149.5, "seconds": 0.1}})
        for i in range(150, 200):
            rec.append({{"event": "step", "step": i, "wall": float(i), "pad": "x" * 5000}})
        rec._file.write(b'{{"event": "step", "step": 200, "wa')
        rec._file.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    lines = read_events(tmp_path)
    assert [e["step"] for e in lines[:150]] == list(range(150))
    assert lines[150]["event"] == "save"
    later = [e["step"] for e in lines[151:]]
    assert later == list(range(150, 150 + len(later)))


def test_a_step_line_is_committed_unless_a_later_resume_is_at_or_below_its_step():
    events = _a_run_with_every_kind_of_disruption()
    committed = committed_step_lines(events)
    assert [e["step"] for e in committed] == list(range(9))
    assert [e["slices"] for e in committed if e["step"] in (3, 4, 5)] == [1, 1, 1]
    # A resume at the step right after a line leaves it committed; one at its step does not.
    assert [e["step"] for e in committed_step_lines([_step(4, 1.0), _resume(5, 2.0, "live")])] == [4]
    assert committed_step_lines([_step(4, 1.0), _resume(4, 2.0, "snapshot")]) == []


def test_the_committed_example_ranges_of_a_rolled_back_run_tile_the_consumed_examples():
    summary = summarize(_a_run_with_every_kind_of_disruption())
    ranges = sorted(tuple(e["examples"]) for e in committed_step_lines(_a_run_with_every_kind_of_disruption()))
    assert ranges[0][0] == 0
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert ranges[-1][1] == summary["examples_consumed"] == 36


def test_the_summary_has_the_contracted_fields_and_every_badput_category():
    summary = summarize(_a_run_with_every_kind_of_disruption())
    assert {"final_step", "state_digest", "examples_consumed", "goodput", "badput"} <= set(summary)
    assert tuple(summary["badput"]) == BADPUT_CATEGORIES
    assert summary["final_step"] == 8
    assert summary["state_digest"] is None  # no parameters given


def test_goodput_and_badput_split_the_wall_time_from_the_first_start_to_the_last_event():
    summary = summarize(_a_run_with_every_kind_of_disruption())
    b = summary["badput"]
    # Two processes: 0 -> 21 and 100 -> 106.5; the 79 s between them count, as
    # ml-goodput-measurement counts them.
    assert summary["wall_seconds"] == pytest.approx(106.5)
    assert b["infrastructure_recovery_from_disruption"] == pytest.approx(79.0)
    # Nine committed steps of 1 s each.
    assert summary["productive_seconds"] == pytest.approx(9.0)
    assert summary["goodput"] == pytest.approx(9.0 / 106.5)
    # Ready at 3 after 2 s of compile: 0.5 s of start-up and 0.5 s building the fresh state;
    # process 2: 4 s minus 3 s of resume.
    assert b["program_startup"] == pytest.approx(0.5 + 1.0)
    assert b["training_prep"] == pytest.approx(0.5)
    assert b["unproductive_checkpoint_save_time"] == pytest.approx(0.5 + 1.0)
    assert b["unproductive_checkpoint_restore_time"] == pytest.approx(0.5 + 1.0)
    assert b["elastic_slice_down"] == pytest.approx(0.5 + 1.0)
    assert b["elastic_scale_up"] == pytest.approx(0.1 + 0.7 + 0.2)
    assert b["elastic_reinitialization"] == pytest.approx(2.0 + 1.5 + 2.0)
    # The first runs of steps 3, 4 and 5 (their data time included).
    assert b["wasted_progress_from_disruption"] == pytest.approx(3.0)
    assert b["data_loading_sync"] == pytest.approx(0.0)
    assert summary["productive_seconds"] + sum(b.values()) == pytest.approx(summary["wall_seconds"])
    assert b["other"] > 0
    assert summary["stops"] == {"slice_lost": 1, "scale_up": 1, "preempted": 1, "done": 1}
    assert summary["resumes"] == {"fresh": 1, "snapshot": 1, "live": 1, "checkpoint": 1}
    assert summary["processes"] == 2


def test_the_data_time_inside_committed_steps_is_data_loading_sync_not_goodput():
    events = [
        {"event": "start", "wall": 0.0, "process_start": 0.0, "pid": 1},
        _resume(1, 0.0, "fresh"),
        _step(1, 1.0, data=0.25), _step(2, 2.0, data=0.25),
    ]
    summary = summarize(events)
    assert summary["badput"]["data_loading_sync"] == pytest.approx(0.5)
    assert summary["goodput"] == pytest.approx(1.5 / 2.0)


def test_a_process_restarted_inside_one_python_process_starts_up_from_the_last_ones_end_not_its_process_start():
    # An in-process supervisor's second attempt shares the first's process start (100 s
    # earlier); its start-up is from the first attempt's last event (at 103) to its resume.
    events = [
        {"event": "start", "wall": 101.0, "process_start": 100.0, "pid": 1},
        _resume(0, 101.5, "fresh"),
        _step(1, 102.5), _step(2, 103.0, seconds=0.5),
        {"event": "start", "wall": 103.5, "process_start": 100.0, "pid": 1},
        _resume(2, 104.5, "checkpoint", restore=0.5),
        _step(3, 105.5),
    ]
    summary = summarize(events)
    b = summary["badput"]
    assert summary["wall_seconds"] == pytest.approx(5.5)
    assert b["program_startup"] == pytest.approx(1.5 + 1.0)
    assert b["infrastructure_recovery_from_disruption"] == pytest.approx(0.0)
    assert b["other"] == pytest.approx(0.0)
    assert summary["productive_seconds"] + sum(b.values()) == pytest.approx(5.5)


def test_the_state_digest_is_the_same_for_equal_parameters_in_any_key_order_and_changes_with_one_bit():
    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": {"x": np.ones(3, np.float32)}}
    b = {"b": {"x": np.ones(3, np.float32)}, "w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert state_digest(a) == state_digest(b)
    c = {"w": a["w"].copy(), "b": {"x": np.ones(3, np.float32)}}
    c["w"].view(np.uint32)[0, 0] ^= 1
    assert state_digest(a) != state_digest(c)
    # Same bytes, another shape or dtype: another digest.
    assert state_digest({"w": a["w"].reshape(3, 2), "b": a["b"]}) != state_digest(a)


def test_saved_final_parameters_load_without_pickle_and_keep_their_digest(tmp_path):
    import jax.numpy as jnp

    params = {"layers": [{"w": jnp.ones((2, 2))}, {"w": jnp.zeros((2,))}], "scale": jnp.float32(3)}
    events = _a_run_with_every_kind_of_disruption()
    summary = write_summary(tmp_path, events, params)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == summary
    loaded = load_params(tmp_path)
    assert sorted(loaded) == ["layers/0/w", "layers/1/w", "scale"]
    assert summary["state_digest"] == state_digest(params) == state_digest(loaded)


def test_the_summary_is_written_from_the_run_directorys_own_events_when_none_are_given(tmp_path):
    with RunRecord(tmp_path) as rec:
        for event in _a_run_with_every_kind_of_disruption():
            rec.append(event)
    assert write_summary(tmp_path)["examples_consumed"] == 36


def test_the_timeline_picture_is_drawn_from_the_events(tmp_path):
    with RunRecord(tmp_path) as rec:
        for event in _a_run_with_every_kind_of_disruption():
            rec.append(event)
    path = draw_timeline(tmp_path)
    assert path == tmp_path / "timeline.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_timeline_says_which_extra_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(RuntimeError, match=r"elastic-dew\[plot\]"):
        record.draw_timeline(tmp_path)


def test_the_process_start_time_is_when_this_process_began_not_when_it_was_asked():
    import time

    started = process_start_time()
    assert started <= time.time()
    assert started < time.time() - 0.05  # pytest ran for a while before this test


def test_the_process_start_time_is_read_from_proc_to_the_tick_and_from_psutil_only_where_proc_is_missing(monkeypatch):
    import builtins

    import psutil

    def unused(pid):
        raise AssertionError("psutil read although /proc was there")

    from_psutil = psutil.Process().create_time()  # its boot time is whole seconds
    monkeypatch.setattr(psutil, "Process", unused)
    from_proc = process_start_time()
    assert abs(from_proc - from_psutil) < 1.0

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(psutil, "Process", lambda pid: type("P", (), {"create_time": lambda self: 123.0})())
    assert process_start_time() == 123.0

    def broken(pid):
        raise RuntimeError("a bug in the caller, not a missing library")

    monkeypatch.setattr(psutil, "Process", broken)
    with pytest.raises(RuntimeError, match="a bug in the caller"):
        process_start_time()


def test_a_typed_event_is_appended_as_the_same_json_line_as_its_mapping(tmp_path):
    from elastic_dew.elastic.events import Resume, Step

    with RunRecord(tmp_path) as rec:
        rec.append(Step(step=3, slices=2, loss=0.5, examples=(12, 16), seconds=1.0, wall=7.0))
        rec.append(Resume(source="snapshot", step=3, durations={"restore": 0.25}, wall=8.0))
    lines = read_events(tmp_path)
    assert lines[0] == {
        "event": "step", "wall": 7.0, "step": 3, "slices": 2, "loss": 0.5, "examples": [12, 16],
        "seconds": 1.0, "data_seconds": 0.0, "metrics": {},
    }
    assert lines[1]["durations"] == {
        "detection": 0.0, "wait_for_slices": 0.0, "mesh_and_compile": 0.0, "restore": 0.25,
    }


def test_the_summary_of_typed_events_is_the_summary_of_their_json_lines():
    lines = _a_run_with_every_kind_of_disruption()
    typed = record.as_events(lines)
    assert [type(e).__name__ for e in typed[:3]] == ["Start", "Resume", "Step"]
    assert summarize(typed) == summarize(lines)
    assert committed_step_lines(typed) == [e.to_json() for e in record.as_events(committed_step_lines(lines))]


def test_a_line_of_a_kind_this_version_does_not_know_is_left_out_of_the_typed_events():
    lines = [{"event": "checkpoint_gc", "wall": 1.0}, _step(0, 2.0)]
    assert [e.kind for e in record.as_events(lines)] == ["step"]
    assert summarize(lines)["final_step"] == 0


def test_an_owed_evaluation_run_twice_from_the_same_checkpoint_counts_once_the_later():
    """Preempted in the pass of step 3; resumed from its checkpoint, which owes the pass; the
    pass ran, a slice was lost before any newer save, and the next resume ran it again."""
    def _eval(wall, loss):
        return {"event": "eval", "step": 3, "slices": 2, "metrics": {"loss": loss}, "batches": 1,
                "examples_evaluated": 4, "seconds": 0.5, "wall": wall}

    lines = [
        _resume(1, 0.0, "fresh"), _step(1, 1.0), _step(2, 2.0), _step(3, 3.0),
        {"event": "stop", "reason": "preempted", "step": 3, "wall": 4.0},
        _resume(4, 5.0, "checkpoint"), _eval(6.0, 0.9),
        {"event": "stop", "reason": "slice_lost", "step": 3, "wall": 7.0},
        _resume(4, 8.0, "checkpoint"), _eval(9.0, 0.8), _step(4, 10.0),
    ]
    assert [(e.step, e.wall) for e in committed_evals(lines)] == [(3, 9.0)]


def test_a_snapshot_save_line_is_not_fsynced_on_its_own_and_is_durable_with_the_next_checkpoint_save(tmp_path,
                                                                                                      monkeypatch):
    from elastic_dew.record import log as record_log

    fsyncs: list = []
    real_fsync = record_log.os.fsync
    rec = RunRecord(tmp_path)
    monkeypatch.setattr(record_log.os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd)))
    for step in (1, 2, 3):
        rec.append(_step(step, float(step)))
        rec.append({"event": "save", "tier": "snapshot", "step": step, "taken": True, "seconds": 0.01,
                    "wall": step + 0.5})
    assert fsyncs == []  # three snapshot saves: no fsync
    rec.append({"event": "save", "tier": "checkpoint", "step": 3, "taken": True, "seconds": 0.2, "wall": 3.6})
    assert len(fsyncs) == 1
    on_disk = read_events(tmp_path)  # read without the writer: what the checkpoint's fsync made durable
    assert [(e["event"], e.get("tier")) for e in on_disk].count(("save", "snapshot")) == 3
    assert on_disk[-1]["tier"] == "checkpoint"
    rec.close()
