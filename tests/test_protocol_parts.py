"""The protocol's collaborators on their own: step compiler, recovery timer, tiers, typed events.

The scenarios in ``tests/test_protocol.py`` drive them together through :class:`ElasticRun`;
these pin each one's contract on the 8-CPU-device mesh, with real Orbax tiers.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew.elastic import events, hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.loop.compiler import StepCompiler
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.elastic.loop.recovery import Recovery, RecoveryTimer
from elastic_dew.elastic.state.checkpoints import Checkpoints
from elastic_dew.elastic.state.snapshots import Snapshots
from elastic_dew.elastic.state.tiers import Tiers
from elastic_dew.simulate import SimulatedSlices

from linear import LinearProgram
from linear import config as _config
from linear import dataset as _dataset


def _mesh(replicas: int = 2) -> Mesh:
    devices = np.array(jax.devices()[: replicas * 2]).reshape(replicas, 2, 1)
    return Mesh(devices, ("replica", "data", "model"))


def _state(mesh: Mesh) -> dict:
    return {"w": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P()))}


class CountingProgram:
    """A program whose compile counts its calls and can be held, to see who compiles."""

    def __init__(self) -> None:
        self.compiles = 0
        self.release = threading.Event()
        self.release.set()

    def compile(self, mesh, global_batch):
        self.compiles += 1
        self.release.wait(30)
        return lambda state, batch: (state, {"loss": jnp.float32(0)})


def test_a_step_is_compiled_once_per_devices_and_batch():
    program = CountingProgram()
    compiler = StepCompiler(program, manager=None, config=ElasticConfig(global_batch=8))
    mesh = _mesh()
    first = compiler.compile(mesh, 8)
    assert compiler.compile(mesh, 8) is first
    compiler.compile(mesh, 16)
    compiler.compile(_mesh(1), 8)
    assert program.compiles == 3


def test_the_loop_waits_for_the_precompiler_instead_of_compiling_the_same_step_again():
    program = CountingProgram()
    program.release.clear()
    compiler = StepCompiler(program, manager=None, config=ElasticConfig(global_batch=8))
    mesh = _mesh()
    background = threading.Thread(target=compiler.compile, args=(mesh, 8))
    background.start()
    while program.compiles == 0:
        threading.Event().wait(0.01)
    waiting = threading.Thread(target=compiler.compile, args=(mesh, 8))
    waiting.start()
    program.release.set()
    background.join()
    waiting.join()
    assert program.compiles == 1


def test_the_precompiler_starts_no_compile_while_a_resume_holds_it():
    program = CountingProgram()
    program.release.clear()
    devices = jax.devices()
    manager = type("Manager", (), {
        "active_slice_indices": {0, 1, 2}, "total_slice_count": 3,
        "slice_to_devices": {i: devices[2 * i: 2 * i + 2] for i in range(3)},
    })()
    compiler = StepCompiler(program, manager, ElasticConfig(
        global_batch=8, minimum_slice_count=1, precompile_smaller_meshes=True,
    ))
    compiler.start_precompiling()  # three layouts of two slices
    while program.compiles == 0:
        threading.Event().wait(0.01)
    compiler.pause_precompiling()  # a resume begins while the first layout compiles
    program.release.set()
    threading.Event().wait(0.3)
    assert program.compiles == 1
    compiler.start_precompiling()  # the resume is done
    compiler._precompiler.join(30)
    assert program.compiles == 3


def _manager(active: set[int], slices: int = 3):
    """A stand-in for pathwaysutils' ``Manager``: the three attributes the compiler reads."""
    devices = jax.devices()
    return type("Manager", (), {
        "active_slice_indices": active, "total_slice_count": slices,
        "slice_to_devices": {i: devices[2 * i: 2 * i + 2] for i in range(slices)},
    })()


