"""Pathways' transparent suspend: ``suspend:S@T,wake:S@+D``.

A suspended slice's work stalls and then completes with no error; elastic_dew's step
deadline decides whether the run waits it out or declares the slice lost. Under multi-tier
checkpointing there is no transparent suspend: a suspend is a slice loss. TPU slices cannot
exist here; :class:`SimulatedSlices` stands in for them on 8 CPU devices (conftest).
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

from elastic_dew import record
from elastic_dew.elastic import ElasticData, ElasticRun
from elastic_dew.elastic.slices import health
from elastic_dew.simulate import SimulatedSlices, parse_schedule

from linear import LinearProgram
from linear import config as _config
from linear import dataset as _dataset


def test_a_read_blocked_on_a_suspended_slice_completes_with_its_value_at_the_wake():
    with SimulatedSlices(2, 2) as sim:
        x = jax.device_put(jnp.arange(4.0), sim.slice_to_devices[1][0]) * 2
        sim.suspend(1)
        assert not x.is_ready()
        got: list = []
        reader = threading.Thread(target=lambda: got.append(np.asarray(x)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and sim.hung == {1}  # stalled, no error
        sim.wake(1)
        reader.join(10)
        np.testing.assert_array_equal(got[0], [0.0, 2.0, 4.0, 6.0])
        assert sim.lost == set() and float(x.sum()) == 12.0


def test_under_multi_tier_checkpointing_a_suspend_is_a_slice_loss_and_its_wake_a_return(tmp_path):
    with SimulatedSlices(2, 2, replicator=tmp_path / "replicator") as sim:
        x = jax.device_put(jnp.arange(4.0), sim.slice_to_devices[1][0])
        sim.suspend(1)
        assert sim.lost == {1} and sim.hung == set()
        try:
            float(x[0])
        except jax.errors.JaxRuntimeError as error:
            assert "DATA_LOSS" in str(error)
        else:
            raise AssertionError("a read on a slice suspended under multi-tier checkpointing must fail")
        sim.wake(1)
        assert sim.lost == set()


def test_the_schedule_grammar_takes_suspend_and_wake():
    schedule = parse_schedule("suspend:1@7,wake:1@+45")
    assert [(f.action, f.slice, f.step, f.after) for f in schedule] == [("suspend", 1, 7, None),
                                                                     ("wake", 1, 0, 45.0)]


def _train(tmp_path, schedule: str, step_timeout: float):
    events: list = []
    with SimulatedSlices(4, 2, schedule=schedule, fault_log=tmp_path / "faults.jsonl") as sim:
        run = ElasticRun(LinearProgram(), ElasticData(_dataset()),
                         _config(tmp_path, minimum_slice_count=3, checkpoint_every=0, step_timeout=step_timeout),
                         emit=events.append)
        _, step = run.run(10)
    assert step == 10 and sim.unfired == ()
    return events


def _assert_each_example_once(events, steps: int) -> None:
    committed = record.as_events(record.committed_step_lines(events))
    assert [e.step for e in committed] == list(range(1, steps + 1))
    position = 0
    for e in committed:
        assert e.examples[0] == position
        position = e.examples[1]


def test_a_suspension_shorter_than_the_step_deadline_is_waited_out_with_nothing_redone(tmp_path):
    events = _train(tmp_path, "suspend:1@5,wake:1@+0.5", step_timeout=5)
    assert [(e.reason, e.step) for e in events if e.kind == "stop"] == [("done", 10)]
    assert [e.step for e in events if e.kind == "step"] == list(range(1, 11))  # nothing re-done
    assert {e.slices for e in events if e.kind == "step"} == {4}
    _assert_each_example_once(events, 10)


def test_a_suspension_longer_than_the_step_deadline_is_a_slice_loss_and_its_wake_a_scale_up(tmp_path, monkeypatch):
    # The wait for slices probes the suspended slice too, and its probe stalls like any work
    # there until the checker's bound (30 s) counts the slice down; half a second here.
    monkeypatch.setattr(health, "PROBE_TIMEOUT", 0.5)
    events = _train(tmp_path, "suspend:1@5,wake:1@8", step_timeout=0.5)
    stops = [(e.reason, e.step) for e in events if e.kind == "stop"]
    assert stops == [("slice_lost", 4), ("scale_up", 8), ("done", 10)]
    slices = [(e.step, e.slices) for e in events if e.kind == "step"]
    assert slices[4:] == [(5, 3), (6, 3), (7, 3), (8, 3), (9, 4), (10, 4)]  # without it, then with it again
    _assert_each_example_once(events, 10)


def test_the_automatic_step_deadline_waits_a_suspension_out_longer_when_the_run_waits_for_every_slice():
    from elastic_dew.elastic.deadline import FLOOR, PAUSE_FLOOR, StepDeadline

    resizing, pausing = StepDeadline(), StepDeadline(waits_for_every_slice=True)
    for deadline in (resizing, pausing):
        for _ in range(10):
            deadline.observe(0.1)
    assert (resizing.seconds(), pausing.seconds()) == (FLOOR, PAUSE_FLOOR) == (60.0, 600.0)
    assert StepDeadline(waits_for_every_slice=False).floor == FLOOR
