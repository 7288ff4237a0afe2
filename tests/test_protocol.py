"""The stop/resume protocol on simulated slices (issue 3, section 6).

Every scenario runs a small linear model through :class:`ElasticRun` under
:class:`SimulatedSlices` (8 CPU devices: 4 slices of 2) and asserts three things:
exactly-once data relative to the committed steps, a final state equal to a failure-free
run (bitwise where the slice count and global batch are unchanged, ``allclose`` at
:data:`TOLERANCE` where the mesh changed), and the stop/resume events that happened.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest

from elastic_dew import record
from elastic_dew.elastic.events import Event
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.runtime import Preempted, PreemptionNotice
from elastic_dew.simulate import SimulatedSlices

from linear import GLOBAL_BATCH, LinearProgram
from linear import config as _config
from linear import dataset as _dataset

#: When the mesh changes under a constant global batch, the gradient's all-reduce sums
#: in another order; float32 results then agree to this tolerance, not bitwise.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)

def _train(tmp_path, steps=12, schedule=None, notice=None, on_run=None, **overrides):
    """Run to ``steps`` on 4x2 simulated slices; return (final numpy state, events)."""
    events: list[Event] = []
    with SimulatedSlices(4, 2, schedule=schedule, fault_log=tmp_path / "faults.jsonl"):
        run = ElasticRun(
            LinearProgram(), ElasticData(_dataset()), _config(tmp_path, **overrides),
            emit=events.append, notice=notice,
        )
        if on_run is not None:
            on_run(run)
        state, step = run.run(steps)
        assert step == steps
        return jax.device_get(state), events


def _committed(events):
    """Step events no later resume re-did (the run record's commit rule)."""
    return record.as_events(record.committed_step_lines(events))


def _assert_exactly_once(events, steps):
    committed = _committed(events)
    assert [e.step for e in committed] == list(range(1, steps + 1))
    position = 0
    for e in committed:
        start, end = e.examples
        assert start == position, f"step {e.step} starts at example {start}, expected {position}"
        position = end
    return position


def _assert_resumed_from_a_taken_snapshot(events, lost_after):
    """The second resume is from the newest snapshot on the cadence at or before ``lost_after``.

    Under the simulator no snapshot is skipped for a transfer still in flight, and none is in
    flight when a step-keyed fault fires (the simulator joins the run's Orbax ``Snapshotter``
    first), so which snapshot survives depends on the schedule alone: every snapshot save was
    taken.
    """
    saves = [e for e in events if e.kind == "save" and e.tier == "snapshot"]
    assert saves and all(e.taken for e in saves)
    resume = [e for e in events if e.kind == "resume"][1]
    assert resume.source == "snapshot"
    assert resume.step - 1 == max(e.step for e in saves if e.step <= lost_after)


def _kinds(events):
    out = []
    for e in events:
        if e.kind == "stop":
            out.append(("stop", e.reason, e.step))
        elif e.kind == "resume":
            out.append(("resume", e.source, e.step))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The failure-free run every scenario is compared with."""
    state, events = _train(tmp_path_factory.mktemp("reference"))
    return state, events


def test_a_failure_free_run_resumes_fresh_and_stops_done(reference):
    state, events = reference
    assert _kinds(events) == [("resume", "fresh", 1), ("stop", "done", 12)]
    consumed = _assert_exactly_once(events, 12)
    assert consumed == 12 * GLOBAL_BATCH
    assert int(state["seen"]) == sum(range(consumed))
    for e in events:
        if e.kind == "resume":
            assert set(e.durations) == {"detection", "wait_for_slices", "mesh_and_compile", "restore"}


def test_a_snapshot_whose_transfer_outlasts_its_interval_is_waited_for_not_skipped_under_the_simulator(
    tmp_path, reference, monkeypatch
):
    """On a cluster a snapshot requested while the previous one is still being copied to host
    memory is skipped; under the simulator that would make the snapshot a recovery loads
    depend on the step time, so the simulator waits for the transfer instead."""
    from private_names import SNAPSHOTTER_JAX

    real = SNAPSHOTTER_JAX.get().block_until_ready

    class _SlowTransfers:
        def __getattr__(self, name):
            return getattr(jax, name)

        @staticmethod
        def block_until_ready(tree):
            time.sleep(0.2)  # a copy to pinned host memory far slower than a step
            return real(tree)

    monkeypatch.setattr(SNAPSHOTTER_JAX.owner(), SNAPSHOTTER_JAX.name, _SlowTransfers())
    state, events = _train(tmp_path, schedule="lose:1@6", snapshot_every=1)
    _assert_resumed_from_a_taken_snapshot(events, 5)
    assert _assert_exactly_once(events, 12) == int(12 * GLOBAL_BATCH)
    np.testing.assert_allclose(state["w"], reference[0]["w"], **TOLERANCE)


def test_a_lost_slice_resumes_from_the_newest_snapshot_on_the_survivors(tmp_path, reference):
    state, events = _train(tmp_path, schedule="lose:1@5")
    kinds = _kinds(events)
    assert ("stop", "slice_lost", 4) in kinds
    _assert_resumed_from_a_taken_snapshot(events, 4)
    assert any(e.kind == "step" and e.slices == 3 for e in events)
    consumed = _assert_exactly_once(events, 12)
    assert int(state["seen"]) == sum(range(consumed))
    np.testing.assert_allclose(state["w"], reference[0]["w"], **TOLERANCE)


def test_a_lost_slice_that_returns_is_added_back_in_place(tmp_path, reference):
    """The simulator hands a restore to the Manager at once, so the slice returned during
    step 7's computation is added at the boundary after step 7 (read after the restore),
    whatever the step time; step 8, dispatched on the smaller mesh, is dropped and run again
    on the larger one."""
    state, events = _train(tmp_path, steps=12, schedule="lose:2@4,restore:2@7")
    kinds = _kinds(events)
    assert ("stop", "slice_lost", 3) in kinds
    _assert_resumed_from_a_taken_snapshot(events, 3)
    assert ("stop", "scale_up", 7) in kinds
    assert ("resume", "live", 8) in kinds
    assert [e.slices for e in events if e.kind == "step"][-1] == 4
    consumed = _assert_exactly_once(events, 12)
    assert int(state["seen"]) == sum(range(consumed))


def test_two_losses_in_a_row_continue_on_the_remaining_slices(tmp_path, reference):
    state, events = _train(tmp_path, schedule="lose:1@5,lose:3@6")
    losses = [k for k in _kinds(events) if k[:2] == ("stop", "slice_lost")]
    assert len(losses) == 2
    assert [e.slices for e in events if e.kind == "step"][-1] == 2
    consumed = _assert_exactly_once(events, 12)
    assert int(state["seen"]) == sum(range(consumed))
    np.testing.assert_allclose(state["w"], reference[0]["w"], **TOLERANCE)


def test_pause_resume_waits_for_the_slice_and_matches_bitwise(tmp_path, reference):
    """minimum_slice_count=None: the run waits until the lost slice is healthy again.

    No step is announced while the run waits, so the return is keyed to time (``@+0.5``).
    """
    events: list[Event] = []
    with SimulatedSlices(4, 2, schedule="lose:0@6,restore:0@+0.5"):
        run = ElasticRun(
            LinearProgram(), ElasticData(_dataset()),
            _config(tmp_path, minimum_slice_count=None, checkpoint_every=0), emit=events.append,
        )
        state, _ = run.run(12)
        state = jax.device_get(state)
    kinds = _kinds(events)
    assert ("stop", "slice_lost", 5) in kinds
    _assert_resumed_from_a_taken_snapshot(events, 5)
    assert all(e.slices == 4 for e in events if e.kind == "step")
    resume = [e for e in events if e.kind == "resume"][1]
    assert resume.durations["wait_for_slices"] > 0
    _assert_exactly_once(events, 12)
    np.testing.assert_array_equal(state["w"], reference[0]["w"])
    assert int(state["seen"]) == int(reference[0]["seen"])


def test_a_loss_during_a_snapshot_save_falls_back_to_the_previous_snapshot(tmp_path, reference):
    state, events = _train(tmp_path, schedule="lose:1@6/snapshot")
    kinds = _kinds(events)
    # The snapshot of step 6 was never whole; the newest complete state across the tiers is
    # then step 5's persistent checkpoint (newer than step 4's snapshot).
    assert ("resume", "checkpoint", 6) in kinds
    consumed = _assert_exactly_once(events, 12)
    assert int(state["seen"]) == sum(range(consumed))
    np.testing.assert_allclose(state["w"], reference[0]["w"], **TOLERANCE)


def test_a_loss_during_a_restore_retries_on_fewer_slices(tmp_path, reference):
    """Orbax's snapshot load donates the replicas it joins, so a load cut short by a
    second loss has consumed the snapshot: the next attempt uses the checkpoint tier."""
    state, events = _train(tmp_path, schedule="lose:1@5,lose:2@5/snapshot_load", checkpoint_every=2)
    kinds = _kinds(events)
    losses = [k for k in kinds if k[:2] == ("stop", "slice_lost")]
    assert len(losses) == 2
    assert [k for k in kinds if k[0] == "resume"][1:] == [("resume", "checkpoint", 5)]
    assert [e.slices for e in events if e.kind == "step"][-1] == 2
    consumed = _assert_exactly_once(events, 12)
    assert int(state["seen"]) == sum(range(consumed))
    np.testing.assert_allclose(state["w"], reference[0]["w"], **TOLERANCE)


def test_a_preemption_checkpoints_the_agreed_step_and_the_rerun_resumes_there(tmp_path, reference):
    """A real SIGTERM (the schedule's ``preempt``) reaches a lone process's notice."""
    notice = PreemptionNotice()
    try:
        with pytest.raises(Preempted) as stopped:
            _train(tmp_path, schedule="preempt@7", notice=notice)
    finally:
        notice.close()
    assert stopped.value.step == 7
    state, events = _train(tmp_path, schedule="preempt@7")  # already fired: not again
    kinds = _kinds(events)
    assert kinds[0] == ("resume", "checkpoint", 8)
    assert kinds[-1] == ("stop", "done", 12)
    steps = [e.step for e in events if e.kind == "step"]
    assert steps == list(range(8, 13))
    np.testing.assert_array_equal(state["w"], reference[0]["w"])
    assert int(state["seen"]) == int(reference[0]["seen"])


