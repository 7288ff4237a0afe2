"""The one stop/resume protocol that preemption, slice loss and scale-up all go through.

Every stop is a :class:`~elastic_dew.elastic.events.Stop` ``(reason, step)`` and every resume
a :class:`~elastic_dew.elastic.events.Resume` ``(source, step)``, where a resume's ``step`` is
the first step that runs next:

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

:class:`ElasticRun` is the protocol's loop. pathwaysutils decides slice health and retries;
Orbax moves and stores state; Grain positions the data; the runtime's notice agrees the stop
step. The loop's collaborators each own one job: the
:class:`~elastic_dew.elastic.loop.compiler.StepCompiler` (compiled steps, precompiling smaller
meshes), the :class:`~elastic_dew.elastic.loop.recovery.RecoveryTimer` (a resume's durations under
``detection``, ``wait_for_slices``, ``mesh_and_compile`` and ``restore``), the
:class:`~elastic_dew.elastic.state.tiers.Tiers` (both tiers' save cadences) and the
:class:`~elastic_dew.elastic.loop.stopping.Stopping` (the preemption stops and the errors of a
run that gives up). Every stop, resume, step and save is emitted as a typed event (:mod:`elastic_dew.elastic.events`; the
run record's contract, see ``docs/trainer.md``).

The model side is a :class:`Program`: it knows the state's shapes and shardings and how
to compile one training step for a mesh and a global batch
(:mod:`~elastic_dew.elastic.loop.program`). An attempt's device arrays, mesh and compiled step
live in its :class:`~elastic_dew.elastic.loop.attempt.Attempt`, which only that attempt's frame
references; ``ElasticRun`` itself keeps plain numbers. Once a failed attempt unwinds its arrays are freed
before the next one starts (the guide's warning about references kept in globals and
callbacks).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import jax
from pathwaysutils.elastic.manager import ElasticRuntimeError

from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.deadline import StepDeadline
from elastic_dew.elastic.events import Event, Resume, Step, Stop
from elastic_dew.elastic.loop.attempt import Attempt, InFlight
from elastic_dew.elastic.loop.compiler import StepCompiler
from elastic_dew.elastic.loop.data import ElasticData, read_within
from elastic_dew.elastic.loop.evaluation import EVALUATION_OWED_KEY, Evaluation
from elastic_dew.elastic.loop.program import Finished, InterruptingNotice, Notice, Program, WaitingNotice
from elastic_dew.elastic.loop.recovery import Recovery, RecoveryTimer
from elastic_dew.elastic.loop.stopping import Stopping
from elastic_dew.elastic.slices.mesh import (
    MeshSpec,
    batch_sharding,
    build_mesh,
    check_batch,
    check_batch_for_every_slice_count,
    global_batch_for,
)
from elastic_dew.elastic.slices.manager import SliceManager
from elastic_dew.elastic.slices.retry import SliceLossRetryLimit, elastic_retry, make_manager
from elastic_dew.elastic.state.checkpoints import Checkpoints
from elastic_dew.elastic.state.snapshots import Snapshots
from elastic_dew.elastic.state.tiers import StepSaves, Tiers
from elastic_dew.runtime.preemption import NoticeInWait

__all__ = ["ElasticRun"]

logger = logging.getLogger(__name__)


class ElasticRun:
    """Runs a :class:`Program` to ``final_step`` through slice loss, scale-up and preemption.

    Create one per process, after ``prepare_process()``: it creates the pathwaysutils
    ``Manager`` and the state tiers once, outside the retry, as the guide requires.
    The run tells every event (a typed :class:`~elastic_dew.elastic.events.Event`) on the
    loop's channel (:func:`elastic_dew.elastic.hooks.emit`), and its :attr:`sink` (``emit``)
    hears the channel's events in order while :meth:`run` runs, the faults the simulator
    fires among them; a trainer gives it its :class:`~elastic_dew.observe.sinks.Sinks`. ``notice`` is a
    :class:`~elastic_dew.runtime.PreemptionNotice` (or an object with its ``reached(step)``
    and, optionally, ``interrupts()``, asked during an evaluation pass). ``run_dir``, for a
    run that has one, is where the persistent tier writes when ``config.checkpoint_dir`` is
    ``None`` (:meth:`~elastic_dew.elastic.config.ElasticConfig.checkpoint_dir_for`); an
    ElasticRun with neither has no persistent tier.

    Args:
        program: the model side (:class:`Program`).
        data: the elastic data (:class:`~elastic_dew.elastic.loop.data.ElasticData`).
        config: the :class:`~elastic_dew.elastic.config.ElasticConfig`.
        emit: the run's sink: called with every event in order while the run runs.
        notice: the preemption notice (a :class:`Notice`), or ``None`` for none.
        manager: your pathwaysutils ``Manager`` (made once per process, outside any retry),
            or ``None`` to create one.
        snapshots: the in-memory tier to use (:class:`~elastic_dew.elastic.Snapshots`), or
            ``None`` to build it from ``config``.
        checkpoints: the persistent tier to use (:class:`~elastic_dew.elastic.Checkpoints`),
            or ``None`` to build it from ``config``.
        run_name: the run's name, for multi-tier checkpointing's backups.
        evaluation: the evaluation passes (:class:`~elastic_dew.elastic.Evaluation`), or
            ``None`` for none.
        run_dir: the run directory, or ``None``.
        mesh_spec: the mesh's axes, a slice's shape and the batch's axes your program's
            shardings name (:class:`~elastic_dew.elastic.MeshSpec`), or ``None`` for the
            default axes (``replica``, ``data``, ``model``, sized by ``config.model_axis``).

    Raises:
        ValueError: slices of unequal device counts, a ``mesh_spec`` that cannot lay out a
            slice, or a global batch, microbatch, minimum slice count or evaluation batch
            some reachable slice count cannot run; refused before anything runs.
    """

    def __init__(
        self,
        program: Program,
        data: ElasticData,
        config: ElasticConfig,
        *,
        emit: Callable[[Event], None] = lambda event: None,
        notice: Notice | None = None,
        manager: SliceManager | None = None,
        snapshots: Snapshots | None = None,
        checkpoints: Checkpoints | None = None,
        run_name: str | None = None,
        evaluation: Evaluation | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        mesh_spec: MeshSpec | None = None,
    ) -> None:
        self.program = program
        self.evaluation = evaluation
        self.data = data
        #: Hears the channel's events while :meth:`run` runs (the run's record and displays).
        self.sink = emit
        #: Where the run's events go: out on the loop's channel, which :attr:`sink` hears.
        self.emit = hooks.emit
        self.notice = notice
        self.manager: SliceManager = manager if manager is not None else make_manager()
        sizes = {len(d) for d in self.manager.slice_to_devices.values()}
        if len(sizes) != 1:
            raise ValueError(f"slices have unequal device counts {sorted(sizes)}; elastic meshes need equal slices")
        self.devices_per_slice = sizes.pop()
        #: The mesh every attempt builds over the active slices (your axes, or the default ones).
        self.mesh_spec = MeshSpec() if mesh_spec is None else mesh_spec
        check_batch_for_every_slice_count(
            config, self.manager.total_slice_count, self.devices_per_slice, program.microbatch, mesh_spec
        )
        if evaluation is not None:
            evaluation.check(config, self.manager.total_slice_count, self.devices_per_slice, mesh_spec)
        self.tiers = Tiers.from_config(
            config,
            slices=self.manager.total_slice_count,
            snapshots=snapshots,
            checkpoints=checkpoints,
            run_name=run_name,
            run_dir=run_dir,
            emit=lambda event: self.emit(event),
        )
        self.compiler = StepCompiler(
            program, self.manager, config,
            also=lambda mesh: self.tiers.precompile_resume(mesh, program.abstract_state), mesh_spec=self.mesh_spec,
        )
        self.stopping = Stopping(program, self.manager, self.tiers, notice, config, lambda event: self.emit(event),
                                 mesh_spec=self.mesh_spec)
        self.timer = RecoveryTimer()
        self.deadline = StepDeadline(config.step_timeout,
                                     waits_for_every_slice=config.minimum_slice_count is None)
        self._config = config
        # Plain numbers only: an attempt's arrays live in its Attempt.
        self.last_step = 0
        #: The furthest step completed (or restored) in this process: the retry policy's progress.
        self.furthest_step = 0

    @property
    def config(self) -> ElasticConfig:
        return self._config

    @property
    def snapshots(self) -> Snapshots | None:
        """Tier 1 (``None`` when the run takes no in-memory snapshots)."""
        return self.tiers.snapshots

    @property
    def checkpoints(self) -> Checkpoints | None:
        """Tier 2 (``None`` when the run has no checkpoint directory)."""
        return self.tiers.checkpoints

    # -- pathwaysutils callbacks -------------------------------------------------------
    def _on_slice_lost(self) -> None:
        self.timer.slice_lost()
        logger.warning("slice lost after step %d; waiting for slices", self.last_step)
        self.emit(Stop(reason="slice_lost", step=self.last_step))
        self.tiers.on_slice_lost()
        # Until the next attempt starts, a preemption notice (one pending now, or one that
        # arrives) ends the wait at once (NoticeInWait, handled in run) instead of at a step
        # boundary a paused run never reaches.
        if isinstance(self.notice, WaitingNotice):
            self.notice.begin_wait()
        hooks.phase("wait", self.last_step)

    def _attempt_started(self) -> None:
        if isinstance(self.notice, WaitingNotice):
            self.notice.end_wait()
        self.timer.attempt_started()

    # -- the protocol --------------------------------------------------------------------
    def run(self, final_step: int) -> Finished:
        """Train until ``final_step`` is complete; return its :class:`Finished` state and step.

        Whether it returns or raises, every thread, iterator and Orbax manager the run
        started is stopped and joined (the pathwaysutils ``Manager`` stops its own monitor;
        after a preemption the precompiler's compile in progress is not waited for).

        Args:
            final_step: the step to train to (>= 1).

        Returns:
            ``Finished(state, step)``: the final state and ``final_step``.

        Raises:
            ValueError: ``final_step`` is below 1.
            elastic_dew.runtime.Preempted: a preemption notice was honoured, after the
                checkpoint of the agreed step was committed.
            TimeoutError: healthy slices did not come back within ``config.timeout``
                (the error says what the tiers kept).
            pathwaysutils.elastic.manager.ElasticRuntimeError: the retry policy gave up
                (the error says after which step and what the tiers kept).
        """
        if final_step < 1:
            raise ValueError(f"final_step={final_step} must be >= 1")
        policy = SliceLossRetryLimit(
            self.config.max_attempts,
            reset_steps=self.config.retry_reset_steps,
            progress=lambda: self.furthest_step,
        )
        attempt = elastic_retry(
            self.manager,
            self.config,
            pre_callback=self._attempt_started,
            on_elastic_event_callback=self._on_slice_lost,
            policy=policy,
        )(self._attempt)
        # The sink hears the run's events on the channel, and a fault the simulator fires as it fires.
        with hooks.listening(events=self.sink):
            try:
                return attempt(final_step)
            except NoticeInWait:
                raise self.stopping.in_recovery(self.last_step) from None
            except TimeoutError as error:
                raise self.stopping.timed_out(error, self.last_step) from error
            except ElasticRuntimeError as error:
                raise self.stopping.gave_up(error, self.last_step, policy) from error
            finally:
                self.compiler.stop_precompiling(exiting=self.stopping.preempted, timeout=self.stopping.stop_timeout())
                self.deadline.close()
                self.data.close()
                self.tiers.close()

    def _layout(self) -> tuple[jax.sharding.Mesh, int]:
        spec = self.mesh_spec
        mesh = build_mesh(self.manager, self.config.model_axis, axes=spec.axes, slice_shape=spec.slice_shape)
        batch = global_batch_for(
            self.config.global_batch,
            self.config.batch_policy,
            self.manager.active_slice_count,
            self.manager.total_slice_count,
        )
        check_batch(batch, mesh, self.mesh_spec.batch_axes)
        return mesh, batch

    def _attempt(self, final_step: int) -> Finished:
        """One ``elastic_retry`` attempt: resume, step to ``final_step``, finish.

        Steps run one ahead of their reads: step N+1 is dispatched before step N's result
        is read, so the devices never wait for the host between steps. Everything a step
        boundary decides (its step line, its saves, the preemption stop, a scale-up) waits
        for that step's read and uses that step's state and data position; a step that is
        in flight when the loop stops or scales up is dropped, never recorded, and its
        examples are read again from the position of the last completed step.
        """
        attempt = self._resume(self.timer.recover())
        if attempt.owed and not self._evaluate(attempt):
            owed = {"step": attempt.step, "data": attempt.data, EVALUATION_OWED_KEY: True}
            self.stopping.at_step(attempt.step, attempt.state, owed)
        current: InFlight | None = None
        last_saves: StepSaves | None = None  # the last step's saves (see _complete)
        while attempt.step < final_step:
            now = time.monotonic()
            self.timer.step_started(now)
            started, held = last_saves if last_saves is not None else (now, 0.0)
            taken = []  # the steps dispatched in this stretch, for its data time
            if current is None:  # the attempt's first step, or the first after a scale-up
                current = self._dispatch(attempt, attempt.state, attempt.step + 1)
                taken.append(current)
            ahead = None
            if current.step < final_step:
                ahead = self._dispatch(attempt, current.state, current.step + 1, behind=current)
                taken.append(ahead)
            self._complete(attempt, current, started, sum(t.data_seconds for t in taken), held)
            meta = {"step": attempt.step, "data": attempt.data}
            wait_step = ahead.wait(self.deadline) if ahead is not None else None  # off the saves' clocks
            if self.evaluation is not None and self.evaluation.due(attempt.step) and not self._evaluate(attempt):
                self.stopping.at_step(attempt.step, attempt.state, {**meta, EVALUATION_OWED_KEY: True})
            if self.notice is not None and self.notice.reached(attempt.step):
                self.stopping.at_step(attempt.step, attempt.state, meta)
            # The saves' own seconds are not the next step's time; the wait before them is.
            last_saves = self.tiers.on_step(attempt.step, attempt.state, meta, attempt.mesh, wait_step)
            current = ahead
            if self.manager.available_inactive_slices and attempt.step < final_step:
                current = ahead = None  # dispatched on the smaller mesh: redone on the larger one
                last_saves = None  # the step waited for is dropped: its time is the scale-up's
                self._scale_up(attempt)
            if current is not None:
                # The step in flight holds the buffers it reads; the loop lets go of them, so
                # the runtime frees them once that step has run instead of this thread
                # freeing them after its read (the next _complete sets the state again).
                attempt.state = None
        return self._finish(attempt)

    def _resume(self, recovery: Recovery) -> Attempt:
        """Build the mesh, get its compiled step, and restore the newest state onto it."""
        self.compiler.pause_precompiling()  # the resume has the host to itself until start_precompiling
        mesh, batch_size = self._layout()
        self.tiers.on_active_slices_changed(mesh)
        source_guess, saved_guess = self.tiers.newest_known()
        hooks.phase("compile", (saved_guess or 0) + 1)
        abstract = self.program.abstract_state(mesh)
        step_fn = self.compiler.compile(mesh, batch_size, with_others=source_guess == "snapshot")
        recovery.lap("mesh_and_compile")
        restored = self.tiers.restore(abstract)
        source, step, state, meta = restored if restored is not None else (
            "fresh", 0, self.program.init_state(mesh), {}
        )
        self.data.start(batch_size, meta.get("data"))
        recovery.lap("restore")
        # The restored step is the newest this process holds, even if a slice is lost in
        # the precompile below: that loss's stop names it.
        self.last_step = step
        self.furthest_step = max(self.furthest_step, step)
        # The saves' programs for this layout, compiled here: the first save compiles nothing.
        self.tiers.precompile_saves(state, mesh)
        # A slice lost since the restore surfaces here, inside the retry and before the resume
        # is recorded: a finished run's resume runs no step that would read the state.
        jax.block_until_ready(state)
        recovery.lap("mesh_and_compile")
        logger.info(
            "resume from %s at step %d on %d slices (global batch %d)",
            source, step + 1, self.manager.active_slice_count, batch_size,
        )
        self.emit(Resume(source=source, step=step + 1, durations=recovery.durations))
        self.compiler.start_precompiling()
        owed = bool(meta.get(EVALUATION_OWED_KEY)) and self.evaluation is not None
        return Attempt(mesh, batch_size, step_fn, state, step, self.data.get_state(), owed=owed,
                       batch_axes=self.mesh_spec.batch_axes)

    def _dispatch(self, attempt: Attempt, state: Any, step: int, behind: InFlight | None = None) -> InFlight:
        """Take step ``step``'s batch and dispatch it from ``state``; nothing is read.

        ``behind`` is the step in flight while the batch is read. The step's
        ``data_seconds`` is the time the loop waited for data: the read's time, or 0 when
        ``behind``'s result was still not ready as the read ended (the device was computing
        all along, so the read overlapped it and held nothing up).
        """
        started = time.monotonic()
        batch, examples = read_within(self.data, step, self.config.storage_timeout)
        data_seconds = time.monotonic() - started
        computing = getattr(behind.metrics.get("loss"), "is_ready", None) if behind is not None else None
        if computing is not None and not computing():
            data_seconds = 0.0
        hooks.phase("dispatch", step)
        new_state, metrics = attempt.step_fn(state, jax.device_put(batch, attempt.in_batch))
        return InFlight(step, new_state, metrics, (int(examples[0]), int(examples[1])),
                         self.data.get_state(), data_seconds)

    def _complete(
        self, attempt: Attempt, done: InFlight, started: float, data_seconds: float, held: float = 0.0
    ) -> None:
        """Read ``done``'s result, make it the attempt's last completed step, emit its line.

        ``started`` is when this stretch of the loop began: a step's ``seconds`` run from
        the end of the previous step's line (or, when that step saved, from the wait for
        this step before the saves, less ``held``, the saves' own seconds: see
        :class:`~elastic_dew.elastic.state.tiers.StepSaves`) to its own read, so steps and saves add
        up to the loop's time as an unlagged loop's do;
        ``data_seconds`` is the time the batches taken in that stretch waited for data.
        """
        hooks.phase("step", done.step)
        # Reading a result is where a lost slice surfaces; a hung one, past the step deadline.
        loss = self.deadline.read(
            lambda: float(done.metrics["loss"]), done.step, ready=getattr(done.metrics["loss"], "is_ready", None)
        )
        self.deadline.observe(time.monotonic() - started - held)
        # The loss function's own metrics come from the same program as the loss, so they
        # are ready once it is: one batched transfer, no wait.
        metrics = {k: v for k, v in done.metrics.items() if k != "loss"}
        if metrics:
            metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        attempt.state, attempt.step, attempt.data = done.state, done.step, done.data
        self.last_step = done.step
        self.furthest_step = max(self.furthest_step, done.step)
        self.emit(Step(
            step=done.step,
            slices=self.manager.active_slice_count,
            loss=loss,
            examples=done.examples,
            seconds=time.monotonic() - started - held,
            data_seconds=data_seconds,
            metrics=metrics,
        ))

    def _evaluate(self, attempt: Attempt) -> bool:
        """The evaluation pass of the attempt's last completed step, before its saves (see
        :mod:`~elastic_dew.elastic.loop.evaluation`): a fault during it unwinds the attempt with
        nothing emitted, and the pass runs again when the resumed run reaches the step.
        ``False`` when a preemption notice cut it short (nothing emitted: the caller stops
        with the pass owed)."""
        interrupts = self.notice.interrupts if isinstance(self.notice, InterruptingNotice) else None
        assert self.evaluation is not None  # only a run with evaluation passes evaluates
        done = self.evaluation.run(
            self.program, self.config, attempt.mesh, attempt.state, attempt.step,
            self.manager.active_slice_count, self.deadline.read,
            interrupted=interrupts if interrupts is not None else (lambda: False),
            batch_axes=self.mesh_spec.batch_axes,
        )
        if done is None:
            logger.warning("preemption notice during the evaluation pass of step %d: it runs again after the resume", attempt.step)
            return False
        self.emit(done)
        return True

    def _finish(self, attempt: Attempt) -> Finished:
        """Commit the final checkpoint and hand the finished state out of the retry."""
        step = attempt.step
        self.tiers.save_final(step, attempt.state, {"step": step, "data": attempt.data})
        # A slice lost after the last read (while restoring a finished run's state, say)
        # must surface here, inside the retry, not in the caller's first read.
        state = jax.block_until_ready(attempt.state)
        self.emit(Stop(reason="done", step=step))
        return Finished(state, step)

    def _scale_up(self, attempt: Attempt) -> None:
        """Add the returned slices in place and put the live state onto the larger mesh.

        This is the guide's in-place scale-up: no restore and no retry, so a slice that
        flaps never consumes the retry policy.
        """
        step = attempt.step
        self.emit(Stop(reason="scale_up", step=step))
        recovery = Recovery.live()
        hooks.phase("scale_up", step)
        joining = self.manager.available_inactive_slices
        self.manager.active_slice_indices = self.manager.active_slice_indices | joining
        logger.info("scaling up with slices %s after step %d", sorted(joining), step)
        mesh, batch_size = self._layout()
        abstract = self.program.abstract_state(mesh)
        step_fn = self.compiler.compile(mesh, batch_size)
        self.tiers.on_active_slices_changed(mesh)
        recovery.lap("mesh_and_compile")
        shardings = jax.tree.map(lambda a: a.sharding, abstract)
        attempt.state = jax.block_until_ready(jax.device_put(attempt.state, shardings))
        attempt.mesh, attempt.batch_size, attempt.step_fn = mesh, batch_size, step_fn
        attempt.in_batch = batch_sharding(mesh, self.mesh_spec.batch_axes)
        self.data.start(batch_size, attempt.data)  # the position after ``step``, not the step in flight
        recovery.lap("restore")
        self.tiers.precompile_saves(attempt.state, mesh)
        recovery.lap("mesh_and_compile")
        self.emit(Resume(source="live", step=step + 1, durations=recovery.durations))
        self.compiler.start_precompiling()  # the meshes a loss from the larger one leads to