def test_the_precompiler_compiles_each_layouts_step_together_with_its_other_programs():
    order: list[tuple[str, tuple]] = []
    ids = lambda mesh: tuple(d.id for d in mesh.devices.flat)  # noqa: E731
    program = type("Program", (), {
        "compile": lambda self, mesh, batch: order.append(("step", ids(mesh))) or (lambda s, b: (s, {})),
    })()
    compiler = StepCompiler(
        program, _manager({0, 1, 2}),
        ElasticConfig(global_batch=8, minimum_slice_count=1, precompile_smaller_meshes=True),
        also=lambda mesh: order.append(("also", ids(mesh))),
    )
    compiler.start_precompiling()
    compiler._precompiler.join(30)
    layouts = [ids(mesh) for mesh, _ in compiler.smaller_layouts()]
    assert len(layouts) == 3
    assert order == [(kind, layout) for layout in layouts for kind in ("step", "also")]
    compiler.start_precompiling()  # every layout is covered: nothing is compiled again
    compiler.stop_precompiling()
    assert len(order) == 6


def test_a_start_while_the_precompiler_works_queues_the_new_slices_layouts_in_place_of_the_old_ones():
    """Slice 3 is lost while the first layout of four slices compiles: the thread finishes
    that step (not that layout's other programs: no loss from three slices leads there),
    then covers the layouts of the three slices left, not the other three of four."""
    program = CountingProgram()
    program.release.clear()
    covered: list[tuple] = []
    ids = lambda mesh: tuple(d.id for d in mesh.devices.flat)  # noqa: E731
    manager = _manager({0, 1, 2, 3}, slices=4)
    compiler = StepCompiler(
        program, manager, ElasticConfig(global_batch=8, minimum_slice_count=1, precompile_smaller_meshes=True),
        also=lambda mesh: covered.append(ids(mesh)),
    )
    of_four = [ids(mesh) for mesh, _ in compiler.smaller_layouts()]
    compiler.start_precompiling()
    while program.compiles == 0:
        threading.Event().wait(0.01)
    compiler.pause_precompiling()  # slice 3 is lost: a resume begins
    manager.active_slice_indices = {0, 1, 2}
    of_three = [ids(mesh) for mesh, _ in compiler.smaller_layouts()]
    running = compiler._precompiler
    compiler.start_precompiling()  # the resume is done while the thread still works
    program.release.set()
    running.join(30)
    assert compiler._precompiler is running  # no second thread: the one at work took the new layouts
    assert covered == of_three
    assert program.compiles == 4


class _RecordingProgram(LinearProgram):
    """A :class:`LinearProgram` that records the layout of every compile it is asked for."""

    def __init__(self, expected: int) -> None:
        self.layouts: list[tuple] = []
        self.all_seen = threading.Event()
        self.expected = expected

    def compile(self, mesh, global_batch):
        step_fn = super().compile(mesh, global_batch)
        self.layouts.append((tuple(d.id for d in mesh.devices.flat), global_batch))
        if len(self.layouts) >= self.expected:
            self.all_seen.set()
        return step_fn


def test_the_precompiler_covers_every_layout_that_loses_one_active_slice_compiling_one_and_loading_it_onto_the_others(tmp_path):
    program = _RecordingProgram(expected=1)
    with SimulatedSlices(4, 2):
        run = ElasticRun(
            program, ElasticData(_dataset()), _config(tmp_path, precompile_smaller_meshes=True),
        )
        layouts = run.compiler.smaller_layouts()
        assert len(layouts) == 4
        assert {mesh.devices.shape for mesh, _ in layouts} == {(3, 2, 1)}
        run.compiler.start_precompiling()
        assert program.all_seen.wait(300), program.layouts  # in the background
        run.compiler._precompiler.join(300)
        run.compiler.stop_precompiling()
        # One compile: the same program on the other layouts' devices is loaded, not compiled.
        assert program.layouts == [(tuple(d.id for d in layouts[0][0].devices.flat), layouts[0][1])]
        for mesh, batch in layouts:  # the loop finds each one compiled, on its own devices
            step = run.compiler.compile(mesh, batch)
            assert isinstance(step, jax.stages.Compiled)
            assert step.input_shardings[0][0]["w"].mesh.devices.tolist() == mesh.devices.tolist()
        assert len(program.layouts) == 1
        paused = StepCompiler(LinearProgram(), run.manager, _config(tmp_path, minimum_slice_count=None))
        assert paused.smaller_layouts() == []  # pause-resume never runs on fewer slices


