"""Steps that never wait on the host: step N+1 is dispatched before step N's result is read.

A recording program wraps a small linear model's compiled step: every call of the step
function logs a dispatch, and the loss it returns logs a read when the protocol converts it
to a float (the one read of a step's result the loop makes). Every other way to wait for a
step's outputs, ``jax.block_until_ready`` and ``jax.device_get`` on its state or metrics,
is logged too as a wait (the real functions, wrapped to see their arguments). The run's
events go to the same log, so the tests can check the order of dispatches, reads, waits,
step lines and saves, on the simulator's CPU slices, including around a lost slice and a
preemption stop.
"""

from __future__ import annotations

import contextlib
import weakref
from unittest import mock

import jax
import pytest

from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.runtime import Preempted
from elastic_dew.simulate import SimulatedSlices

import linear
from linear import LinearProgram, dataset

pytestmark = pytest.mark.libraries  # the simulator's dispatch patch

GLOBAL_BATCH = linear.GLOBAL_BATCH


class _Loss:
    """A step's loss that logs when the protocol reads it."""

    def __init__(self, value: jax.Array, step: int, log: list) -> None:
        self.value, self.step, self.log = value, step, log

    def __float__(self) -> float:
        self.log.append(("read", self.step))
        return float(self.value)

    def is_ready(self) -> bool:  # asks, never waits: not a read
        return self.value.is_ready()


class RecordingProgram(LinearProgram):
    """A linear model whose step function logs each dispatch (numbered in call order) and
    hands back a loss that logs its read. ``seen`` sums the example indices trained on."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.calls = 0
        self.outputs: dict[int, tuple[int, object]] = {}  # id -> (step, the output, kept alive)

    def step_of(self, tree) -> list[int]:
        """The steps whose outputs (state leaves or loss) ``tree`` holds."""
        return sorted({self.outputs[id(leaf)][0] for leaf in jax.tree.leaves(tree) if id(leaf) in self.outputs})

    @contextlib.contextmanager
    def watching_waits(self):
        """Log ``("wait", step, how)`` whenever the run blocks on or fetches a step's outputs."""

        def watched(real, how):
            def wait(tree, *args, **kwargs):
                self.log.extend(("wait", step, how) for step in self.step_of(tree))
                return real(tree, *args, **kwargs)

            return wait

        with mock.patch.object(jax, "block_until_ready", watched(jax.block_until_ready, "block_until_ready")), \
                mock.patch.object(jax, "device_get", watched(jax.device_get, "device_get")):
            yield

    def compile(self, mesh, global_batch):
        compiled = super().compile(mesh, global_batch)

        def recorded(state, batch):
            self.calls += 1
            self.log.append(("dispatch", self.calls))
            new_state, metrics = compiled(state, batch)
            loss = _Loss(metrics["loss"], self.calls, self.log)
            for output in [*jax.tree.leaves(new_state), metrics["loss"], loss]:
                self.outputs[id(output)] = (self.calls, output)
            return new_state, {"loss": loss}

        return recorded


