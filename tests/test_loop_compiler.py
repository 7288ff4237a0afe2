"""The step compiler's precompiler at a stop after which the process exits, and its order.

Compiles are counted (the programs' own counters, ``jax.monitoring``'s compile and cache
events), never timed: a bounded wait only ever waits for something that must not happen.
"""

from __future__ import annotations

import random
import threading

import jax
import jax.numpy as jnp
import pytest

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.loop import compiler as compiler_module
from elastic_dew.elastic.loop.compiler import CACHE_WRITE_EVENT, COMPILED_EVENT, StepCompiler
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.runtime import Preempted
from elastic_dew.simulate import SimulatedSlices

from linear import LinearProgram
from linear import config as _config
from linear import dataset as _dataset


@pytest.fixture(autouse=True)
def _gate_opened_after():
    """The cache-write gate is the process's: every test leaves it open."""
    yield
    compiler_module._WRITES.open()


def _manager(active: set[int], slices: int = 3):
    """A stand-in for pathwaysutils' ``Manager``: the three attributes the compiler reads."""
    devices = jax.devices()
    return type("Manager", (), {
        "active_slice_indices": active, "total_slice_count": slices,
        "slice_to_devices": {i: devices[2 * i: 2 * i + 2] for i in range(slices)},
    })()


def _precompiling(program) -> StepCompiler:
    return StepCompiler(program, _manager({0, 1, 2}), ElasticConfig(
        global_batch=8, minimum_slice_count=1, precompile_smaller_meshes=True,
    ))


class _CompileThenWrite:
    """A program whose compile is held (``compile_release``), then announces JAX's cache
    write event as JAX does just before it writes, then writes (held by ``write_release``)."""

    def __init__(self) -> None:
        self.compile_release = threading.Event()
        self.write_release = threading.Event()
        self.write_release.set()
        self.compiling = threading.Event()
        self.writing = threading.Event()
        self.compiles = 0
        self.written = 0

    def compile(self, mesh, global_batch):
        self.compiles += 1
        self.compiling.set()
        self.compile_release.wait(60)
        jax.monitoring.record_event(CACHE_WRITE_EVENT)
        self.writing.set()
        self.write_release.wait(60)
        self.written += 1
        return lambda state, batch: (state, {})