def test_a_recovery_reports_every_duration_key_and_consumes_the_loss():
    timer = RecoveryTimer()
    fresh = timer.recover()
    fresh.lap("mesh_and_compile")
    fresh.lap("restore")
    assert fresh.durations["detection"] == 0.0 and fresh.durations["wait_for_slices"] == 0.0
    resume = events.Resume(source="fresh", step=1, durations=fresh.durations)
    assert set(resume.durations) == set(events.DURATION_KEYS)

    import time

    timer.step_started(time.monotonic())
    timer.slice_lost()
    timer.attempt_started()
    after_loss = timer.recover()
    assert after_loss.durations["detection"] >= 0.0 and after_loss.durations["wait_for_slices"] >= 0.0
    timer.attempt_started()
    again = timer.recover()
    assert again.durations == {"detection": 0.0, "wait_for_slices": 0.0}
    assert Recovery.live().durations == {"detection": 0.0, "wait_for_slices": 0.0}


def _saves(emitted: list) -> list:
    return [e for e in emitted if isinstance(e, events.Save)]


def test_the_tiers_snapshot_on_their_cadence_and_emit_the_typed_save_event():
    mesh = _mesh()
    snapshots = Snapshots(replica_axis_index=0)
    emitted: list = []
    try:
        tiers = Tiers(snapshots, None, snapshot_every=2, emit=emitted.append)
        assert tiers.on_step(1, _state(mesh), {"step": 1}, mesh) is None and emitted == []
        assert tiers.on_step(2, _state(mesh), {"step": 2}, mesh) is not None
        [saved] = emitted
        assert isinstance(saved, events.Save)
        assert (saved.tier, saved.step, saved.taken) == ("snapshot", 2, True)
        assert snapshots.latest_step() == 2
        assert Tiers(snapshots, None, snapshot_every=0).on_step(4, _state(mesh), {}, mesh) is None
    finally:
        snapshots.close()


def test_the_tiers_checkpoint_on_their_cadence_at_the_end_and_on_preemption(tmp_path):
    mesh = _mesh()
    checkpoints = Checkpoints(str(tmp_path / "ckpt"), max_to_keep=5)
    emitted: list = []
    tiers = Tiers(None, checkpoints, checkpoint_every=3, emit=emitted.append)
    assert tiers.on_step(2, _state(mesh), {"step": 2}, mesh) is None
    tiers.on_step(3, _state(mesh), {"step": 3}, mesh)
    [on_cadence] = _saves(emitted)
    assert (on_cadence.tier, on_cadence.step, on_cadence.taken) == ("checkpoint", 3, True)
    assert tiers.save_final(3, _state(mesh), {"step": 3}) is None  # the cadence already saved it
    final = tiers.save_final(4, _state(mesh), {"step": 4})
    assert (final.tier, final.step) == ("checkpoint", 4) and checkpoints.latest_step() == 4
    stop = tiers.save_preemption(5, _state(mesh), {"step": 5})
    assert (stop.tier, stop.step, stop.taken) == ("checkpoint", 5, True)
    assert checkpoints.latest_step() == 5
    assert _saves(emitted) == [on_cadence, final, stop]
    assert [e.step for e in emitted if isinstance(e, events.Commit)] == [3, 4, 5]
    nowhere = Tiers(None, None, checkpoint_every=3)
    assert nowhere.on_step(3, _state(mesh), {}, mesh) is None
    assert nowhere.save_final(3, _state(mesh), {}) is None and nowhere.save_preemption(3, _state(mesh), {}) is None


def test_the_tiers_offer_a_step_to_the_snapshot_before_the_checkpoint(tmp_path):
    mesh = _mesh()
    emitted: list = []
    tiers = Tiers.from_config(_config(tmp_path), slices=4, emit=emitted.append)
    try:
        assert tiers.snapshots is not None and tiers.checkpoints is not None
        assert tiers.newest() == ("fresh", None) and tiers.restore(None) is None
        assert tiers.on_step(10, _state(mesh), {"step": 10}, mesh) is not None
        assert [(e.tier, e.step) for e in _saves(emitted)] == [("snapshot", 10), ("checkpoint", 10)]
    finally:
        tiers.close()


