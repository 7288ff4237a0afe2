"""The two state tiers as the protocol drives them: each decides its own cadence.

:class:`SnapshotTier` (tier 1, in-memory snapshots) and :class:`CheckpointTier` (tier 2,
persistent checkpoints) each answer ``on_step(step, state, meta, mesh)`` after every
completed step with the :class:`~elastic_dew.elastic.events.Save` event of the save they
made, or ``None`` when none was due. The checkpoint tier also owns the two saves that are
not on a cadence: the final checkpoint of a finished run and the checkpoint of the step a
preemption agreed on. :class:`Tiers` holds both, builds them from an
:class:`~elastic_dew.elastic.config.ElasticConfig`, and restores the newest complete state
across them (:mod:`~elastic_dew.elastic.state.restore`).

Every save event is built by :func:`timed_save`; every save announces its phase
(:mod:`~elastic_dew.elastic.hooks`) first, so the simulator can fire a fault inside it.

**What a save's seconds are**, on every platform: the time the loop was held by the save
itself. A save is offered the state of the last completed step while the next step is in
flight, and whatever of the save would wait for that step (on a CPU backend its first
program queues behind it and its host work competes with it for the cores) is not saving:
:func:`timed_save` first calls the caller's ``wait_step``, which waits for the step in flight,
and starts its clock after. The protocol counts that wait in the step's own line
(:class:`StepSaves` says when it began). So a cadence save's seconds run from the step in flight's
completion to ``Snapshots.save`` handing the packed state to Orbax (tier 1) or to Orbax's
``CheckpointManager.save`` returning once the state is on the host and its write is under
way (tier 2); a preemption's checkpoint runs to its commit, and a finished run's final one
(no step in flight) from its start to its commit. On an accelerator the wait costs the
overlap of one step with the save's host work at each step that saves; that time is then
the save's seconds, not hidden in a step's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax

from elastic_dew._deprecation import renamed_keywords
from elastic_dew._deprecation import renamed_method
from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.events import Commit, Event, Save, Storage
from elastic_dew.elastic.state.checkpoints import Checkpoints
from elastic_dew.elastic.state import Newest, newest
from elastic_dew.elastic.state.restore import Restored, restore
from elastic_dew.elastic.state.snapshots import Snapshots
from elastic_dew.elastic.state.storage import StorageError, permanent

__all__ = ["timed_save", "StepSaves", "SnapshotTier", "CheckpointTier", "Tiers", "SavesFailing"]

logger = logging.getLogger(__name__)


#: Waits for the step in flight (the protocol's, bounded by its step deadline).
StepWait = Callable[[], Any]


def timed_save(tier: str, step: int, save: Callable[[], bool], wait_step: StepWait | None = None) -> Save:
    """Run ``save`` (which returns whether the tier took the state) and describe it.

    ``wait_step`` (the wait for the step in flight, when one is) runs first, off the clock:
    the event's ``seconds`` are ``save``'s alone (the module's rule).
    """
    if wait_step is not None:
        wait_step()
    started = time.monotonic()
    taken = bool(save())
    return Save(tier=tier, step=step, taken=taken, seconds=time.monotonic() - started)


class _Cadence:
    """A tier's cadence: a save every ``every`` steps (never when ``every`` is 0), announced
    as the tier's phase and timed by :func:`timed_save`."""

    name: str
    every: int

    def due(self, step: int) -> bool:
        """Whether ``step`` is on the cadence (its :meth:`on_step` saves)."""
        return bool(self.every) and not step % self.every

    def _save(self, step: int, state: Any, meta: dict, mesh: jax.sharding.Mesh) -> bool:
        raise NotImplementedError

    def on_step(
        self, step: int, state: Any, meta: dict, mesh: jax.sharding.Mesh, wait_step: StepWait | None = None
    ) -> Save | None:
        """Save ``state`` if ``step`` is on the cadence; the save event, or ``None``."""
        if not self.due(step):
            return None
        hooks.phase(self.name, step)
        return timed_save(self.name, step, lambda: self._save(step, state, meta, mesh), wait_step)


class SnapshotTier(_Cadence):
    """Tier 1: an in-memory snapshot every ``every`` steps (never when ``every`` is 0)."""

    name = "snapshot"

    def __init__(self, snapshots: Snapshots | None, every: int) -> None:
        self.snapshots = snapshots
        self.every = every

    def land(self) -> None:
        """Wait for the snapshot in flight to land in host memory (or fail)."""
        if self.snapshots is not None:
            self.snapshots.join()

    def _save(self, step: int, state: Any, meta: dict, mesh: jax.sharding.Mesh) -> bool:
        assert self.snapshots is not None, "a tier without snapshots is never due"
        return self.snapshots.save(step, state, meta, mesh)


class SavesFailing(StorageError):
    """Checkpoint saves kept failing (``max_failed_saves`` in a row, or nothing committed for
    ``max_uncommitted_seconds``), or one was refused for a cause saving again does not fix (a
    refused permission, a missing bucket): the run stops rather than train on with nothing
    durable.

    Args:
        message: the storage, the last failure, the newest committed step and the fix.
        operation: the last failure's operation, and so are the others.
        storage: the directory or ``gs://`` path.
        step: the last failed step.
        bound: its bound.
        waited: how long it ran.
        cause: the last failure.
    """


class CheckpointTier(_Cadence):
    """Tier 2: a persistent checkpoint every ``every`` steps, at the end, and on preemption.

    ``checkpoints`` is ``None`` when the run has no checkpoint directory: then nothing is
    ever saved. A save that fails or passes the storage timeout is abandoned by
    :class:`~elastic_dew.elastic.state.checkpoints.Checkpoints` and reported here as a
    :class:`~elastic_dew.elastic.events.Storage` event (``emit``); the run goes on and the
    next save is tried at its cadence, until ``max_failures`` are abandoned in a row, or,
    with ``max_uncommitted`` seconds, until none committed for that long while saves
    failed, or at once when a save was refused for a cause saving again does not fix
    (:func:`~elastic_dew.elastic.state.storage.permanent`: a refused permission, a missing
    bucket): then :class:`SavesFailing`, naming the storage, the error, the newest committed
    step and the fix. :meth:`poll`, at every step boundary, settles a save that finished
    or passed its bound without holding the loop.
    """

    name = "checkpoint"

    def __init__(
        self, checkpoints: Checkpoints | None, every: int, *, max_failures: int = 3,
        max_uncommitted: float | None = None,
    ) -> None:
        self.checkpoints = checkpoints
        self.every = every
        self.max_failures = max_failures
        self.max_uncommitted = max_uncommitted
        #: Where :class:`~elastic_dew.elastic.events.Storage` events go (the protocol's emit).
        self.emit: Callable[[Event], None] = lambda event: None
        self.failed_in_row = 0
        self._commits = 0
        self._since = time.monotonic()  # the last commit, or the tier's start
        #: The checkpoint due while a commit was in flight: ``(step, state, meta)``, started
        #: at the first step boundary after that commit ends (at most one waits).
        self.queued: tuple[int, Any, dict] | None = None

    def _note(self, failures: list[StorageError], *, stopping: bool = False) -> None:
        """Emit each committed and abandoned save; stop the run (:class:`SavesFailing`)
        when they keep failing."""
        assert self.checkpoints is not None, "only a tier with checkpoints saves"
        for done in self.checkpoints.committed_saves():
            self.emit(Commit(step=done.step, storage=self.checkpoints.directory, seconds=round(done.seconds, 3),
                             retries=done.retries, nbytes=done.nbytes))
        committed = self.checkpoints.commits
        if committed != self._commits:
            self._commits, self._since, self.failed_in_row = committed, time.monotonic(), 0
        for failure in failures:
            self.failed_in_row += 1
            self.emit(Storage(
                operation=failure.operation, outcome="abandoned", step=failure.step or 0,
                storage=failure.storage, waited=round(failure.waited, 3), error=str(failure),
            ))
        if not failures or stopping:
            return
        silent = time.monotonic() - self._since
        refused = [f for f in failures if permanent(f)]
        if refused or self.failed_in_row >= self.max_failures or (
            self.max_uncommitted is not None and silent > self.max_uncommitted
        ):
            last = refused[-1] if refused else failures[-1]
            newest = self.checkpoints.newest_known()
            kept = (f"the newest committed checkpoint is step {newest}" if newest is not None
                    else "no checkpoint is committed")
            if refused:
                head = f"checkpoint saves to {last.storage} cannot succeed (saving again does not fix this: {last})"
            else:
                why = (f"{self.failed_in_row} saves in a row" if self.failed_in_row >= self.max_failures
                       else f"no checkpoint committed for {silent:.0f} s")
                head = f"checkpoint saves to {last.storage} keep failing ({why}; the last: {last})"
            raise SavesFailing(
                f"{head}; {kept}. Fix the storage, then run the same command again to resume from it"
                + ("" if refused else " (or raise --max-failed-saves / --storage-timeout)"),
                operation=last.operation, storage=last.storage, step=last.step, bound=last.bound,
                waited=last.waited, cause=last,
            )

    def poll(self) -> None:
        """At a step boundary: finish the save in flight if it finished, failed, or made no
        progress for the storage timeout; never waits."""
        if self.checkpoints is None or self.checkpoints.saving is None:
            return
        self.checkpoints.poll()
        self._note(self.checkpoints.failures())

    def due(self, step: int) -> bool:
        """Whether ``step`` saves: on the cadence, or a queued checkpoint can start (the
        commit ahead of it ended). Never without a checkpoint directory."""
        if self.checkpoints is None:
            return False
        return super().due(step) or (self.queued is not None and self.checkpoints.saving is None)

    def on_step(
        self, step: int, state: Any, meta: dict, mesh: jax.sharding.Mesh, wait_step: StepWait | None = None
    ) -> Save | None:
        """Start the checkpoint of ``step`` if it is due, waiting at most :data:`PATIENCE`
        for a commit still in flight: a slow commit never holds training. One due while
        the commit before it is still in flight after that is *queued* (its state kept, a
        ``save`` event with ``taken`` false) and started at the first step boundary after
        that commit ends; at most one waits: a newer one due meanwhile takes its place, and
        the older is skipped with a ``storage`` event naming its step and why. Returns the
        event of the save started or queued now, or ``None``."""
        if self.checkpoints is None:
            return None
        checkpoints = self.checkpoints
        checkpoints.poll()  # one that just ended is settled here, without waiting
        self._note(checkpoints.failures())  # a stop it calls for comes before the next write
        started = None
        if self.queued is not None and checkpoints.saving is None:
            queued_step, queued_state, queued_meta = self.queued
            self.queued = None
            if _donated(queued_state):
                self._skip(queued_step, "its state was donated to a later step before its save could start")
            else:
                hooks.phase(self.name, queued_step)
                started = timed_save(self.name, queued_step,
                                     lambda: self._start(queued_step, queued_state, queued_meta), wait_step)
                wait_step = None
        if not _Cadence.due(self, step):
            return started
        if checkpoints.saving is not None:
            if started is not None:
                return self._queue(step, state, meta, started)
            hooks.phase(self.name, step)
            return timed_save(self.name, step, lambda: self._start_or_queue(step, state, meta), wait_step)
        hooks.phase(self.name, step)
        return timed_save(self.name, step, lambda: self._start(step, state, meta), wait_step)

    def _start_or_queue(self, step: int, state: Any, meta: dict) -> bool:
        """Wait up to :data:`PATIENCE` for the commit in flight (a healthy disk's ends inside
        it), then start this save, or queue it when the commit is still in flight."""
        checkpoints = self.checkpoints
        checkpoints.poll(wait=PATIENCE)
        self._note(checkpoints.failures())
        if checkpoints.saving is None:
            self.drop_queued(f"the checkpoint of step {step}, due as the commit ahead of it ended, supersedes it")
            return self._start(step, state, meta)
        self._queue(step, state, meta)
        return False

    def _queue(self, step: int, state: Any, meta: dict, started: Save | None = None) -> Save | None:
        """Queue ``step``'s checkpoint behind the commit in flight (the one queued before it
        is skipped); returns ``started``, the event of a save started at this boundary."""
        checkpoints = self.checkpoints
        if self.queued is not None:
            self._skip(self.queued[0], f"the checkpoint of step {step} took its place in the queue behind the "
                       f"commit of step {checkpoints.saving}, still in flight after {_running(checkpoints):.1f} s")
        self.queued = (int(step), state, meta)
        logger.info("checkpoint of step %d queued behind the commit of step %d, still in flight after %.1f s",
                    step, checkpoints.saving, _running(checkpoints))
        return started

    def _start(self, step: int, state: Any, meta: dict) -> bool:
        if step in self.checkpoints.abandoned:
            self._skip(step, "an earlier save of this step was abandoned and is fenced (its writes may "
                       "still land), so it is never saved again")
            return False
        taken = self.checkpoints.save(step, state, meta)  # started: the write goes on in the background
        self._note(self.checkpoints.failures())
        return taken

    def _save(self, step: int, state: Any, meta: dict, mesh: jax.sharding.Mesh) -> bool:
        return self._start(step, state, meta)

    def _skip(self, step: int, why: str) -> None:
        """A checkpoint not taken: logged, and a ``storage`` event with its step and why."""
        logger.warning("checkpoint of step %d skipped: %s", step, why)
        self.emit(Storage(operation="save", outcome="skipped", step=int(step), storage=self.checkpoints.directory,
                          waited=round(_running(self.checkpoints), 3), error=why))

    def drop_queued(self, why: str) -> None:
        """Skip the queued checkpoint, if one waits (a newer save supersedes it, or its
        state is gone with a lost slice)."""
        if self.queued is not None:
            step, self.queued = self.queued[0], None
            self._skip(step, why)

    def save_final(self, step: int, state: Any, meta: dict) -> Save | None:
        """Commit the last step's checkpoint (unless the cadence already did); its event, or
        ``None``. A final save that is abandoned is reported like any other."""
        checkpoints = self.checkpoints
        if checkpoints is None:
            return None
        if self.queued is not None and self.queued[0] != step:
            self.drop_queued(f"the final checkpoint of step {step} supersedes it")
        self.queued = None
        checkpoints.wait_or_abandon()
        self._note(checkpoints.failures())
        saved = None
        if checkpoints.newest_known() != step:
            hooks.phase(self.name, step)

            def write() -> bool:
                taken = checkpoints.save(step, state, meta, force=True)
                return taken and checkpoints.wait_or_abandon() is None

            saved = timed_save(self.name, step, write)
        self._note(checkpoints.failures(), stopping=True)
        return saved

    def save_preemption(
        self, step: int, state: Any, meta: dict, wait_step: StepWait | None = None, bound: float | None = None
    ) -> Save | None:
        """Write and commit the checkpoint of the step a preemption agreed on (``wait_step``:
        the wait for the step in flight, off the save's clock), all of it within ``bound``
        seconds (the grace window's share; default: no bound but the storage timeout's
        no-progress deadline). The commit in flight is let finish first; a queued checkpoint
        is superseded; the agreed step's is taken only when what ``bound`` leaves is at least
        the slowest of the last commits (``Checkpoints.commit_seconds``; else a
        ``storage`` event says why). The event's ``taken`` says whether it committed.

        ``None``, with an error logged, when there is nowhere to write it.
        """
        checkpoints = self.checkpoints
        if checkpoints is None:
            logger.error("no checkpoint directory is configured: step %d is not saved", step)
            return None
        if wait_step is not None:
            wait_step()
        self.drop_queued(f"the preemption's checkpoint of step {step} supersedes it")
        limit = bound
        deadline = None if bound is None else time.monotonic() + bound

        def left() -> float | None:
            return None if deadline is None else max(0.01, deadline - time.monotonic())

        def write() -> bool:
            checkpoints.wait_or_abandon(left())  # the commit in flight finishes first, while it progresses
            try:
                if checkpoints.latest_step(left()) == step:
                    return True
            except StorageError as error:
                logger.error("the preemption checkpoint of step %d is not written: %s", step, error)
                return False
            remaining, needs = left(), max(checkpoints.commit_seconds, default=None)
            if remaining is not None and needs is not None and remaining < needs:
                why = (f"{remaining:.1f} s of the grace window are left and the last commits took up to "
                       f"{needs:.1f} s; the newest committed step is {checkpoints.newest_known()}")
                logger.warning("the preemption checkpoint of step %d is not taken: %s", step, why)
                self.emit(Storage(operation="save", outcome="skipped", step=int(step), storage=checkpoints.directory,
                                  waited=0.0, error=why))
                return False
            if not checkpoints.save(step, state, meta, force=True, bound=left()):
                return False
            return checkpoints.wait_or_abandon(left()) is None

        saved = timed_save(self.name, step, write)
        self._note(checkpoints.failures(), stopping=True)
        if not saved.taken:
            logger.error(
                "the preemption checkpoint of step %d did not commit%s; the newest committed step stays %s",
                step, "" if limit is None else f" within {limit:.1f} s (what the grace window leaves)",
                checkpoints.newest_known(),
            )
        return saved


#: The most seconds a due checkpoint waits for the commit before it to end, before it is
#: queued instead: a healthy disk's commit ends inside it, so saves keep their cadence (and a
#: simulated run its events); a slow bucket's does not, and training goes on.
PATIENCE = 2.0


def _running(checkpoints: Checkpoints) -> float:
    """Seconds the save in flight has run (0 when none is)."""
    since = checkpoints.saving_since
    return 0.0 if since is None else time.monotonic() - since


def _donated(state: Any) -> bool:
    """Whether any array of ``state`` was deleted (donated to a later step's program)."""
    return any(bool(getattr(leaf, "is_deleted", lambda: False)()) for leaf in jax.tree.leaves(state))


class StepSaves(NamedTuple):
    """What one step's saves took of the loop: the wait for the step in flight began at
    ``waited_from`` (a ``time.monotonic()``; that wait is step time) and the saves' events hold
    ``seconds`` between them."""

    waited_from: float
    seconds: float


class Tiers:
    """Both tiers of one run, in the order a step saves them (snapshot, then checkpoint).

    Args:
        snapshot: tier 1.
        checkpoint: tier 2.
        owns_checkpoints: whether tier 2's manager was created here (and closed here).
    """

    def __init__(
        self, snapshot: SnapshotTier, checkpoint: CheckpointTier, *, owns_checkpoints: bool = False,
        quarantine: bool = True,
    ) -> None:
        self.snapshot = snapshot
        self.checkpoint = checkpoint
        #: Whether tier 2's manager was created here (and so is closed by :meth:`close`).
        self.owns_checkpoints = owns_checkpoints
        #: Whether a damaged committed checkpoint is moved aside and the previous one restored.
        self.quarantine = quarantine

    @classmethod
    @renamed_keywords("Tiers.from_config", num_slices="slices")
    def from_config(
        cls,
        config: ElasticConfig,
        *,
        slices: int,
        snapshots: Snapshots | None = None,
        checkpoints: Checkpoints | None = None,
        run_name: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
    ) -> Tiers:
        """The tiers ``config`` asks for; ``snapshots``/``checkpoints`` given are used as they are.

        Tier 2 writes to ``config.checkpoint_dir``, else, for a run in ``run_dir``, to the
        default :meth:`~elastic_dew.elastic.config.ElasticConfig.checkpoint_dir_for` names;
        with neither there is no tier 2.

        Args:
            config: the :class:`~elastic_dew.elastic.config.ElasticConfig`.
            slices: the allocation's slices.
            snapshots: tier 1 to use, or ``None``.
            checkpoints: tier 2 to use, or ``None``.
            run_name: the run's name (multi-tier backups), or ``None``.
            run_dir: the run directory, or ``None``.

        Returns:
            The tiers.
        """
        if snapshots is None and config.snapshot_every:
            snapshots = Snapshots(replica_axis_index=0)
        directory = config.checkpoint_dir
        if directory is None and run_dir is not None:
            directory = config.checkpoint_dir_for(run_dir)
        owns_checkpoints = checkpoints is None and directory is not None
        if checkpoints is None and directory is not None:
            checkpoints = Checkpoints(
                directory,
                kind=config.checkpoint_kind,
                max_to_keep=config.max_to_keep,
                slices=slices,
                run_name=run_name,
                backup_interval_minutes=config.mtc_backup_minutes,
                init_timeout_seconds=config.mtc_init_timeout,
                timeout=config.storage_timeout,
                record_dir=run_dir,
            )
        return cls(
            SnapshotTier(snapshots, config.snapshot_every),
            CheckpointTier(
                checkpoints, config.checkpoint_every, max_failures=config.max_failed_saves,
                max_uncommitted=config.max_uncommitted_seconds,
            ),
            owns_checkpoints=owns_checkpoints,
            quarantine=config.quarantine_damaged,
        )

    @property
    def snapshots(self) -> Snapshots | None:
        return self.snapshot.snapshots

    @property
    def checkpoints(self) -> Checkpoints | None:
        return self.checkpoint.checkpoints

    def __iter__(self) -> Iterator[SnapshotTier | CheckpointTier]:
        """The tiers in the order a step offers them its state: snapshot, then checkpoint."""
        return iter((self.snapshot, self.checkpoint))

    def due(self, step: int) -> bool:
        """Whether either tier saves at ``step``.

        Args:
            step: a step.

        Returns:
            Whether a tier saves at it.
        """
        return any(tier.due(step) for tier in self)

    def on_step(
        self,
        step: int,
        state: Any,
        meta: dict,
        mesh: jax.sharding.Mesh,
        *,
        emit: Callable[[Save], None],
        wait_step: StepWait | None = None,
    ) -> StepSaves | None:
        """Offer completed ``step``'s state to each tier in turn, ``emit`` each save event
        before the next tier is offered it (a fault inside the checkpoint cannot lose the
        snapshot's event); ``wait_step`` waits for the step in flight before the first save.

        A checkpoint save that finished or passed its bound since the last step is settled
        first, without waiting (:meth:`CheckpointTier.poll`).

        Args:
            step: the completed step.
            state: its state.
            meta: its meta.
            mesh: its mesh.
            emit: called with each save event.
            wait_step: waits for the step in flight, or ``None``.

        Returns:
            ``None`` when no tier saved, else the :class:`StepSaves` the step lines need.
        """
        self.checkpoint.poll()
        if not self.due(step):
            return None
        waited_from = time.monotonic()
        seconds = 0.0
        for tier in self:
            saved = tier.on_step(step, state, meta, mesh, wait_step)
            if saved is not None:
                wait_step = None  # waited: the next tier's save has nothing to wait for
                seconds += saved.seconds
                emit(saved)
        return StepSaves(waited_from, seconds)

    def newest(self) -> Newest:
        """The newest complete state across tiers (:func:`~elastic_dew.elastic.state.newest`).

        Returns:
            The :class:`~elastic_dew.elastic.state.Newest` ``(source, step)``.
        """
        return newest(self.snapshots, self.checkpoints)

    def precompile_saves(self, state: Any, mesh: jax.sharding.Mesh) -> None:
        """Precompile the first saves of ``state``'s layout on ``mesh`` before the loop saves.

        Tier 1's pack is compiled now, on the caller's time (the protocol calls this in the
        resume window and counts it in ``mesh_and_compile``), so no snapshot pays a compile;
        tier 2 starts precompiling, in the background, the leaves it saves replica-parallel
        (:meth:`~elastic_dew.elastic.state.checkpoints.Checkpoints.precompile_saves`).

        Args:
            state: the state the loop will save, on ``mesh`` (the one a resume restored).
            mesh: the mesh it is on.

        Raises:
            ValueError: tier 1 cannot snapshot ``state`` (as its ``save`` would raise).
        """
        if self.snapshots is not None and self.snapshot.every:
            self.snapshots.precompile_saves(state, mesh)
        if self.checkpoints is not None:
            self.checkpoints.precompile_saves(state)

    def precompile_resume(self, mesh: jax.sharding.Mesh, abstract_state: Callable[[jax.sharding.Mesh], Any]) -> None:
        """Compile, running nothing, what a resume onto ``mesh`` would compile for the
        tiers: tier 1's load and pack of the layout of ``abstract_state(mesh)`` (built only
        when tier 1 takes snapshots,
        :meth:`~elastic_dew.elastic.state.snapshots.Snapshots.precompile_resume`). Tier 2 has
        nothing to compile ahead of a state (its :meth:`precompile_saves` works on the
        restored one).

        The precompiler calls this for each mesh a lost slice would leave.

        Args:
            mesh: a mesh a resume may land on (the active slices less one).
            abstract_state: the program's state on a mesh, every leaf a
                ``jax.ShapeDtypeStruct`` with its sharding (``Program.abstract_state``).
        """
        if self.snapshots is not None and self.snapshot.every:
            self.snapshots.precompile_resume(abstract_state(mesh), mesh)

    prepare = renamed_method("Tiers", "prepare", precompile_saves)
    precompile = renamed_method("Tiers", "precompile", precompile_resume)

    def on_active_slices_changed(self, mesh: jax.sharding.Mesh) -> None:
        """Bind tier 2 to ``mesh``'s devices before anything is saved or restored through it.

        The protocol calls this at every attempt, at every scale-up and before it persists
        a snapshot while stopping; the multi-tier kind initialises again whenever the active
        devices changed or a slice was lost since it was last bound.

        Args:
            mesh: the attempt's mesh.
        """
        if self.checkpoints is not None:
            self.checkpoints.on_active_slices_changed(list(mesh.devices.flat), mesh)

    def on_slice_lost(self) -> None:
        """A slice was lost: tier 2 forgets what is bound to the old devices without calling it."""
        if self.checkpoints is not None:
            self.checkpoint.drop_queued("a slice was lost before its save could start")
            self.checkpoints.on_slice_lost()

    def restore(self, abstract: Any, emit: Callable[[Event], None] = lambda event: None) -> Restored | None:
        """The newest complete state across the tiers on ``abstract``'s shardings, or ``None``
        when neither tier holds one (a fresh start): :func:`~elastic_dew.elastic.state.restore.restore`,
        with :attr:`quarantine`.

        Args:
            abstract: the state's shapes and target shardings.
            emit: takes the ``storage`` event of a quarantined checkpoint.

        Returns:
            The :class:`~elastic_dew.elastic.state.restore.Restored` state, or ``None``.

        Raises:
            RuntimeError: from tier 1's load (no replica survived).
            ValueError: from either tier's restore (a state of another layout; an unreadable
                checkpoint when :attr:`quarantine` is off, a
                :class:`~elastic_dew.elastic.state.orbax_backend.DamagedCheckpoint`).
            StorageTimeout: a restore or listing past the storage timeout, never tried again here.
        """
        if self.checkpoints is not None:
            self.checkpoint.drop_queued("the attempt ended before its save could start")
        return restore(self.snapshots, self.checkpoints, abstract, quarantine=self.quarantine, emit=emit)

    def resume_from_text(self) -> str:
        """What a run that gave up leaves to resume from, for its error message (not
        asking a storage that just stalled).

        Returns:
            The text.
        """
        checkpoints = self.checkpoints
        saved = checkpoints.newest_known() if checkpoints is not None else None
        if checkpoints is None or saved is None:
            return "no checkpoint was committed, so a re-run starts from step 1"
        return (
            f"the newest committed checkpoint {saved} (in {checkpoints.directory}) is intact: "
            "run the same command again to resume from it once slices are healthy"
        )

    def close(self) -> None:
        """Release tier 1's pinned host memory and end its worker thread, stop tier 2's
        background precompile, and close tier 2's Orbax manager if it was created here
        (after its last save; a manager the caller gave is the caller's to close). Tier 2's
        files stay."""
        if self.checkpoints is not None:
            self.checkpoints.stop_precompiling()
            if self.owns_checkpoints:
                try:
                    self.checkpoints.close()
                except Exception as error:  # noqa: BLE001 - a save cut short by a lost slice
                    logger.warning("the last checkpoint save did not finish as the run closed: %s", error)
        if self.snapshots is not None:
            self.snapshots.close()
