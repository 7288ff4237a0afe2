"""The compiled training steps of a run: one compile per (devices, batch), and the precompiler.

Compiling a step for a new mesh is most of a recovery's ``mesh_and_compile`` time. The
:class:`StepCompiler` keeps every step it compiled for the life of the process, so a
pause-resume attempt on the same slices reuses it; and, with
``ElasticConfig.precompile_smaller_meshes``, it compiles in a background thread, mesh by mesh,
what a lost slice would need (the active slices less any one): each mesh's step and, with
it, the other programs a resume onto that mesh runs (``also``: the snapshot's unpack and
pack), so recovery onto a covered mesh compiles nothing. Each
:meth:`StepCompiler.start_precompiling` queues the meshes of the slices active then, the
likeliest next first, also while the thread is still at work (it takes them up next); the meshes of an earlier set of
active slices not yet begun are dropped, since no single loss leads to them any more (and
one begun compiles no more than the program in progress). The
background thread and the training loop share one compile of a layout: whoever comes second
waits for the first instead of compiling it again. The background thread yields to a
recovery: between :meth:`StepCompiler.pause_precompiling` (a resume begins) and the next
:meth:`StepCompiler.start_precompiling` (the resume is done) it starts no compile, so the
layout, restore and programs the resume needs do not share the host with ahead-of-need
compiles (the one in progress finishes).

A loss of any one slice leaves a mesh of the same shape: the same program on other devices.
Where the step a program compiled is a ``jax.stages.Compiled`` and the platform's
executables do not depend on their devices (CPU; GPU as JAX's compilation cache assumes,
unverified here; not TPU, unverified), the step compiled for one such layout is loaded onto
the others' devices instead of compiling them
(:func:`~elastic_dew._compat.jax_executables.retarget`, a fraction of a compile), and the
precompiler does so for every queued layout right after the first one's step, before any
layout's other programs. The snapshot programs share compiles the same way
(:mod:`elastic_dew.elastic.state.programs`).

*Precompile* is the layer's one word for this: compiling, ahead of its first use, what that
use would otherwise compile then (the steps here; the tiers' saves and loads,
:meth:`~elastic_dew.elastic.state.tiers.Tiers.precompile_saves` and
:meth:`~elastic_dew.elastic.state.tiers.Tiers.precompile_resume`).

A stop after which the process exits (a preemption) does not wait for the compile in
progress (:meth:`StepCompiler.stop_precompiling` with ``exiting``): it compiles for a later
loss, which this process will not see. JAX writes a persistent compilation cache entry in
place (the file is opened, then written), so an exit during that write would leave a cut
entry that every later process fails to read and never replaces. The precompiler's writes
therefore go through a gate (:class:`_CacheWrites`, on ``jax.monitoring``'s
``/jax/compilation_cache/cache_misses`` event, which JAX records in the compiling thread
just before it writes): the stop lets a write in progress finish and holds every later one
until a compiler of this process starts again (at most the grace window), so the exit
finds no entry half-written.

Compiled steps are executables, not device arrays: keeping them does not keep any attempt's
state alive.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

import jax

from elastic_dew._compat.jax_executables import compiled_here, retarget
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.loop.program import Program, StepFn
from elastic_dew.elastic.slices.manager import SliceManager
from elastic_dew.elastic.slices.mesh import MeshSpec, global_batch_for, spec_mesh
from elastic_dew.elastic.state import storage

__all__ = ["StepFn", "StepCompiler"]

logger = logging.getLogger(__name__)

#: JAX records this event in the compiling thread right before it writes a persistent cache entry.
CACHE_WRITE_EVENT = "/jax/compilation_cache/cache_misses"
#: JAX records this duration in the compiling thread once a compile (and its cache write) returned.
COMPILED_EVENT = "/jax/core/compile/backend_compile_duration"


class _CacheWrites:
    """The gate on the precompiler threads' persistent cache writes (one per process).

    A thread marked by :meth:`mark` that reaches JAX's cache write counts as writing until
    its compile returns; while the gate is closed (:meth:`close`) it waits before writing
    until :meth:`open`, at most ``hold`` seconds. Other threads pass untouched.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._open = True
        self._writing = 0
        self._local = threading.local()
        self._listening = False
        self._hold = 0.0
        self.held = 0  # writes that waited at a closed gate (for tests and logs)

    def mark(self) -> None:
        """The calling thread is a precompiler's: its cache writes go through the gate."""
        with self._changed:
            if not self._listening:
                self._listening = True
                jax.monitoring.register_event_listener(self._on_event)
                jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        self._local.marked = True

    def _on_event(self, event: str, **kwargs: str | int) -> None:
        if event != CACHE_WRITE_EVENT or not getattr(self._local, "marked", False):
            return
        with self._changed:
            if not self._open:
                self.held += 1
                logger.info("holding a compilation cache write: the process is stopping")
                self._changed.wait_for(lambda: self._open, timeout=self._hold)
            self._writing += 1
            self._local.writing = True

    def _on_duration(self, event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == COMPILED_EVENT:
            self.done()

    def done(self) -> None:
        """The calling thread's compile returned: its write, if any, is over."""
        if getattr(self._local, "writing", False):
            self._local.writing = False
            with self._changed:
                self._writing -= 1
                self._changed.notify_all()

    def close(self, timeout: float, hold: float) -> bool:
        """Hold every later write (each at most ``hold`` s: a process still alive then was
        not ended by the stop); wait (at most ``timeout`` s) for those in progress. ``False``
        when one is still being written."""
        with self._changed:
            self._open, self._hold = False, hold
            return self._changed.wait_for(lambda: self._writing == 0, timeout=timeout)

    def open(self) -> None:
        """Let held and later writes go ahead."""
        with self._changed:
            self._open = True
            self._changed.notify_all()


_WRITES = _CacheWrites()


class StepCompiler:
    """Compiles ``program``'s step once per layout, and the smaller layouts ahead of need.

    ``program.compile(mesh, global_batch)`` does the compiling; ``manager`` (pathwaysutils'
    ``Manager``) tells which slices are active, for the layouts to precompile. ``also(mesh)``,
    when given, is called in the precompiler's thread for each layout once every layout's
    step is compiled, to compile (not run) whatever else a resume onto ``mesh`` would
    compile; it must hold no lock the training loop takes.

    Args:
        program: the :class:`~elastic_dew.elastic.loop.program.Program`.
        manager: the process's ``Manager``.
        config: the :class:`~elastic_dew.elastic.config.ElasticConfig`.
        also: ``also(mesh)`` compiles the rest of a resume onto ``mesh``, or ``None``.
        mesh_spec: the run's mesh (its axes and a slice's shape), ``None`` for the default.
    """

    def __init__(
        self, program: Program, manager: SliceManager, config: ElasticConfig,
        also: Callable[[jax.sharding.Mesh], None] | None = None, *, mesh_spec: MeshSpec | None = None,
    ) -> None:
        self.program = program
        self.manager = manager
        self.config = config
        self.also = also
        self.mesh_spec = MeshSpec() if mesh_spec is None else mesh_spec
        self._compiled: dict[tuple, StepFn] = {}
        self._meshes: dict[tuple, jax.sharding.Mesh] = {}  # the mesh of each layout compiled (not loaded) here
        self._guard = threading.Lock()
        self._locks: dict[tuple, threading.Lock] = {}
        #: The newest precompiler thread (it ends when its queue is empty).
        self._precompiler: threading.Thread | None = None
        self._queue: list[tuple[jax.sharding.Mesh, int]] = []  # the layouts still to cover, in order
        self._working = False  # a precompiler thread takes from the queue (set and cleared under _guard)
        self._covered: set[tuple] = set()  # the layouts whose step and other programs were compiled
        self._wanted: set[tuple] = set()  # the layouts of the latest start: a loss from the active slices
        self._helpers: list[threading.Thread] = []  # compile(with_others=True)'s threads
        self._starts = 0  # start_precompiling calls so far
        self._missing: dict[int, int] = {}  # each slice once inactive: the last start it was missing at
        self._stop = threading.Event()
        self._go = threading.Event()  # clear while a resume is in progress (pause_precompiling)
        self._go.set()
        _WRITES.open()  # an earlier run's held writes go ahead: this process did not exit

    def compile(self, mesh: jax.sharding.Mesh, global_batch: int, *, with_others: bool = False) -> StepFn:
        """The compiled step for ``mesh`` and ``global_batch``, compiled once per process.

        The background precompiler may be compiling the same step: then this waits for it
        instead of compiling it a second time. ``with_others`` (a resume that will load a
        snapshot onto ``mesh``) compiles the layout's other programs (``also``) in a helper
        thread while this compiles the step, unless the precompiler covered the layout; a
        load or save that needs one of them first waits for its compile.

        Args:
            mesh: the attempt's mesh.
            global_batch: the attempt's global batch.
            with_others: compile ``also(mesh)`` beside the step.

        Returns:
            The compiled step.
        """
        key = _key(mesh, global_batch)
        if with_others and self.also is not None and key not in self._covered:
            helper = threading.Thread(target=self._others, args=(mesh,), name="elastic-dew-compile-others", daemon=True)
            self._helpers = [*(h for h in self._helpers if h.is_alive()), helper]
            helper.start()
        step = self._step(mesh, global_batch, compiling=True)
        assert step is not None  # compiling: a step or the compile's exception
        return step

    def _step(self, mesh: jax.sharding.Mesh, global_batch: int, *, compiling: bool) -> StepFn | None:
        """The layout's step, kept once made: a step compiled for a mesh of its shape loaded
        onto its devices (:meth:`_retargeted`), else compiled (``compiling``) or ``None``.
        Whoever comes second for a layout waits for the first."""
        key = _key(mesh, global_batch)
        with self._guard:
            if key in self._compiled:
                return self._compiled[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._compiled:
                step, fresh = self._retargeted(mesh, global_batch), False
                if step is None:
                    if not compiling:
                        return None
                    compiled, fresh = compiled_here(lambda: self.program.compile(mesh, global_batch))
                    step = compiled
                with self._guard:
                    self._compiled[key] = step
                    if fresh:  # compiled, not loaded from JAX's cache: the layouts of its shape may load it
                        self._meshes[key] = mesh
        return self._compiled[key]

    def _retargeted(self, mesh: jax.sharding.Mesh, global_batch: int) -> StepFn | None:
        """The step compiled for a mesh of the same shape and axes on other devices, loaded
        onto ``mesh``'s devices without compiling; ``None`` when there is none or it cannot be
        (:func:`~elastic_dew._compat.jax_executables.retarget`)."""
        key = _key(mesh, global_batch)
        with self._guard:
            siblings = [
                (sibling, self._compiled[k]) for k, sibling in self._meshes.items()
                if k[1:] == key[1:] and sibling.axis_names == mesh.axis_names
                and isinstance(self._compiled[k], jax.stages.Compiled)
            ]
        for sibling, step in siblings:
            started = time.monotonic()
            moved = retarget(step, dict(zip((d.id for d in sibling.devices.flat), mesh.devices.flat)))
            if moved is not None:
                logger.info(
                    "loaded the step compiled for devices %s onto devices %s in %.3f s",
                    [d.id for d in sibling.devices.flat], [d.id for d in mesh.devices.flat], time.monotonic() - started,
                )
                return moved
        return None

    def _retarget_queued(self) -> None:
        """Each queued layout's step that a compiled one loads as (:meth:`_retargeted`), now:
        it costs no compile, so every loss is covered before any layout's other programs."""
        with self._guard:
            queued = list(self._queue)
        for mesh, batch in queued:
            if self._stop.is_set():
                return
            self._step(mesh, batch, compiling=False)

    def _others(self, mesh: jax.sharding.Mesh) -> None:
        """The helper thread of :meth:`compile`'s ``with_others``."""
        assert self.also is not None
        _WRITES.mark()
        try:
            self.also(mesh)
        except Exception:  # noqa: BLE001 - what failed here fails again, visibly, where it runs
            logger.warning("compiling the other programs for %s failed", mesh.devices.shape, exc_info=True)
        finally:
            _WRITES.done()

    def smaller_layouts(self) -> list[tuple[jax.sharding.Mesh, int]]:
        """The meshes (and batches) of the active slices less any one of them.

        Returns:
            Each mesh and its global batch.
        """
        return [layout for _, layout in self._smaller()]

    def _smaller(self) -> list[tuple[int, tuple[jax.sharding.Mesh, int]]]:
        """Each slice whose loss :meth:`smaller_layouts` covers, with that layout."""
        active = sorted(self.manager.active_slice_indices)
        lowest = self.config.minimum_slice_count
        if lowest is None or len(active) - 1 < lowest:
            return []  # pause-resume never runs on fewer slices
        model = self.config.model_axis
        total = self.manager.total_slice_count
        batch = global_batch_for(self.config.global_batch, self.config.batch_policy, len(active) - 1, total)
        layouts = []
        for lost in active:
            devices = [d for i in active if i != lost for d in self.manager.slice_to_devices[i]]
            layouts.append((lost, (spec_mesh(self.mesh_spec, devices, len(active) - 1, model), batch)))
        return layouts

    def _likeliest_first(self) -> list[tuple[jax.sharding.Mesh, int]]:
        """The smaller layouts not covered yet, in the order that covers the likeliest next
        meshes soonest: those whose step is compiled already (only their other programs are
        left), then those that lose a slice lost before in this process, the most recently
        lost first (a slice that failed is likelier to fail again), then the rest in slice order."""
        self._starts += 1
        for index in set(self.manager.slice_to_devices) - set(self.manager.active_slice_indices):
            self._missing[index] = self._starts  # the last start at which it was missing
        smaller = self._smaller()
        self._wanted = {_key(*layout) for _, layout in smaller}
        ordered = sorted(
            (layout for layout in smaller if _key(*layout[1]) not in self._covered),
            key=lambda item: (_key(*item[1]) not in self._compiled, -self._missing.get(item[0], 0), item[0]),
        )
        return [layout for _, layout in ordered]

    def pause_precompiling(self) -> None:
        """A resume begins: the precompiler starts no compile until :meth:`start_precompiling`."""
        self._go.clear()

    def start_precompiling(self) -> None:
        """Compile the steps a lost slice would need, in a background thread.

        Ends a :meth:`pause_precompiling`, and starts again after a
        :meth:`stop_precompiling`. Does nothing unless ``config.precompile_smaller_meshes``.
        Queues every layout of the active slices less one that is not covered yet, the
        likeliest next first (those whose step is compiled already, then those losing a
        slice that was lost before, the most recent first), in place of the queued layouts
        of earlier active slices not begun yet; a precompiler thread
        still at work goes on with them (the compile in progress finishes first; the rest
        of its layout's programs are left out unless a loss from the slices active now
        leads there), else one starts.
        """
        self._stop.clear()
        _WRITES.open()
        if self.config.precompile_smaller_meshes:
            layouts = self._likeliest_first()
            with self._guard:
                self._queue = layouts
                if layouts and not self._working:
                    self._working = True
                    self._precompiler = threading.Thread(
                        target=self._precompile, name="elastic-dew-precompile", daemon=True
                    )
                    self._precompiler.start()
        self._go.set()

    def _next(self) -> tuple[jax.sharding.Mesh, int] | None:
        """The next layout to cover, or ``None`` (stopped, or nothing queued): the thread ends."""
        self._go.wait()
        with self._guard:
            if self._stop.is_set() or not self._queue:
                self._working = False
                return None
            return self._queue.pop(0)

    def _precompile(self) -> None:
        """The precompiler thread: each queued layout's step, then its other programs."""
        _WRITES.mark()
        while (layout := self._next()) is not None:
            mesh, batch = layout
            key = _key(mesh, batch)
            jobs: list[tuple[str, Callable[[], object]]] = [("step", functools.partial(self.compile, mesh, batch))]
            if self.also is not None:
                jobs.append(("other programs", functools.partial(self.also, mesh)))
            for number, (what, job) in enumerate(jobs):
                if number:  # between a layout's programs, too, a resume has the host to itself
                    self._go.wait()
                if self._stop.is_set():
                    with self._guard:
                        self._working = False
                    return
                if number and key not in self._wanted:
                    break  # the active slices changed meanwhile: no single loss leads here any more
                started = time.monotonic()
                try:
                    job()
                except Exception:  # a compile that fails here fails again, visibly, when needed
                    logger.warning("precompiling the %s for %s failed", what, mesh.devices.shape, exc_info=True)
                    continue
                finally:
                    _WRITES.done()
                logger.info(
                    "precompiled the %s for devices %s in %.2f s",
                    what, [d.id for d in mesh.devices.flat], time.monotonic() - started,
                )
                if not number:
                    self._retarget_queued()
            else:
                self._covered.add(key)

    def stop_precompiling(self, *, exiting: bool = False, timeout: float = 10.0) -> None:
        """Start no other compile, and let the compile in progress finish.

        With ``exiting`` (the process exits next, as after a preemption) the compile in
        progress is not waited for: a persistent cache write it already began is waited
        for (at most ``timeout`` seconds), and its later writes are held, so the exit leaves
        no cache entry half-written (see the module's docstring).

        Args:
            exiting: the process exits after this stop.
            timeout: with ``exiting``, the most seconds to wait for a cache write in progress.
        """
        self._stop.set()
        with self._guard:
            self._queue = []
        self._go.set()  # a held precompiler sees the stop
        if exiting:
            if not _WRITES.close(timeout, storage.grace_seconds(self.config.grace_period)):
                logger.warning("a compilation cache write was still in progress after %.1f s of the stop", timeout)
            return
        if self._precompiler is not None:
            self._precompiler.join()
            self._precompiler = None
        for helper in self._helpers:
            helper.join()
        self._helpers = []


def _key(mesh: jax.sharding.Mesh, global_batch: int) -> tuple:
    """A layout's key: its devices in order, the mesh's shape and the global batch."""
    return (tuple(d.id for d in mesh.devices.flat), mesh.devices.shape, global_batch)