def test_the_protocol_emits_typed_events_and_keeps_no_device_array_after_a_run(tmp_path):
    emitted: list = []
    with SimulatedSlices(4, 2, schedule="lose:1@3", fault_log=tmp_path / "faults.jsonl"):
        run = ElasticRun(LinearProgram(), ElasticData(_dataset()), _config(tmp_path), emit=emitted.append)
        state, step = run.run(6)
    assert step == 6 and all(isinstance(e, events.Event) for e in emitted)
    kinds = {type(e) for e in emitted}
    assert {events.Resume, events.Step, events.Save, events.Stop} <= kinds
    assert [events.from_json(e.to_json()) for e in emitted] == emitted
    held = [vars(run), vars(run.timer), vars(run.tiers)]
    assert not [v for d in held for v in d.values() if isinstance(v, jax.Array)]
    del state


def test_no_save_compiles_a_program_since_each_resume_compiles_the_saves_of_its_layout(tmp_path):
    """A fresh start, a resume from a snapshot on three slices and a scale-up back to four:
    every backend compile happens outside the saves (jax.monitoring's compile events,
    attributed to the phase announced last) on the loop's thread."""
    loop = threading.current_thread()
    during_saves: list = []
    phase = ["start"]

    def on_phase(name, step):
        phase[0] = name

    def on_compile(event, duration, **kwargs):
        in_loop = threading.current_thread() is loop  # not the precompiler's
        if event == "/jax/core/compile/backend_compile_duration" and in_loop and phase[0] in ("snapshot", "checkpoint"):
            during_saves.append(phase[0])

    hooks.add_listener(on_phase)
    jax.monitoring.register_event_duration_secs_listener(on_compile)
    emitted: list = []
    try:
        with SimulatedSlices(4, 2, schedule="lose:1@3,restore:1@5", fault_log=tmp_path / "faults.jsonl"):
            run = ElasticRun(LinearProgram(), ElasticData(_dataset()), _config(tmp_path, snapshot_every=1),
                             emit=emitted.append)
            run.run(7)
    finally:
        hooks.remove_listener(on_phase)
        jax.monitoring.unregister_event_duration_listener(on_compile)
    assert [e.source for e in emitted if isinstance(e, events.Resume)] == ["fresh", "snapshot", "live"]
    assert sum(isinstance(e, events.Save) and e.tier == "snapshot" for e in emitted) >= 6
    assert during_saves == []


