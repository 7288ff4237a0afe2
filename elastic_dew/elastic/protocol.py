"""The one stop/resume protocol that preemption, slice loss and scale-up all go through.

Every stop is a :class:`Stop` ``(reason, step)`` and every resume a :class:`Resume`
``(source, step)``, where a resume's ``step`` is the first step that runs next:

============  =========================================  ==============================
stop reason   cause                                      what follows
============  =========================================  ==============================
``preempted`` the runtime's ``PreemptionNotice`` reached  persistent checkpoint of the
                                                         agreed step, then ``Preempted``
``slice_lost`` a ``JaxRuntimeError`` pathwaysutils calls  the next ``elastic_retry``
              slice-down                                 attempt: wait, mesh, restore
``scale_up``  ``available_inactive_slices`` non-empty    slices added in place, state
              at a step boundary                         ``device_put`` onto the new mesh
``done``      the final step completed                   return
============  =========================================  ==============================

Resume sources: ``live`` (scale-up, nothing restored), ``snapshot`` (tier 1, pinned host
memory), ``checkpoint`` (tier 2, persistent storage), ``fresh`` (nothing saved yet).

:class:`ElasticRun` is the whole protocol in one place. pathwaysutils decides slice health
and retries; Orbax moves and stores state; Grain positions the data; the runtime's notice
agrees the stop step. This module is the policy and the seams between them. Each stop and
resume is emitted as a structured event (the run record's contract, see ``docs/trainer.md``)
with durations in seconds under ``detection``, ``wait_for_slices``, ``mesh_and_compile`` and
``restore``.

The model side is a :class:`Program`: it knows the state's shapes and shardings and how
to compile one training step for a mesh and a global batch. The protocol never holds an
attempt's device arrays outside that attempt's frame, so once a failed attempt unwinds its
arrays are freed before the next one starts (the guide's warning about references kept in
globals and callbacks).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import jax
from pathwaysutils.elastic.manager import ElasticRuntimeError

from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.data import ElasticData
from elastic_dew.elastic.retry import elastic_retry, make_manager
from elastic_dew.elastic.slices import (
    batch_sharding,
    build_mesh,
    check_batch,
    global_batch_for,
    mesh_of,
)
from elastic_dew.elastic.state import Checkpoints, Snapshots, newest
from elastic_dew.runtime import Preempted

__all__ = [
    "STOP_REASONS",
    "RESUME_SOURCES",
    "DURATION_KEYS",
    "Stop",
    "Resume",
    "Program",
    "StepFn",
    "ElasticRun",
    "check_batch_for_every_slice_count",
]

logger = logging.getLogger(__name__)

STOP_REASONS = ("preempted", "slice_lost", "scale_up", "done")
RESUME_SOURCES = ("live", "snapshot", "checkpoint", "fresh")
DURATION_KEYS = ("detection", "wait_for_slices", "mesh_and_compile", "restore")

#: ``step_fn(state, batch) -> (state, metrics)``; ``metrics["loss"]`` is a scalar array.
StepFn = Callable[[Any, Any], tuple[Any, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class Stop:
    """Why an attempt stopped, after which completed step."""

    reason: str
    step: int

    def event(self) -> dict[str, Any]:
        return {"event": "stop", "reason": self.reason, "step": self.step, "wall": time.time()}


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where an attempt's state came from, and the first step it runs."""

    source: str
    step: int
    durations: dict[str, float]

    def event(self) -> dict[str, Any]:
        return {
            "event": "resume",
            "source": self.source,
            "step": self.step,
            "wall": time.time(),
            "durations": {k: round(float(self.durations.get(k, 0.0)), 6) for k in DURATION_KEYS},
        }


class Program(Protocol):
    """The model side of a run, as the protocol needs it.

    ``abstract_state(mesh)`` returns the state as ``jax.ShapeDtypeStruct`` leaves carrying
    their target shardings on ``mesh`` (replicated along the replica axis, as the in-memory
    snapshots require). ``init_state(mesh)`` builds a fresh state there. ``compile(mesh,
    global_batch)`` returns a compiled step; the protocol caches it per (devices, batch), so a
    pause-resume attempt on the same slices reuses it.
    """

    def abstract_state(self, mesh: jax.sharding.Mesh) -> Any: ...

    def init_state(self, mesh: jax.sharding.Mesh) -> Any: ...

    def compile(self, mesh: jax.sharding.Mesh, global_batch: int) -> StepFn: ...


