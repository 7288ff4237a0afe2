"""Tier 2: persistent checkpoints of the training state and its meta, over Orbax's manager of one of two kinds.

``orbax``
    an Orbax ``CheckpointManager`` on a local directory or a ``gs://`` path, with a strict
    commit check and a diagnosis of committed steps that cannot be read
    (:mod:`~elastic_dew.elastic.state.orbax_kind`).

``multi_tier``
    the Pathways guide's ``initialize_multi_tier_checkpointing`` and
    ``ReplicatorCheckpointManager`` with colocated Python, re-initialised for the active
    devices (:mod:`~elastic_dew.elastic.state.multi_tier` states the rule).

:class:`Checkpoints` holds Orbax's manager of either kind itself: it checks its arguments
before anything is touched, encodes ``meta`` as JSON, skips a step at or below the newest
committed one, and saves, lists and restores through the manager.

**Every storage call is bounded** (:mod:`~elastic_dew.elastic.state.storage`): a listing, a save's
start, a restore, and the commit of a save written in the background, by the storage
timeout (``timeout``; automatic when ``None``: :func:`~elastic_dew.elastic.state.storage.automatic_timeout`
of the state's bytes and the bandwidth of the saves committed so far). A save that fails or
passes its timeout is *abandoned*: Orbax's manager is forgotten without being waited
for (a fresh one serves the next call), the failure is kept for the caller
(:meth:`Checkpoints.failures`) and the next save is tried as usual. A save that passed its
timeout may still be written (Orbax cannot cancel it, and on ``gs://`` it writes
``commit_success.txt`` last), so its step is *fenced*: added to the record of abandoned steps
(kept in ``record_dir``, the run directory, and in memory), which every listing here
honours, so it is never restored even when its writes land later, and never saved again. A
save that failed with an error has ended, and its step is not fenced. A restore past its
timeout raises :class:`~elastic_dew.elastic.state.storage.StorageTimeout` and the storage is not
read again by this object inside that timeout (:meth:`Checkpoints.newest_known` answers from
memory).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np
from etils import epath
from jax.sharding import Mesh

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.state import multi_tier, orbax_kind, orbax_step, activity, storage
from elastic_dew.elastic.state.commit import Commits
from elastic_dew.elastic.state.meta import MetaError, meta_json
from elastic_dew.elastic.state.multi_tier import META_CAPACITY, MultiTierError
from elastic_dew.elastic.state.orbax_kind import DamagedCheckpoint
from elastic_dew.elastic.state.save_precompiler import SavePrecompiler
from elastic_dew.elastic.state.storage import StorageError, StorageTimeout
from elastic_dew.settings import check_value

__all__ = ["Checkpoints", "META_CAPACITY", "MultiTierError", "DamagedCheckpoint", "StorageError", "StorageTimeout"]

logger = logging.getLogger(__name__)


def _check_step(step: int) -> None:
    if not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(
            f"checkpoint step={step!r} must be an int >= 1: the state after `step` updates "
            "(step 0 is the untrained state, and the multi-tier replicator reserves it)"
        )


class Checkpoints(Commits):
    """Persistent checkpoints of the training state and its meta (tier 2).

    ``directory`` is a local path or ``gs://`` URL (``orbax``), or the workers' local
    directory of the multi-tier volume (``multi_tier``). ``mesh`` (optional) binds a
    multi-tier setup at once; otherwise :meth:`on_active_slices_changed` does, on the first
    attempt. ``slices`` is informational (the multi-tier kind counts the replica axis of
    each mesh it is given). ``run_name`` names the multi-tier run (default: ``$JOBSET_NAME``);
    ``backup_interval_minutes`` is the replicator's backup cadence and
    ``init_timeout_seconds`` how long one initialisation may wait for it (multi-tier only).
    ``timeout`` limits every storage call in seconds (``None``: automatic, see the module);
    ``record_dir`` (the run directory) keeps the record of abandoned steps across processes.

    Args:
        directory: where the checkpoints go (a path or ``gs://`` URL).
        kind: ``orbax`` or ``multi_tier``.
        max_to_keep: checkpoints kept.
        mesh: a mesh to bind ``multi_tier`` to at once, or ``None``.
        slices: the allocation's slices (informational), or ``None``.
        run_name: the multi-tier run's name, or ``None`` for ``$JOBSET_NAME``.
        backup_interval_minutes: the replicator's backup cadence (``multi_tier``).
        init_timeout_seconds: the longest one initialisation may wait (``multi_tier``).

    Raises:
        ValueError: a bad argument, before any directory is touched.
        RuntimeError: ``multi_tier`` without a Pathways backend (or the simulator's
            replicator stand-in), before any directory is touched.
    """

    def __init__(
        self,
        directory: str,
        *,
        kind: str = "orbax",
        max_to_keep: int = 3,
        mesh: Mesh | None = None,
        slices: int | None = None,
        run_name: str | None = None,
        backup_interval_minutes: int = 10,
        init_timeout_seconds: int = 900,
        timeout: float | None = None,
        record_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        # The ranges ElasticConfig declares for the same settings, checked by its declarations.
        check_value(ElasticConfig, "checkpoint_kind", kind, owner="Checkpoints", name="kind")
        if not directory:
            raise ValueError("checkpoint directory is empty; give a local path or a gs:// URL")
        check_value(ElasticConfig, "max_to_keep", max_to_keep, owner="Checkpoints", name="max_to_keep")
        if slices is not None and slices < 1:
            raise ValueError(f"slices={slices} must be >= 1")
        check_value(ElasticConfig, "storage_timeout", timeout, owner="Checkpoints", name="timeout")
        super().__init__(directory, timeout, record_dir)
        self.kind = kind
        self.slices = slices
        self.max_to_keep = max_to_keep
        self.path = epath.Path(self.directory)
        #: Orbax's manager: ``orbax``'s ``CheckpointManager``, built on first use;
        #: ``multi_tier``'s ``ReplicatorCheckpointManager``, built for the active slices
        #: (:meth:`on_active_slices_changed`). ``None`` before and after a save given up on.
        self.manager: Any = None
        #: The ``multi_tier`` manager's mesh and devices, and how often multi-tier
        #: checkpointing was initialised (for the active devices; see its module).
        self.mesh: Mesh | None = None
        self.devices: frozenset | None = None
        self.initializations = 0
        # Small leaves are saved whole by one replica: nothing to compile on a first save
        # (orbax_private.REPLICA_PARALLEL_MIN_SLICE_BYTES); large ones replica-parallel.
        self._arrays = orbax_private.replica_parallel_array_handler() if kind == "orbax" else None
        self.precompiler = SavePrecompiler(self._arrays)
        if kind == "multi_tier":
            run_name = run_name or os.environ.get("JOBSET_NAME")
            if not run_name:
                raise ValueError(
                    "checkpoint kind 'multi_tier' needs a run name: pass run_name or set JOBSET_NAME"
                )
            check_value(ElasticConfig, "mtc_backup_minutes", backup_interval_minutes, owner="Checkpoints",
                        name="backup_interval_minutes")
            check_value(ElasticConfig, "mtc_init_timeout", init_timeout_seconds, owner="Checkpoints",
                        name="init_timeout_seconds")
            multi_tier.require_colocated_python()
            #: What each initialisation is given (:func:`~elastic_dew.elastic.state.multi_tier.initialize`).
            self.init_arguments: dict[str, Any] = {"run_name": run_name, "init_timeout_seconds": init_timeout_seconds,
                                                   "backup_interval_minutes": backup_interval_minutes}
            if mesh is not None:
                self.on_active_slices_changed(list(mesh.devices.flat), mesh)
        else:
            def open_directory() -> None:  # builds the manager, which creates the directory and lists it
                orbax_kind.check_bucket(self.directory)
                self._manager()

            try:
                self._call("listing", None, open_directory)
            except OSError as error:  # a bucket that does not exist, a listing refused
                raise StorageError.of("listing", self.directory, None, error) from error

    # -- saves -----------------------------------------------------------------------------
    def save(self, step: int, state: Any, meta: dict, *, force: bool = False, timeout: float | None = None) -> bool:
        """Start saving the state after ``step`` updates (asynchronous); ``wait`` commits it.

        A save still in flight is committed first (:meth:`wait_or_abandon`). A step at or below the
        newest committed one is skipped (logged): Orbax would otherwise garbage-collect the
        newer checkpoints in favour of the older step; so is an abandoned step. A start that
        fails or passes ``timeout`` abandons the save (its failure is in :meth:`failures`).

        Args:
            step: the step whose state this is.
            state: the state.
            meta: its JSON-able meta (step, data position, ...).
            force: save even where Orbax's own policy would skip the step.
            timeout: the most seconds the save may take from its start to its commit, active
                or not (default: no such timeout; the storage timeout's no-activity deadline
                always holds).

        Returns:
            Whether the save started.

        Raises:
            ValueError: a bad step, or a meta the kind cannot carry.
            jax.errors.JaxRuntimeError: a slice was lost while the state was read.
        """
        _check_step(step)
        encoded = meta_json(meta, "checkpoint")
        self._nbytes = storage.state_bytes(state)
        self.wait_or_abandon(timeout)
        if step in self.abandoned:
            logger.warning("checkpoint of step %d skipped: an earlier save of that step was abandoned", step)
            return False
        started = time.monotonic()
        counters = activity.METER.counters()

        def start() -> bool:
            # The process is the directory's only writer once listed: see newest_known.
            latest = self._known if self._listed else self._seen(self._list())
            if latest is not None and step <= latest:
                logger.info("checkpoint of step %d skipped: step %d is already committed", step, latest)
                return False
            if self.kind == "multi_tier":
                assert self.mesh is not None, "the mesh is bound with the manager"
                multi_tier.save(self._manager(), self.mesh, int(step), state, encoded, force)
                return True
            self.precompiler.stop()  # a save compiles what the precompile had not reached
            orbax_kind.save(self._manager(), self.path, int(step), state, encoded, force)
            return True

        try:
            began = self._call("save", step, start, timeout)
        except MetaError:
            raise  # a meta the kind cannot carry: the caller's bug, not the storage's
        except (StorageError, OSError, ValueError) as error:
            self._abandon(step, error, started)
            return False
        if began:
            self._begin(int(step), started, timeout, counters)
        return began

    # -- listings and restores ----------------------------------------------------------
    def _manager(self) -> Any:
        """Orbax's manager: ``orbax``'s built on first use (building one lists the directory,
        so it happens inside a bounded storage call), ``multi_tier``'s the one bound to the
        active slices."""
        if self.manager is None:
            if self.kind == "multi_tier":
                raise RuntimeError(
                    "multi-tier checkpointing is not bound to the active slices: call "
                    "on_active_slices_changed(devices, mesh) with them first"
                )
            self.manager = orbax_kind.manager(self.path, self._arrays, self.max_to_keep)
        return self.manager

    def _writing(self) -> bool:
        return self.manager is not None and self.manager.is_saving_in_progress()

    def _wait(self) -> None:
        if self.manager is not None:
            self.manager.wait_until_finished()
            self.manager.check_for_errors()

    def _abandon_manager(self, close: bool = False) -> None:
        """``orbax``: the next call builds a fresh manager (this one closed first when ``close``,
        else left to its writers, which may never return). ``multi_tier``: the manager is
        forgotten without being called, and a fresh one bound to the same devices at once."""
        manager, self.manager = self.manager, None
        try:
            if self.kind == "multi_tier":
                mesh, devices = self.mesh, self.devices
                self.on_slice_lost()
                if mesh is not None and devices is not None:
                    self.on_active_slices_changed(list(devices), mesh)
            elif close and manager is not None:
                self._call("close", None, lambda: orbax_kind.close_quietly(manager))
        except Exception:  # noqa: BLE001 - a fresh manager is built on the next call all the same
            logger.exception("abandoning the checkpoint manager of the abandoned save failed")

    def _list(self) -> int | None:
        """The newest committed step less the abandoned ones, asked of the storage (the
        caller limits the call): for ``orbax`` one listing, and one metadata read when the
        newest step directory is committed; for ``multi_tier`` the manager's, or the step
        last seen committed while none is bound (after a lost slice)."""
        if self.kind == "orbax":
            return orbax_step.newest_committed_step(self.path, abandoned=self.abandoned)
        if self.manager is None:
            return self._known
        steps = self.manager.all_steps() if self.abandoned else [self.manager.latest_step()]
        return max((s for s in steps if s is not None and s not in self.abandoned), default=None)

    def _seen(self, newest: int | None) -> int | None:
        """``newest``, the newest committed step just listed, noted as known."""
        if newest is not None:
            self._known = newest if self._known is None else max(self._known, newest)
        return newest

    def latest_step(self, timeout: float | None = None) -> int | None:
        """The newest committed step; saves still in flight and abandoned steps do not count.

        Args:
            timeout: the most seconds the listing may take, active or not (default: as long
                as it is active).

        Returns:
            The step, or ``None``.

        Raises:
            StorageTimeout: the listing did not finish within ``timeout``.
        """
        newest = self._call("listing", None, self._list, timeout)
        self._listed = self.kind == "orbax"
        return self._seen(newest)

    def _newest_committed(self) -> int | None:
        """The newest committed step, the storage listed only the first time and while no
        save is in flight (for the tiers' restore; :meth:`newest_known` states the rule).
        Raises what :meth:`latest_step` raises."""
        if self._listed and self._inflight is None:
            return self._known
        return self.latest_step()

    def _none_newer_than(self, step: int) -> bool:
        """Whether, by what this process knows, no committed checkpoint and no save in flight
        is of a step after ``step`` (the storage not asked; ``False`` before any listing)."""
        inflight = self.saving
        return self._listed and (self._known or 0) <= step and (inflight is None or inflight <= step)

    def newest_known(self) -> int | None:
        """The newest committed step as this process knows it, without asking a storage that
        just stalled.

        The process is the only writer of an ``orbax`` checkpoint directory, so once it has
        listed it, its own commits are all that adds a step: the storage is listed the first
        time only (and again while a save is in flight, which may have committed, and after
        a :meth:`quarantine`; the ``multi_tier`` kind, whose replicator writes too, lists
        every time).

        Returns:
            The step last seen committed when :attr:`stalled` or already listed; otherwise
            :meth:`latest_step` (the step last seen if that fails too); ``None`` for none.
        """
        if self.stalled or (self._listed and self._inflight is None):
            return self._known
        try:
            return self.latest_step()
        except Exception:  # noqa: BLE001 - for messages: what was last seen
            return self._known

    def restore(self, step: int, abstract_state: Any, timeout: float | None = None) -> tuple[Any, dict]:
        """Return ``(state, meta)`` of committed ``step``, on ``abstract_state``'s shardings.

        Args:
            step: a committed step.
            abstract_state: the state's shapes and target shardings.
            timeout: the most seconds the restore may take, active or not (default: as
                long as it is active; the no-activity deadline is :meth:`storage_timeout` of the
                state's bytes).

        Returns:
            The state and its meta.

        Raises:
            ValueError: ``step`` is not committed (naming the newest that is) or was
                abandoned; a :class:`DamagedCheckpoint` when a committed step cannot be read
                (saying what to do).
            StorageTimeout: the restore did not finish within ``timeout``.
        """
        _check_step(step)
        if step in self.abandoned:
            raise ValueError(f"checkpoint step {step} in {self.directory} was abandoned while it was saved; it is never restored")
        self._nbytes = storage.state_bytes(abstract_state)
        started = time.monotonic()
        restored = self._call("restore", int(step), lambda: self._restore(int(step), abstract_state), timeout)
        self.bandwidth.add(self._nbytes, time.monotonic() - started)
        return restored

    def _restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        if self.kind == "multi_tier":
            manager = self._manager()
            assert self.mesh is not None, "the mesh is bound with the manager"
            return multi_tier.restore(manager, self.mesh, step, abstract_state)
        # The newest step known committed (listed, or committed here) is not read again.
        if step != self._known and not orbax_step.committed(self.path / str(step)):
            raise ValueError(
                f"checkpoint step {step} is not committed in {self.directory}; the newest committed step is "
                f"{orbax_step.newest_committed_step(self.path, abandoned=self.abandoned)}"
            )
        return orbax_kind.restore(self._manager(), self.path, step, abstract_state)

    def quarantine(self, step: int) -> str:
        """Move damaged committed ``step`` aside (renamed, never deleted).

        Args:
            step: the committed step that cannot be read.

        Returns:
            Where it went (``<step>.damaged``).

        Raises:
            NotImplementedError: the kind never moves a step (``multi_tier``).
            StorageTimeout: the rename did not finish within the storage timeout.
        """
        if self.kind == "multi_tier":
            raise NotImplementedError(
                "a damaged multi-tier checkpoint is restored by GKE's replicator from a peer or the backup; "
                "elastic_dew does not move it aside"
            )
        self._listed, self._known = False, None  # the newest known step may be the one moved aside
        return self._call("quarantine", int(step), lambda: str(orbax_kind.quarantine(self.path, int(step))))

    def precompile_saves(self, state: Any) -> None:
        """Precompile the first save of ``state``'s layout while training goes on.

        For ``orbax``: compile, in a background thread, the per-device slicing Orbax's
        replica-parallel save compiles on its first save of a layout, for the leaves large
        enough to be saved replica-parallel (``orbax_private.REPLICA_PARALLEL_MIN_SLICE_BYTES``;
        smaller ones are written whole by one replica and compile nothing); a save stops
        it and compiles what it had not reached, and so does :meth:`close` (``precompiler.done()``
        waits for it, ``precompiler.stop()`` ends it). The protocol calls this after every
        resume and scale-up. Nothing for ``multi_tier``.

        Args:
            state: the state the loop will save (its layout is what is compiled).
        """
        if self.kind == "orbax":
            self.precompiler.start(state)

    def on_active_slices_changed(self, devices: list, mesh: Mesh) -> None:
        """Bind tier 2 to the active devices and mesh: call it on every attempt and scale-up.

        The multi-tier kind initialises again whenever the active devices differ from those
        its manager was built for (and after :meth:`on_slice_lost`, always); nothing for
        ``orbax``.

        Args:
            devices: the active devices.
            mesh: the attempt's mesh.

        Raises:
            MultiTierError: the replicator fails or does not answer.
        """
        if self.kind != "multi_tier":
            return
        active = frozenset(devices)
        if self.manager is not None and active == self.devices:
            if mesh != self.mesh:
                self._finish()
                self.manager, self.mesh = multi_tier.manager(self.directory, mesh), mesh
            return
        if self.manager is not None:
            self._finish()  # a scale-up: every worker of the old mesh is healthy
        slices = int(mesh.devices.shape[0])
        multi_tier.initialize(self.directory, list(devices), slices, **self.init_arguments)
        self.initializations += 1
        self.devices = active
        self.manager, self.mesh = multi_tier.manager(self.directory, mesh), mesh

    def _finish(self) -> None:
        """Let the manager's save end and close it (``multi_tier``'s on a scale-up too, where a
        failure costs only that save: logged, and the new manager is built all the same)."""
        manager, self.manager = self.manager, None
        try:
            try:
                manager.wait_until_finished()
            finally:  # a save cut short by a fault still lets the manager's threads end
                manager.close()
        except Exception:
            if self.kind != "multi_tier":
                raise
            logger.exception("closing the previous multi-tier checkpoint manager failed")

    def on_slice_lost(self) -> None:
        """A slice was lost: forget anything bound to the old devices, without calling it."""
        if self.kind == "multi_tier":
            if self.manager is not None:
                logger.info("dropping the multi-tier checkpoint manager of the lost slice's mesh")
            self.manager, self.mesh, self.devices = None, None, None

    def close(self) -> None:
        """Wait for the last save (within its timeout) and close Orbax's manager; a save
        abandoned here is in :meth:`failures`, and a manager that does not close within the
        timeout is left to its threads."""
        if self.stalled:  # the storage just stalled: do not wait on it a second time
            if self._inflight is not None:
                self._abandon(self._inflight.step, StorageTimeout(
                    f"checkpoint save of step {self._inflight.step} in {self.directory} was still being "
                    "written as the run ended, after the storage stalled",
                    operation="commit", storage=self.directory, step=self._inflight.step,
                ), self._inflight.started)
            return
        self.wait_or_abandon()
        self.precompiler.stop()
        if self.manager is not None:
            self._call("close", None, self._finish)