class _HeldProgram(LinearProgram):
    """A :class:`LinearProgram` whose first compile in the precompiler's thread waits for
    ``release``: the precompiler is still at work when the loop resumes."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.held = False

    def compile(self, mesh, global_batch):
        if threading.current_thread().name.startswith("elastic-dew-precompile") and not self.held:
            self.held = True
            self.release.wait(120)
        return super().compile(mesh, global_batch)


def test_a_resume_onto_a_mesh_the_precompiler_covered_compiles_nothing_even_if_queued_while_it_worked(tmp_path):
    """Slice 1 is lost at step 3 while the precompiler still compiles the first layout of
    four slices (held until that resume compiles), so that resume compiles; the meshes of
    the three slices left are queued at its end although the thread is still at work, and
    covered before step 5 (the loop waits for the thread there). From slice 2's loss at
    step 6 to the next dispatch (the resume's step, snapshot load and pack) the loop's
    thread runs no backend compile (jax.monitoring's compile events)."""
    loop = threading.current_thread()
    program = _HeldProgram()
    windows: list[int] = []  # the loop's compiles in each resume after a loss
    state = {"resuming": False, "attempt": 0}
    run_box: list = []

    def on_phase(name, step):
        if name == "compile":
            state["attempt"] += 1
            if state["attempt"] == 2:
                program.release.set()
        if name == "dispatch" and step == 5 and run_box[0].compiler._precompiler is not None:
            run_box[0].compiler._precompiler.join(120)
        if name == "wait" and not state["resuming"]:
            state["resuming"] = True
            windows.append(0)
        elif name == "dispatch":
            state["resuming"] = False

    def on_compile(event, duration, **kwargs):
        if (event == "/jax/core/compile/backend_compile_duration" and threading.current_thread() is loop
                and state["resuming"]):
            windows[-1] += 1

    hooks.add_listener(on_phase)
    jax.monitoring.register_event_duration_secs_listener(on_compile)
    emitted: list = []
    try:
        with SimulatedSlices(4, 2, schedule="lose:1@3,lose:2@6", fault_log=tmp_path / "faults.jsonl"):
            run = ElasticRun(program, ElasticData(_dataset()),
                             _config(tmp_path, snapshot_every=1, precompile_smaller_meshes=True),
                             emit=emitted.append)
            run_box.append(run)
            run.run(8)
    finally:
        program.release.set()
        hooks.remove_listener(on_phase)
        jax.monitoring.unregister_event_duration_listener(on_compile)
    assert [e.source for e in emitted if isinstance(e, events.Resume)] == ["fresh", "snapshot", "snapshot"]
    assert len(windows) == 2 and windows[0] > 0  # the first resume's mesh was not covered yet
    assert windows[1] == 0


class _WatchedProgram(LinearProgram):
    """A :class:`LinearProgram` whose steps keep weak references to every state they take
    and return, so a test can see which of them are still alive (and nothing else)."""

    def __init__(self) -> None:
        self.states: list[tuple[int, weakref.ref]] = []
        self.attempt = 0  # numbered from 1 as each attempt announces its compile

    def compile(self, mesh, global_batch):
        step_fn = super().compile(mesh, global_batch)

        def watched(state, batch):
            new_state, metrics = step_fn(state, batch)
            for tree in (state, new_state):
                self.states.extend((self.attempt, weakref.ref(leaf)) for leaf in jax.tree.leaves(tree))
            return new_state, metrics

        return watched


def test_a_failed_attempts_state_is_freed_before_the_next_attempt_starts(tmp_path, monkeypatch):
    """Weak references to every state a step took or returned: at the next attempt's first
    announcement none of the failed attempt's may be alive.

    pathwaysutils logs the slice loss with its traceback (``_logger.exception``), and
    pytest's log capture keeps every record, traceback and frames included, which would keep
    the failed attempt's arrays alive; a run's own log handlers format a record and drop it.
    So that logger's records stop at a handler that drops them here.
    """
    pathways_log = logging.getLogger("pathwaysutils.elastic.manager")
    monkeypatch.setattr(pathways_log, "propagate", False)
    monkeypatch.setattr(pathways_log, "handlers", [logging.NullHandler()])
    program = _WatchedProgram()
    alive_at_start: list[int] = []

    def on_phase(phase, step):
        if phase != "compile":  # an attempt's first announcement, before it restores
            return
        if program.attempt > 0:
            gc.collect()
            alive_at_start.append(
                sum(ref() is not None for attempt, ref in program.states if attempt == program.attempt)
            )
        program.attempt += 1

    hooks.add_listener(on_phase)
    try:
        with SimulatedSlices(4, 2, schedule="lose:1@3", fault_log=tmp_path / "faults.jsonl"):
            run = ElasticRun(program, ElasticData(_dataset()), _config(tmp_path, snapshot_every=2))
            state, step = run.run(6)
    finally:
        hooks.remove_listener(on_phase)
    assert step == 6 and program.attempt == 2
    assert sum(attempt == 1 for attempt, _ in program.states) >= 4  # the failed attempt stepped
    assert alive_at_start == [0]
    del state


def test_the_runs_configuration_and_tiers_are_read_only_once_it_is_built():
    """A run's settings are decided once: its config and tiers are properties without setters
    (a benchmark that varies a cadence sets that tier's own ``every``)."""
    from elastic_dew.elastic.loop.protocol import ElasticRun

    assert {name: getattr(ElasticRun, name).fset for name in ("config", "snapshots", "checkpoints")} == {
        "config": None, "snapshots": None, "checkpoints": None}


def test_the_runtimes_preemption_notice_is_every_part_of_the_notice_the_loop_asks():
    """The loop asks a notice's optional parts by protocol (a notice without them still
    works): a rename on either side would silently stop a preemption ending a recovery."""
    from elastic_dew.elastic.loop import program
    from elastic_dew.runtime import PreemptionNotice

    class Minimal:
        def reached(self, step: int) -> bool:
            return False

    with PreemptionNotice() as notice:
        for part in (program.WaitingNotice, program.InterruptingNotice, program.ReceivedNotice):
            assert isinstance(notice, part), part.__name__
    assert not any(isinstance(Minimal(), part) for part in (
        program.WaitingNotice, program.InterruptingNotice, program.ReceivedNotice))


class _GatedProgram(LinearProgram):
    """A :class:`LinearProgram` whose step k runs on until the loop dispatches step k + 1
    (the last step, until the loop reads it): a device that is always busy."""

    def __init__(self, final: int) -> None:
        self.final, self.permits = final, threading.Semaphore(0)
        self.ran: list = []  # one entry per step run to its end

    def on_phase(self, name, step):
        if (name == "dispatch" and step >= 2) or (name == "step" and step == self.final):
            self.permits.release()

    def compile(self, mesh, global_batch):
        permits, ran = self.permits, self.ran

        def held(seen):
            permits.acquire(timeout=30)
            ran.append(seen)
            return seen

        def step(state, batch):
            value, grad = jax.value_and_grad(lambda w: jnp.mean((batch["x"] @ w - batch["y"]) ** 2))(state["w"])
            seen = state["seen"] + jnp.sum(batch["index"])
            seen = jax.pure_callback(held, jax.ShapeDtypeStruct((), jnp.int32), seen)
            return {"w": state["w"] - 0.05 * grad, "seen": seen}, {"loss": value + 0.0 * seen}

        replicated = NamedSharding(mesh, P())
        return jax.jit(step, out_shardings=(replicated, replicated))


class _SlowData(ElasticData):
    def next(self):
        time.sleep(0.05)
        return super().next()


def test_a_batch_read_while_the_step_before_it_computes_is_not_charged_as_data_loading(tmp_path):
    """data_seconds is the time the loop waited for data: the first step's read (nothing in
    flight) is charged; each later read ends while the step before it still computes
    (held until the next dispatch), so it overlapped the device and is charged 0."""
    program = _GatedProgram(final=5)
    emitted: list = []
    hooks.add_listener(program.on_phase)
    try:
        with SimulatedSlices(4, 2):
            config = _config(tmp_path, snapshot_every=0, checkpoint_every=0)
            ElasticRun(program, _SlowData(_dataset()), config, emit=emitted.append).run(5)
    finally:
        hooks.remove_listener(program.on_phase)
    charged = {e.step: e.data_seconds for e in emitted if isinstance(e, events.Step)}
    assert sorted(charged) == [1, 2, 3, 4, 5]
    assert charged[1] >= 0.05
    assert [charged[s] for s in (2, 3, 4, 5)] == [0.0] * 4


def test_a_preemption_saves_without_waiting_for_the_step_in_flight_or_listing_what_it_knows(tmp_path, monkeypatch):
    """A SIGTERM at step 3 while step 4 is in flight (held until a dispatch that never comes):
    the stop's checkpoint is written and committed while step 4 still runs, and the stop
    lists the checkpoint directory no more (the resume listed it; its own commits are known)."""
    from etils import epath

    from elastic_dew.runtime import Preempted, PreemptionNotice

    program = _GatedProgram(final=12)
    directory = tmp_path / "checkpoints"
    stopping, listings, at_save = [False], [0], []
    path_type = type(epath.Path(directory))
    iterdir = path_type.iterdir

    def counted_iterdir(self):
        if stopping[0] and os.fspath(self) == os.fspath(directory):
            listings[0] += 1
        return iterdir(self)

    def on_phase(name, step):
        program.on_phase(name, step)
        stopping[0] = stopping[0] or name == "stop"

    def on_event(event):
        if isinstance(event, events.Save) and event.tier == "checkpoint":
            at_save.append(len(program.ran))

    monkeypatch.setattr(path_type, "iterdir", counted_iterdir)
    hooks.add_listener(on_phase)
    notice = PreemptionNotice()
    try:
        with SimulatedSlices(4, 2, schedule="preempt@3"), pytest.raises(Preempted) as stopped:
            config = _config(tmp_path, snapshot_every=0, checkpoint_every=100)
            ElasticRun(program, ElasticData(_dataset()), config, emit=on_event, notice=notice).run(12)
    finally:
        hooks.remove_listener(on_phase)
        notice.close()
        for _ in range(4):
            program.permits.release()  # let the dropped step end
    step = stopped.value.step
    assert step >= 3 and at_save == [step]  # the steps up to the stop's had run, the one after it had not
    assert listings == [0]