def _wait_for(condition, bound: float = 30.0) -> None:
    done = threading.Event()
    for _ in range(int(bound / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the condition never held")


def test_a_stop_before_exit_does_not_wait_for_the_compile_in_progress_and_holds_its_cache_write():
    program = _CompileThenWrite()
    compiler = _precompiling(program)
    held_before = compiler_module._WRITES.held
    compiler.start_precompiling()
    assert program.compiling.wait(30)
    thread = compiler._precompiler
    compiler.stop_precompiling(exiting=True, timeout=5)  # returns with the compile still held
    assert thread.is_alive() and program.written == 0
    program.compile_release.set()  # the compile ends while the process would be exiting
    _wait_for(lambda: compiler_module._WRITES.held == held_before + 1)
    assert not program.writing.is_set() and program.written == 0  # held before the write began
    StepCompiler(LinearProgram(), None, ElasticConfig(global_batch=8))  # the process goes on: a run starts
    thread.join(30)
    assert not thread.is_alive()
    assert (program.compiles, program.written) == (1, 1)  # written whole; the stop started no other compile


def test_a_stop_before_exit_lets_a_cache_write_in_progress_finish_first():
    program = _CompileThenWrite()
    program.compile_release.set()
    program.write_release.clear()
    compiler = _precompiling(program)
    compiler.start_precompiling()
    assert program.writing.wait(30)
    stopper = threading.Thread(target=compiler.stop_precompiling, kwargs={"exiting": True, "timeout": 60})
    stopper.start()
    stopper.join(0.5)
    assert stopper.is_alive() and program.written == 0  # the stop waits for the write
    program.write_release.set()
    stopper.join(30)
    assert not stopper.is_alive() and program.written == 1
    compiler._precompiler.join(30)
    assert program.compiles == 1


def test_jax_announces_a_cache_write_in_the_compiling_thread_before_the_entry_is_written(compilation_cache):
    """The canary of the gate's two events: in this JAX, ``cache_misses`` comes in the
    compiling thread before the entry's file exists, the compile event after it does."""
    seen: list[tuple[str, int, bool]] = []
    compiling = threading.current_thread()
    entries = lambda: len(list(compilation_cache.glob("*-cache")))  # noqa: E731

    def on_event(event, **kwargs):
        if event == CACHE_WRITE_EVENT:
            seen.append(("write", entries(), threading.current_thread() is compiling))

    def on_duration(event, duration, **kwargs):
        if event == COMPILED_EVENT:
            seen.append(("compiled", entries(), threading.current_thread() is compiling))

    unique = random.random()  # a program no earlier test cached
    argument = jax.ShapeDtypeStruct((3,), jnp.float32)
    jax.monitoring.register_event_listener(on_event)
    jax.monitoring.register_event_duration_secs_listener(on_duration)
    try:
        jax.jit(lambda x: x * unique + 1).lower(argument).compile()
    finally:
        jax.monitoring.unregister_event_listener(on_event)
        jax.monitoring.unregister_event_duration_listener(on_duration)
    assert len(seen) == 2, seen
    [(first, before, in_thread), (second, after, in_thread_too)] = seen
    assert (first, second) == ("write", "compiled") and in_thread and in_thread_too
    assert after == before + 1


class _HeldPrecompile(LinearProgram):
    """A :class:`LinearProgram` whose compiles in the precompiler's thread wait for ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.finished = 0

    def compile(self, mesh, global_batch):
        if threading.current_thread().name.startswith("elastic-dew-precompile"):
            self.started.set()
            self.release.wait(120)
            compiled = super().compile(mesh, global_batch)
            self.finished += 1
            return compiled
        return super().compile(mesh, global_batch)


class _NoticeAt:
    """A preemption notice reached at ``step``, once ``ready`` is set (bounded)."""

    def __init__(self, step: int, ready: threading.Event) -> None:
        self.step, self.ready = step, ready

    def reached(self, step: int) -> bool:
        return step >= self.step and self.ready.wait(60)


def test_a_preempted_run_ends_without_waiting_for_the_precompilers_compile(tmp_path):
    program = _HeldPrecompile()
    try:
        with SimulatedSlices(4, 2):
            run = ElasticRun(program, ElasticData(_dataset()), _config(tmp_path, precompile_smaller_meshes=True),
                             notice=_NoticeAt(2, program.started))
            with pytest.raises(Preempted):
                run.run(6)
            assert program.started.is_set() and program.finished == 0  # run() did not join the compile
            thread = run.compiler._precompiler
    finally:
        program.release.set()
    compiler_module._WRITES.open()  # the process goes on
    thread.join(120)
    assert not thread.is_alive() and program.finished == 1  # the stop started no other compile


def test_the_precompiler_queues_compiled_steps_first_then_the_slices_lost_before_most_recent_first():
    """On four slices after slice 2 came back: the layout whose step the loop compiled
    (without slice 3) is covered first, then the one without slice 2 (lost before), then
    slices 0 and 1; each step not compiled yet is compiled once."""
    steps: list[tuple] = []
    covered: list[tuple] = []
    ids = lambda mesh: tuple(d.id for d in mesh.devices.flat)  # noqa: E731
    program = type("Program", (), {
        "compile": lambda self, mesh, batch: steps.append(ids(mesh)) or (lambda s, b: (s, {})),
    })()
    manager = _manager({0, 1, 3}, slices=4)
    compiler = StepCompiler(
        program, manager, ElasticConfig(global_batch=8, minimum_slice_count=1, precompile_smaller_meshes=True),
        also=lambda mesh: covered.append(ids(mesh)),
    )
    compiler.start_precompiling()  # slice 2 is down: the layouts of {0, 1, 3}
    compiler._precompiler.join(30)
    assert len(steps) == 3
    manager.active_slice_indices = {0, 1, 2, 3}  # slice 2 is back
    by_lost = dict(compiler._smaller())
    compiler.compile(*by_lost[3])  # the loop ran on the slices less slice 3 (say, before a scale-up)
    del steps[:], covered[:]
    compiler.start_precompiling()
    compiler._precompiler.join(30)
    assert covered == [ids(by_lost[i][0]) for i in (3, 2, 0, 1)]
    assert sorted(steps) == sorted(ids(by_lost[i][0]) for i in (2, 0, 1))  # slice 3's step was compiled


def test_a_resume_from_a_snapshot_compiles_its_meshs_other_programs_beside_the_step_unless_covered():
    """``with_others``: ``also`` runs once, in another thread, while the step's compile is
    still held; not at all without it, nor for a layout the precompiler covered."""
    program = CountingHeld()
    calls: list[tuple[bool, int]] = []  # (in the caller's thread, steps compiled when it ran)
    caller = threading.current_thread()

    def also(mesh):
        calls.append((threading.current_thread() is caller, program.finished))
        program.release.set()  # the step's compile goes on once the others began

    manager = _manager({0, 1, 2})
    compiler = StepCompiler(program, manager, ElasticConfig(
        global_batch=8, minimum_slice_count=1, precompile_smaller_meshes=True,
    ), also=also)
    [first, second, third] = compiler.smaller_layouts()
    compiler.compile(*first, with_others=True)
    assert calls == [(False, 0)]  # beside the step, before it was compiled
    compiler.compile(*second)
    assert len(calls) == 1  # no snapshot to load: nothing beside the step
    compiler._covered.add(_key_of(third))  # as the precompiler does once it covered a layout
    compiler.compile(*third, with_others=True)
    compiler.stop_precompiling()
    assert len(calls) == 1 and program.compiles == 3


class CountingHeld:
    """A program whose compiles wait for ``release`` (bounded) and count."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.compiles = 0
        self.finished = 0

    def compile(self, mesh, global_batch):
        self.compiles += 1
        self.release.wait(60)
        self.finished += 1
        return lambda state, batch: (state, {})


def _key_of(layout) -> tuple:
    return compiler_module._key(*layout)


def test_a_layout_the_active_slices_left_behind_compiles_none_of_its_other_programs():
    """Slice 1 comes back while the precompiler compiles the step of a layout of {0, 2} (a
    loss from {0, 1, 2} no longer leads there): that compile finishes, its other programs are
    left out and it is not counted covered; the layouts of {0, 1, 2} are covered next."""
    program = CountingHeld()
    covered: list[tuple] = []
    ids = lambda mesh: tuple(d.id for d in mesh.devices.flat)  # noqa: E731
    manager = _manager({0, 2})
    compiler = StepCompiler(program, manager, ElasticConfig(
        global_batch=8, minimum_slice_count=1, precompile_smaller_meshes=True,
    ), also=lambda mesh: covered.append(ids(mesh)))
    compiler.start_precompiling()  # two layouts of one slice each
    _wait_for(lambda: program.compiles == 1)
    [(_, stale), _] = compiler._smaller()
    manager.active_slice_indices = {0, 1, 2}  # slice 1 is back (a scale-up) while the step compiles
    compiler.start_precompiling()
    program.release.set()
    compiler._precompiler.join(30)
    now = [ids(mesh) for mesh, _ in compiler.smaller_layouts()]
    assert ids(stale[0]) not in covered and _key_of(stale) not in compiler._covered
    assert sorted(covered) == sorted(now)  # every layout of the slices active now, each once
    assert program.compiles == 1 + 3