def check_batch_for_every_slice_count(config: ElasticConfig, total_slices: int, devices_per_slice: int) -> None:
    """Refuse, before anything runs, a global batch some reachable slice count cannot divide.

    A run in replica-resize mode may run on any count from ``minimum_slice_count`` to the
    total; pause-resume only ever runs on all of them. Checking every count up front turns
    a failure hours into a run (the first lost slice) into an error at start.
    """
    config.check_slices(total_slices)
    model = config.model_axis or 1
    if devices_per_slice % model:
        raise ValueError(
            f"model_axis={model} does not divide the {devices_per_slice} devices of a slice; "
            f"choose a model_axis that divides {devices_per_slice}"
        )
    lowest = total_slices if config.minimum_slice_count is None else config.minimum_slice_count
    for active in range(lowest, total_slices + 1):
        batch = global_batch_for(config.global_batch, config.batch_policy, active, total_slices)
        shards = active * (devices_per_slice // model)
        if batch % shards:
            raise ValueError(
                f"global_batch={config.global_batch} (policy {config.batch_policy!r}) gives a batch "
                f"of {batch} on {active} active slices, which their {shards} data-parallel devices "
                f"cannot divide; choose a global batch divisible by {shards} for every slice count "
                f"from {lowest} to {total_slices}, or raise minimum_slice_count"
            )


class ElasticRun:
    """Runs a :class:`Program` to ``final_step`` through slice loss, scale-up and preemption.

    Create one per process, after ``prepare_process()``: it creates the pathwaysutils
    ``Manager`` and the state tiers once, outside the retry, as the guide requires.
    ``emit`` receives every event (a JSON-able dict) in order; a trainer writes them to its
    run record.
    """

    def __init__(
        self,
        program: Program,
        data: ElasticData,
        config: ElasticConfig,
        *,
        emit: Callable[[dict[str, Any]], None] = lambda event: None,
        notice: Any = None,
        manager: Any = None,
        snapshots: Snapshots | None = None,
        checkpoints: Checkpoints | None = None,
        run_name: str | None = None,
    ) -> None:
        self.program = program
        self.data = data
        self.config = config
        self.emit = emit
        self.notice = notice
        self.manager = manager if manager is not None else make_manager()
        sizes = {len(d) for d in self.manager.slice_to_devices.values()}
        if len(sizes) != 1:
            raise ValueError(f"slices have unequal device counts {sorted(sizes)}; elastic meshes need equal slices")
        self.devices_per_slice = sizes.pop()
        check_batch_for_every_slice_count(config, self.manager.total_slice_count, self.devices_per_slice)
        if snapshots is None and config.snapshot_every:
            snapshots = Snapshots(replica_axis_index=0)
        self.snapshots = snapshots
        if checkpoints is None and config.checkpoint_dir is not None:
            checkpoints = Checkpoints(
                config.checkpoint_dir,
                kind=config.checkpoint_kind,
                max_to_keep=config.max_to_keep,
                num_slices=self.manager.total_slice_count,
                run_name=run_name,
            )
        self.checkpoints = checkpoints
        # Plain numbers only: nothing here may reference an attempt's device arrays.
        self.last_step = 0
        self._step_started = 0.0
        self._lost_at: float | None = None
        self._detection = 0.0
        self._attempt_started = 0.0
        self._compiled: dict[tuple, StepFn] = {}
        self._compile_guard = threading.Lock()
        self._compile_locks: dict[tuple, threading.Lock] = {}
        self._precompiler: threading.Thread | None = None
        self._precompile_stop = threading.Event()

    # -- pathwaysutils callbacks -------------------------------------------------------
    def _on_slice_lost(self) -> None:
        now = time.monotonic()
        self._lost_at = now
        self._detection = now - self._step_started if self._step_started else 0.0
        logger.warning("slice lost after step %d; waiting for slices", self.last_step)
        self.emit(Stop("slice_lost", self.last_step).event())

    def _on_attempt_start(self) -> None:
        self._attempt_started = time.monotonic()

    # -- the protocol --------------------------------------------------------------------
    def run(self, final_step: int) -> tuple[Any, int]:
        """Train until ``final_step`` is complete; return ``(state, final_step)``.

        Raises ``Preempted(step)`` after the checkpoint of the agreed step is committed, and
        pathwaysutils' ``ElasticRuntimeError`` when the retry policy gives up.
        """
        if final_step < 1:
            raise ValueError(f"final_step={final_step} must be >= 1")
        attempt = elastic_retry(
            self.manager,
            self.config,
            pre_callback=self._on_attempt_start,
            on_elastic_event_callback=self._on_slice_lost,
        )(self._attempt)
        self._precompile_stop.clear()
        try:
            return attempt(final_step)
        except TimeoutError as error:
            raise self._timed_out(error) from error
        except ElasticRuntimeError as error:
            raise ElasticRuntimeError(
                f"gave up after step {self.last_step}: slice losses reached "
                f"max_attempts={self.config.max_attempts} ({error}); {self._kept()}, or raise "
                "ElasticConfig.max_attempts"
            ) from error
        finally:
            self._stop_precompiling()
            if self.snapshots is not None:
                self.snapshots.close()

    def _timed_out(self, error: TimeoutError) -> TimeoutError:
        """pathwaysutils' timeout, with the run's position and what to do next."""
        wanted = self.config.minimum_slice_count or self.manager.total_slice_count
        return TimeoutError(
            f"waited timeout={self.config.timeout} s for {wanted} healthy "
            f"slice{'s' if wanted != 1 else ''} after step {self.last_step}, and they did not "
            f"come ({error}); {self._kept()}, or raise ElasticConfig.timeout"
        )

    def _kept(self) -> str:
        """What a run that gave up leaves to resume from."""
        saved = self.checkpoints.latest_step() if self.checkpoints is not None else None
        if saved is None:
            return "no checkpoint was committed, so a re-run starts from step 1"
        return (
            f"the newest committed checkpoint {saved} (in {self.checkpoints.directory}) is intact: "
            "run the same command again to resume from it once slices are healthy"
        )

    def _compile(self, mesh: jax.sharding.Mesh, global_batch: int) -> StepFn:
        """The compiled step for ``mesh`` and ``global_batch``, compiled once per process.

        The background precompiler may be compiling the same step: then this waits for it
        instead of compiling it a second time.
        """
        key = (tuple(d.id for d in mesh.devices.flat), mesh.devices.shape, global_batch)
        with self._compile_guard:
            if key in self._compiled:
                return self._compiled[key]
            lock = self._compile_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._compiled:
                self._compiled[key] = self.program.compile(mesh, global_batch)
        return self._compiled[key]

    def _smaller_layouts(self) -> list[tuple[jax.sharding.Mesh, int]]:
        """The meshes (and batches) of the active slices less any one of them."""
        active = sorted(self.manager.active_slice_indices)
        lowest = self.config.minimum_slice_count
        if lowest is None or len(active) - 1 < lowest:
            return []  # pause-resume never runs on fewer slices
        model = self.config.model_axis or 1
        total = self.manager.total_slice_count
        batch = global_batch_for(self.config.global_batch, self.config.batch_policy, len(active) - 1, total)
        layouts = []
        for lost in active:
            devices = [d for i in active if i != lost for d in self.manager.slice_to_devices[i]]
            layouts.append((mesh_of(devices, len(active) - 1, model), batch))
        return layouts

    def _start_precompiling(self) -> None:
        """Compile the steps a lost slice would need, in a background thread.

        Recovery then finds its step compiled (``config.precompile_smaller_meshes``).
        """
        if not self.config.precompile_smaller_meshes:
            return
        if self._precompiler is not None and self._precompiler.is_alive():
            return
        layouts = self._smaller_layouts()
        if not layouts:
            return

        def work() -> None:
            for mesh, batch in layouts:
                if self._precompile_stop.is_set():
                    return
                try:
                    self._compile(mesh, batch)
                except Exception:  # a compile that fails here fails again, visibly, when needed
                    logger.warning("precompiling the step for %s failed", mesh.devices.shape, exc_info=True)

        self._precompiler = threading.Thread(target=work, name="elastic-dew-precompile", daemon=True)
        self._precompiler.start()

    def _stop_precompiling(self) -> None:
        """Let the compile in progress finish and start no other."""
        self._precompile_stop.set()
        if self._precompiler is not None:
            self._precompiler.join()
            self._precompiler = None

    def _layout(self) -> tuple[jax.sharding.Mesh, int]:
        mesh = build_mesh(self.manager, self.config.model_axis)
        batch = global_batch_for(
            self.config.global_batch,
            self.config.batch_policy,
            self.manager.active_slice_count,
            self.manager.total_slice_count,
        )
        check_batch(batch, mesh)
        return mesh, batch

    def _slices_changed(self, mesh: jax.sharding.Mesh) -> None:
        """Tell tier 2 about the mesh; the multi-tier kind re-initialises on a new slice count."""
        if self.checkpoints is not None:
            self.checkpoints.on_active_slices_changed(list(mesh.devices.flat), mesh)

    def _restore(self, abstract: Any, mesh: jax.sharding.Mesh) -> tuple[str, int, Any, dict]:
        """The newest complete state across tiers, placed on ``mesh``."""
        source, saved = newest(self.snapshots, self.checkpoints)
        if source == "snapshot":
            hooks.phase("snapshot_load", saved + 1)
            try:
                state, meta, saved = self.snapshots.load(abstract)
                return "snapshot", saved, state, meta
            except jax.errors.JaxRuntimeError:
                raise  # a slice lost during the load: the next attempt retries it
            except RuntimeError as error:  # every replica was on a lost slice
                logger.warning("no snapshot replica survived (%s); trying the checkpoint", error)
                saved = self.checkpoints.latest_step() if self.checkpoints is not None else None
                source = "checkpoint" if saved is not None else "fresh"
        if source == "checkpoint":
            hooks.phase("checkpoint_restore", saved + 1)
            state, meta = self.checkpoints.restore(saved, abstract)
            return "checkpoint", saved, state, meta
        return "fresh", 0, self.program.init_state(mesh), {}

    def _attempt(self, final_step: int) -> tuple[Any, int]:
        started = self._attempt_started or time.monotonic()
        wait = started - self._lost_at if self._lost_at is not None else 0.0
        detection, self._lost_at, self._detection = self._detection, None, 0.0

        t0 = time.monotonic()
        mesh, batch_size = self._layout()
        self._slices_changed(mesh)
        _, saved_guess = newest(self.snapshots, self.checkpoints)
        hooks.phase("compile", (saved_guess or 0) + 1)
        abstract = self.program.abstract_state(mesh)
        step_fn = self._compile(mesh, batch_size)
        t1 = time.monotonic()
        source, step, state, meta = self._restore(abstract, mesh)
        self.data.start(batch_size, meta.get("data"))
        t2 = time.monotonic()
        self.last_step = step
        resume = Resume(
            source,
            step + 1,
            {"detection": detection, "wait_for_slices": wait, "mesh_and_compile": t1 - t0, "restore": t2 - t1},
        )
        logger.info(
            "resume from %s at step %d on %d slices (global batch %d)",
            source, step + 1, self.manager.active_slice_count, batch_size,
        )
        self.emit(resume.event())
        self._start_precompiling()
        in_batch = batch_sharding(mesh)

        while step < final_step:
            current = step + 1
            self._step_started = time.monotonic()
            batch, examples = self.data.next()
            data_seconds = time.monotonic() - self._step_started
            state, metrics = step_fn(state, jax.device_put(batch, in_batch))
            hooks.phase("step", current)
            loss = float(metrics["loss"])  # reading a result is where a lost slice surfaces
            step = self.last_step = current
            self.emit({
                "event": "step",
                "step": step,
                "slices": self.manager.active_slice_count,
                "loss": loss,
                "examples": [int(examples[0]), int(examples[1])],
                "wall": time.time(),
                "seconds": time.monotonic() - self._step_started,
                "data_seconds": data_seconds,
            })
            meta = {"step": step, "data": self.data.get_state()}

            if self.notice is not None and self.notice.reached(step):
                self._stop_for_preemption(step, state, meta)

            if self.config.snapshot_every and step % self.config.snapshot_every == 0:
                self._save("snapshot", step, lambda: self.snapshots.save(step, state, meta, mesh))
            if (
                self.checkpoints is not None
                and self.config.checkpoint_every
                and step % self.config.checkpoint_every == 0
            ):
                self._save("checkpoint", step, lambda: self.checkpoints.save(step, state, meta) or True)

            if self.manager.available_inactive_slices and step < final_step:
                state, mesh, step_fn, in_batch = self._scale_up(step, state)

        if self.checkpoints is not None:
            self.checkpoints.wait()
            if self.checkpoints.latest_step() != step:
                self._save(
                    "checkpoint", step,
                    lambda: self.checkpoints.save(step, state, {"step": step, "data": self.data.get_state()}, force=True) or True,
                )
            self.checkpoints.wait()
        # A slice lost after the last read (while restoring a finished run's state, say)
        # must surface here, inside the retry, not in the caller's first read.
        state = jax.block_until_ready(state)
        self.emit(Stop("done", step).event())
        return state, step

    def _save(self, tier: str, step: int, save: Callable[[], bool]) -> None:
        hooks.phase(tier, step)
        t = time.monotonic()
        taken = bool(save())
        self.emit({
            "event": "save", "tier": tier, "step": step, "taken": taken,
            "seconds": time.monotonic() - t, "wall": time.time(),
        })

    def _stop_for_preemption(self, step: int, state: Any, meta: dict) -> None:
        """Write the agreed step's checkpoint, commit it, and raise ``Preempted``."""
        logger.warning("preemption notice reached at step %d; writing its checkpoint", step)
        hooks.phase("stop", step)
        if self.checkpoints is None:
            logger.error("no checkpoint directory is configured: step %d is not saved", step)
        else:
            t = time.monotonic()
            self.checkpoints.wait()
            if self.checkpoints.latest_step() != step:
                self.checkpoints.save(step, state, meta, force=True)
            self.checkpoints.wait()
            self.emit({
                "event": "save", "tier": "checkpoint", "step": step, "taken": True,
                "seconds": time.monotonic() - t, "wall": time.time(),
            })
        self.emit(Stop("preempted", step).event())
        raise Preempted(step)

    def _scale_up(self, step: int, state: Any) -> tuple[Any, jax.sharding.Mesh, StepFn, Any]:
        """Add the returned slices in place and put the live state onto the larger mesh.

        This is the guide's in-place scale-up: no restore and no retry, so a slice that
        flaps never consumes the retry policy.
        """
        self.emit(Stop("scale_up", step).event())
        t0 = time.monotonic()
        hooks.phase("scale_up", step)
        joining = self.manager.available_inactive_slices
        self.manager.active_slice_indices = self.manager.active_slice_indices | joining
        logger.info("scaling up with slices %s after step %d", sorted(joining), step)
        mesh, batch_size = self._layout()
        abstract = self.program.abstract_state(mesh)
        step_fn = self._compile(mesh, batch_size)
        self._slices_changed(mesh)
        t1 = time.monotonic()
        shardings = jax.tree.map(lambda a: a.sharding, abstract)
        state = jax.block_until_ready(jax.device_put(state, shardings))
        self.data.start(batch_size, self.data.get_state())
        t2 = time.monotonic()
        self.emit(Resume(
            "live", step + 1,
            {"detection": 0.0, "wait_for_slices": 0.0, "mesh_and_compile": t1 - t0, "restore": t2 - t1},
        ).event())
        return state, mesh, step_fn, batch_sharding(mesh)
