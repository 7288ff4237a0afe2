"""Both state tiers as the protocol drives them: their cadences, the newest state across them.

:class:`Tiers` is the protocol's one handle on state: tier 1's
:class:`~elastic_dew.elastic.state.snapshots.Snapshots` (``snapshots``, a snapshot every
``snapshot_every`` steps) and tier 2's
:class:`~elastic_dew.elastic.state.checkpoints.Checkpoints` (``checkpoints``: the checkpoint
cadence, the final and preemption saves and the failure policy of
:class:`~elastic_dew.elastic.state.checkpoint_tier.CheckpointSaves`, which ``Tiers``
extends). :meth:`Tiers.on_step` offers each completed step's state to tier 1, then tier 2,
and emits each save's :class:`~elastic_dew.elastic.events.Save` event; :meth:`Tiers.restore`
restores the newest complete state across them (a :class:`Restored`).

Every save event is built by :func:`~elastic_dew.elastic.state.checkpoint_tier.timed_save`; every
save announces its phase (:mod:`~elastic_dew.elastic.hooks`) first, so the simulator can fire a
fault inside it.

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
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.events import Event, Storage
from elastic_dew.elastic.state import Newest, choose
from elastic_dew.elastic.state.checkpoint_tier import PATIENCE, CheckpointSaves, SavesFailing, StepWait, timed_save
from elastic_dew.elastic.state.checkpoints import Checkpoints
from elastic_dew.elastic.state.orbax_kind import DamagedCheckpoint
from elastic_dew.elastic.state.snapshots import Snapshots

__all__ = ["Restored", "StepSaves", "Tiers", "SavesFailing", "PATIENCE"]

logger = logging.getLogger(__name__)


class Restored(NamedTuple):
    """A restored state: its ``source`` tier (``"snapshot"`` or ``"checkpoint"``), its ``step``
    (the last completed one), the ``state`` on the target shardings and the ``meta`` saved
    beside it. It unpacks as ``source, step, state, meta``."""

    source: str
    step: int
    state: Any
    meta: dict


class StepSaves(NamedTuple):
    """What one step's saves took of the loop: the wait for the step in flight began at
    ``waited_from`` (a ``time.monotonic()``; that wait is step time) and the saves' events hold
    ``seconds`` between them."""

    waited_from: float
    seconds: float


class Tiers(CheckpointSaves):
    """Both tiers of one run, in the order a step saves them (snapshot, then checkpoint).

    Args:
        snapshots: tier 1, or ``None``.
        checkpoints: tier 2, or ``None``.
        snapshot_every: steps between snapshots (0: none).
        checkpoint_every: steps between cadence checkpoints (0: none on a cadence).
        emit: takes every event of the tiers: saves, commits, abandoned, skipped and
            quarantined checkpoints.
        max_failures: abandoned checkpoint saves in a row that stop the run.
        max_uncommitted: seconds without a commit, while saves fail, that stop the run.
        owns_checkpoints: whether tier 2's manager was created here (and closed here).
        quarantine: whether a damaged committed checkpoint is moved aside and the previous one restored.
    """

    def __init__(
        self, snapshots: Snapshots | None, checkpoints: Checkpoints | None, *, snapshot_every: int = 0,
        checkpoint_every: int = 0, emit: Callable[[Event], None] = lambda event: None, max_failures: int = 3,
        max_uncommitted: float | None = None, owns_checkpoints: bool = False, quarantine: bool = True,
    ) -> None:
        super().__init__(checkpoints, checkpoint_every, emit=emit, max_failures=max_failures,
                         max_uncommitted=max_uncommitted)
        self.snapshots = snapshots
        self.snapshot_every = snapshot_every
        #: Whether tier 2's manager was created here (and so is closed by :meth:`close`).
        self.owns_checkpoints = owns_checkpoints
        #: Whether a damaged committed checkpoint is moved aside and the previous one restored.
        self.quarantine = quarantine

    @classmethod
    def from_config(
        cls,
        config: ElasticConfig,
        *,
        slices: int,
        snapshots: Snapshots | None = None,
        checkpoints: Checkpoints | None = None,
        run_name: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        emit: Callable[[Event], None] = lambda event: None,
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
            emit: takes every event of the tiers.

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
            snapshots, checkpoints, snapshot_every=config.snapshot_every, checkpoint_every=config.checkpoint_every,
            emit=emit, max_failures=config.max_failed_saves, max_uncommitted=config.max_uncommitted_seconds,
            owns_checkpoints=owns_checkpoints, quarantine=config.quarantine_damaged,
        )

    def _snapshot_due(self, step: int) -> bool:
        return self.snapshots is not None and bool(self.snapshot_every) and not step % self.snapshot_every

    def due(self, step: int) -> bool:
        """Whether either tier saves at ``step``.

        Args:
            step: a step.

        Returns:
            Whether a tier saves at it.
        """
        return self._snapshot_due(step) or self.checkpoint_due(step)

    def land(self) -> None:
        """Wait for the snapshot in flight to land in host memory (or fail)."""
        if self.snapshots is not None:
            self.snapshots.join()

    def on_step(
        self,
        step: int,
        state: Any,
        meta: dict,
        mesh: jax.sharding.Mesh,
        wait_step: StepWait | None = None,
    ) -> StepSaves | None:
        """Offer completed ``step``'s state to each tier in turn, emit each save event
        before the next tier is offered it (a fault inside the checkpoint cannot lose the
        snapshot's event); ``wait_step`` waits for the step in flight before the first save.

        A checkpoint save that finished or passed its timeout since the last step is settled
        first, without waiting (:meth:`poll`).

        Args:
            step: the completed step.
            state: its state.
            meta: its meta.
            mesh: its mesh.
            wait_step: waits for the step in flight, or ``None``.

        Returns:
            ``None`` when no tier saved, else the :class:`StepSaves` the step lines need.
        """
        self.poll()
        if not self.due(step):
            return None
        waited_from = time.monotonic()
        seconds = 0.0
        snapshots = self.snapshots
        if snapshots is not None and self._snapshot_due(step):
            hooks.phase("snapshot", step)
            saved = timed_save("snapshot", step, lambda: snapshots.save(step, state, meta, mesh), wait_step)
            wait_step = None  # waited: the checkpoint has nothing to wait for
            seconds += saved.seconds
            self.emit(saved)
        checkpointed = self.checkpoint_on_step(step, state, meta, wait_step)
        if checkpointed is not None:
            seconds += checkpointed.seconds
            self.emit(checkpointed)
        return StepSaves(waited_from, seconds)

    def newest(self) -> Newest:
        """The newest complete state across tiers, by :func:`~elastic_dew.elastic.state.choose`.

        A snapshot counts once it has landed in host memory (this joins the one in flight); a
        checkpoint counts once committed (the storage listed).

        Returns:
            The :class:`~elastic_dew.elastic.state.Newest` ``(source, step)``.
        """
        snapshot = self.snapshots.latest_step() if self.snapshots is not None else None
        return choose(snapshot, self.checkpoints.latest_step() if self.checkpoints is not None else None)

    def newest_known(self) -> Newest:
        """:meth:`newest`, with tier 2's step as this process knows it: the checkpoint
        directory is listed once per process
        (:meth:`~elastic_dew.elastic.state.checkpoints.Checkpoints.newest_known`)."""
        snapshot = self.snapshots.latest_step() if self.snapshots is not None else None
        return choose(snapshot, self.checkpoints._newest_committed() if self.checkpoints is not None else None)

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
        if self.snapshots is not None and self.snapshot_every:
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
        if self.snapshots is not None and self.snapshot_every:
            self.snapshots.precompile_resume(abstract_state(mesh), mesh)

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
            self.drop_queued("a slice was lost before its save could start")
            self.checkpoints.on_slice_lost()

    def restore(self, abstract: Any) -> Restored | None:
        """The newest complete state across the tiers on ``abstract``'s shardings, or ``None``
        when neither tier holds one (a fresh start).

        A queued checkpoint is dropped (the attempt that queued it ended). A checkpoint still
        being written when the attempt ended is waited for first, unless a snapshot of its
        step or a newer one landed: its state is already on the host, and once committed it
        may be the newest one. Then :func:`~elastic_dew.elastic.state.choose` picks the tier
        from the newest snapshot and the newest committed checkpoint (the checkpoint
        directory listed once per process,
        :meth:`~elastic_dew.elastic.state.checkpoints.Checkpoints.newest_known`): a snapshot is loaded from a replica on the surviving slices (tier 1),
        else the newest committed checkpoint (tier 2); a committed checkpoint that cannot be
        read is, with :attr:`quarantine`, moved aside (a ``storage`` event) and the previous one
        restored. Each load announces its phase (:mod:`~elastic_dew.elastic.hooks`) first, so
        the simulator can fire a fault inside it.

        Args:
            abstract: the state's shapes and target shardings.

        Returns:
            The :class:`Restored` state, or ``None``.

        Raises:
            RuntimeError: from tier 1's load (no replica survived).
            ValueError: from either tier's restore (a state of another layout; an unreadable
                checkpoint when :attr:`quarantine` is off, a
                :class:`~elastic_dew.elastic.state.orbax_kind.DamagedCheckpoint`).
            StorageTimeout: a restore or listing past the storage timeout, never tried again here.
        """
        snapshots, checkpoints = self.snapshots, self.checkpoints
        snapshot = snapshots.latest_step() if snapshots is not None else None
        if checkpoints is not None:
            self.drop_queued("the attempt ended before its save could start")
        if checkpoints is not None and snapshot is not None and checkpoints._none_newer_than(snapshot):
            # Nothing on tier 2 can be newer: the checkpoint in flight, if any, commits in its own time.
            source, saved = Newest("snapshot", snapshot)
        else:
            self._land_inflight()
            source, saved = choose(snapshot, checkpoints._newest_committed() if checkpoints is not None else None)
        if source == "snapshot" and snapshots is not None and saved is not None:
            hooks.phase("snapshot_load", saved + 1)
            try:
                state, meta, step = snapshots.load(abstract)
                return Restored("snapshot", step, state, meta)
            except jax.errors.JaxRuntimeError:
                raise  # a slice lost during the load: the next attempt retries it
            except RuntimeError as error:  # every replica was on a lost slice
                logger.warning("no snapshot replica survived (%s); trying the checkpoint", error)
                self._land_inflight()
                saved = checkpoints._newest_committed() if checkpoints is not None else None
                source = "checkpoint" if saved is not None else "fresh"
        while source == "checkpoint" and checkpoints is not None and saved is not None:
            hooks.phase("checkpoint_restore", saved + 1)
            try:
                state, meta = checkpoints.restore(saved, abstract)
            except DamagedCheckpoint as error:
                if not self.quarantine:
                    raise
                try:
                    moved = checkpoints.quarantine(saved)
                except NotImplementedError:
                    raise error from None
                logger.error("checkpoint step %d cannot be read; moved aside to %s: %s", saved, moved, error)
                self.emit(Storage(operation="restore", outcome="quarantined", step=saved,
                                  storage=checkpoints.directory, waited=0.0, error=str(error), moved_to=moved))
                source, saved = self.newest()
                continue
            return Restored("checkpoint", saved, state, meta)
        if source == "snapshot" and snapshots is not None:  # a snapshot newer than what is left after a quarantine
            state, meta, step = snapshots.load(abstract)
            return Restored("snapshot", step, state, meta)
        return None

    def _land_inflight(self) -> None:
        """Wait for the checkpoint in flight, if any, to commit (or fail: it is then not committed)."""
        if self.checkpoints is None or self.checkpoints.saving is None:
            return
        try:
            self.checkpoints.wait()
        except Exception as error:  # noqa: BLE001 - cut short by the fault: not committed
            logger.warning("the checkpoint in flight when the attempt ended did not commit: %s", error)

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
            self.checkpoints.precompiler.stop()  # a compile running in XLA at exit aborts the process
            if self.owns_checkpoints:
                try:
                    self.checkpoints.close()
                except Exception as error:  # noqa: BLE001 - a save cut short by a lost slice
                    logger.warning("the last checkpoint save did not finish as the run closed: %s", error)
        if self.snapshots is not None:
            self.snapshots.close()