class _NoticeAt:
    """A preemption notice agreed on ``step`` (a stand-in for the runtime's, which needs a signal)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def reached(self, step: int) -> bool:
        return step >= self.step


def _run(tmp_path, steps, *, schedule=None, notice=None, **overrides):
    log: list = []
    config = linear.config(
        tmp_path, checkpoint_every=3,
        precompile_smaller_meshes=False, **overrides,
    )

    def emit(event):
        detail = getattr(event, "reason", None) or getattr(event, "tier", None) or getattr(event, "source", None)
        log.append((event.kind, detail, event.step))

    program = RecordingProgram(log)
    with SimulatedSlices(4, 2, schedule=schedule, fault_log=tmp_path / "faults.jsonl"):
        run = ElasticRun(program, ElasticData(dataset(2048)), config, emit=emit, notice=notice)
        try:
            with program.watching_waits():
                state, _ = run.run(steps)
            return jax.device_get(state), log
        except Preempted:
            return None, log


def test_no_step_result_is_read_before_the_next_step_is_dispatched_and_a_save_first_waits_for_the_step_in_flight(tmp_path):
    """A save's clock starts once the step in flight is done (its wait is step time, not
    saving), whatever the platform: the wait comes once before a step's saves, and nowhere
    else."""
    _, log = _run(tmp_path, 8)
    saved = {entry[2] for entry in log if entry[0] == "save"}  # snapshot every 2, checkpoint every 3
    for n in range(1, 8):
        assert log.index(("dispatch", n + 1)) < log.index(("read", n)), log
        waits = [i for i, entry in enumerate(log) if entry[:2] == ("wait", n)]
        early = [i for i in waits if i < log.index(("dispatch", n + 1))]
        if n - 1 in saved:
            first_save = min(i for i, entry in enumerate(log) if entry[0] == "save" and entry[2] == n - 1)
            assert len(early) == 1 and log.index(("step", None, n - 1)) < early[0] < first_save, log
        else:
            assert early == [], log
    # The final step is read, and nothing past it is dispatched.
    assert ("read", 8) in log and ("dispatch", 9) not in log


def test_step_and_save_seconds_never_overlap_so_they_add_up_to_at_most_the_loops_time(tmp_path):
    """Counted, not timed: with the wait for the step in flight booked to that step, no
    second is in a step line and a save at once."""
    events: list = []
    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, timeout=60, global_batch=GLOBAL_BATCH,
        snapshot_every=1, checkpoint_every=2, checkpoint_dir=str(tmp_path / "checkpoints"),
        precompile_smaller_meshes=False,
    )
    with SimulatedSlices(4, 2):
        ElasticRun(LinearProgram(), ElasticData(dataset(2048)), config, emit=events.append).run(8)
    steps = {e.step: e for e in events if e.kind == "step"}
    saves = [e for e in events if e.kind == "save" and 1 <= e.step < 7]
    booked = sum(steps[n].seconds for n in range(2, 8)) + sum(e.seconds for e in saves)
    assert booked <= steps[7].wall - steps[1].wall + 1e-3, (booked, steps[7].wall - steps[1].wall)


def test_a_step_line_and_its_saves_follow_its_read_and_the_next_dispatch(tmp_path):
    _, log = _run(tmp_path, 8)
    for n in range(1, 9):
        line = log.index(("step", None, n))
        assert log.index(("read", n)) < line
        if n < 8:
            assert log.index(("dispatch", n + 1)) < line
        for saved in [i for i, entry in enumerate(log) if entry[0] == "save" and entry[2] == n]:
            assert saved > line
    assert [entry[2] for entry in log if entry[0] == "step"] == list(range(1, 9))
    assert log[-1] == ("stop", "done", 8)


def test_a_slice_lost_under_the_lag_stops_at_the_last_read_step_and_keeps_data_exactly_once(tmp_path):
    """The loss fires while step 5 and step 6 are both in flight: step 5's read fails, so
    the last completed step is 4 and neither 5 nor 6 is recorded before the resume."""
    state, log = _run(tmp_path, 10, schedule="lose:1@5")
    lost = log.index(("stop", "slice_lost", 4))
    assert log.index(("dispatch", 6)) < lost
    assert not [e for e in log[:lost] if e[0] == "step" and e[2] >= 5]
    committed = [e[2] for e in log if e[0] == "step"]
    resumed = next(e for e in log[lost:] if e[0] == "resume")
    assert committed[: committed.index(resumed[2])] == list(range(1, resumed[2]))
    assert sorted(set(committed)) == list(range(1, 11))
    assert int(state["seen"]) == sum(range(10 * GLOBAL_BATCH))


def test_the_preemption_step_is_read_and_checkpointed_with_its_own_state_not_the_one_in_flight(tmp_path):
    """The step in flight is dropped and its result not waited for: the checkpoint starts at once."""
    _, log = _run(tmp_path, 10, notice=_NoticeAt(5))
    assert log.index(("dispatch", 6)) < log.index(("read", 5)) < log.index(("stop", "preempted", 5))
    assert ("step", None, 6) not in log and ("read", 6) not in log
    assert log.index(("read", 5)) < log.index(("save", "checkpoint", 5))
    assert ("wait", 6, "block_until_ready") not in log[:log.index(("stop", "preempted", 5))]
    # The re-run resumes from step 5's checkpoint, at step 5's data position: every example
    # is trained on once, though step 6's batch had been taken when the first run stopped.
    state, rerun = _run(tmp_path, 10)
    assert rerun[0] == ("resume", "checkpoint", 6)
    assert int(state["seen"]) == sum(range(10 * GLOBAL_BATCH))


@pytest.mark.parametrize("steps", [1, 2])
def test_a_run_of_one_or_two_steps_reads_every_step_once(tmp_path, steps):
    _, log = _run(tmp_path, steps)
    assert [e for e in log if e[0] in ("dispatch", "read")].count(("read", steps)) == 1
    assert [e[1] for e in log if e[0] == "dispatch"] == list(range(1, steps + 1))


class _WeakProgram(LinearProgram):
    """A linear model whose step function keeps only weak references to each step's state."""

    def __init__(self) -> None:
        self.calls = 0
        self.states: dict[int, list[weakref.ref]] = {}

    def alive(self) -> list[int]:
        return sorted(n for n, refs in self.states.items() if any(r() is not None for r in refs))

    def compile(self, mesh, global_batch):
        compiled = super().compile(mesh, global_batch)

        def step(state, batch):
            self.calls += 1
            new_state, metrics = compiled(state, batch)
            self.states[self.calls] = [weakref.ref(leaf) for leaf in jax.tree.leaves(new_state)]
            return new_state, metrics

        return step


def test_the_loop_lets_go_of_a_state_once_the_step_that_reads_it_is_dispatched(tmp_path):
    """So its buffers are freed by the runtime when that step has run, not on the loop's
    thread after the step's read: when step N's read begins, only the states of the steps
    in flight (N and N+1) are held; the final step's state is kept for the run's result."""
    program = _WeakProgram()
    held: dict[int, list[int]] = {}

    def listen(phase: str, step: int) -> None:
        if phase == "step":
            held[step] = program.alive()

    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, timeout=60, global_batch=GLOBAL_BATCH,
        snapshot_every=0, checkpoint_every=0, precompile_smaller_meshes=False,
    )
    hooks.add_listener(listen)
    try:
        with SimulatedSlices(4, 2):
            state, _ = ElasticRun(program, ElasticData(dataset(2048)), config).run(8)
    finally:
        hooks.remove_listener(listen)
    for step in range(2, 8):
        assert held[step] == [step, step + 1], held
    assert held[8] == [8] and int(state["seen"]) == sum(range(8 * GLOBAL_BATCH))
