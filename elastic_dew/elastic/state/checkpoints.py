"""Tier 2: persistent checkpoints of the training state and its meta, over one of two backends.

``orbax``
    :class:`~elastic_dew.elastic.state.orbax_backend.OrbaxBackend`: an Orbax
    ``CheckpointManager`` on a local directory or a ``gs://`` path, with a strict commit
    check and a diagnosis of committed steps that cannot be read.

``multi_tier``
    :class:`~elastic_dew.elastic.state.multi_tier.MultiTierBackend`: the Pathways
    guide's ``initialize_multi_tier_checkpointing`` and ``ReplicatorCheckpointManager`` with
    colocated Python, re-initialised for the active devices (its module states the rule).

:class:`Checkpoints` is what the tiers use: it checks its arguments before anything is
touched, encodes ``meta`` as JSON, skips a step at or below the newest committed one, and
hands everything else to the backend through the
:class:`~elastic_dew.elastic.state.backend.Backend` protocol.

**Every storage call is bounded** (:mod:`~elastic_dew.elastic.state.storage`): a listing, a save's
start, a restore, and the commit of a save written in the background, by the storage
timeout (``timeout``; automatic when ``None``: :func:`~elastic_dew.elastic.state.storage.automatic_timeout`
of the state's bytes and the bandwidth of the saves committed so far). A save that fails or
passes its bound is *abandoned*: the backend's manager is forgotten without being waited
for (a fresh one serves the next call), the failure is kept for the caller
(:meth:`Checkpoints.failures`) and the next save is tried as usual. A save that passed its
bound may still be written (Orbax cannot cancel it, and on ``gs://`` it writes
``commit_success.txt`` last), so its step is *fenced*: added to the record of abandoned steps
(kept in ``record_dir``, the run directory, and in memory), which every listing here
honours, so it is never restored even when its writes land later, and never saved again. A
save that failed with an error has ended, and its step is not fenced. A restore past its
bound raises :class:`~elastic_dew.elastic.state.storage.StorageTimeout` and the storage is not
read again by this object inside that bound (:meth:`Checkpoints.newest_known` answers from
memory).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np
from jax.sharding import Mesh

from elastic_dew.elastic.config import CHECKPOINT_KINDS, ElasticConfig
from elastic_dew.elastic.state.backend import Backend
from elastic_dew.elastic.state.meta import MetaError, meta_json
from elastic_dew.elastic.state.multi_tier import META_CAPACITY, MultiTierBackend, MultiTierError
from elastic_dew.elastic.state import orbax_step, progress, storage
from elastic_dew.elastic.state.orbax_backend import DamagedCheckpoint, OrbaxBackend
from elastic_dew.elastic.state.storage import StorageError, StorageTimeout
from elastic_dew.settings import check_value

__all__ = ["Checkpoints", "KINDS", "META_CAPACITY", "MultiTierError", "DamagedCheckpoint", "StorageError", "StorageTimeout"]

logger = logging.getLogger(__name__)

KINDS = CHECKPOINT_KINDS


def _check_step(step: int) -> None:
    if not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(
            f"checkpoint step={step!r} must be an int >= 1: the state after `step` updates "
            "(step 0 is the untrained state, and the multi-tier replicator reserves it)"
        )


class _InFlight(NamedTuple):
    """A save written in the background: its step, when it started, its bytes, the most
    seconds it was given from its start, progress or not (``None``: no such bound, only the
    storage timeout's no-progress deadline), and the storage clients' counts at its start."""

    step: int
    started: float
    nbytes: int
    total: float | None = None
    counters: progress.Counters = progress.Counters(0, 0, 0)


class Committed(NamedTuple):
    """A save that committed: its step, its seconds from start to commit, and the retries
    and bytes the storage clients saw meanwhile (process-wide)."""

    step: int
    seconds: float
    retries: int
    nbytes: int


class Checkpoints:
    """Persistent checkpoints of the training state and its meta (tier 2).

    ``directory`` is a local path or ``gs://`` URL (``orbax``), or the workers' local
    directory of the multi-tier volume (``multi_tier``). ``mesh`` (optional) binds a
    multi-tier setup at once; otherwise :meth:`on_active_slices_changed` does, on the first
    attempt. ``slices`` is informational (the multi-tier kind counts the replica axis of
    each mesh it is given). ``run_name`` names the multi-tier run (default: ``$JOBSET_NAME``);
    ``backup_interval_minutes`` is the replicator's backup cadence and
    ``init_timeout_seconds`` how long one initialisation may wait for it (multi-tier only).
    ``timeout`` bounds every storage call in seconds (``None``: automatic, see the module);
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
        self.kind = kind
        self.directory = str(directory)
        self.slices = slices
        self.timeout = timeout
        self.record_dir = record_dir
        #: Bytes per second of the saves committed so far (sizes the automatic timeout).
        self.bandwidth = storage.Bandwidth()
        #: Steps whose save was given up on: never listed, never restored, never saved again.
        self.abandoned: set[int] = orbax_step.read_abandoned(record_dir)
        self._nbytes = 0
        self._inflight: _InFlight | None = None
        self._failures: list[StorageError] = []
        self._committed_saves: list[Committed] = []
        #: Seconds from start to commit of the last few saves committed (the slowest sizes
        #: whether a preemption's save fits what is left of the grace window).
        self.commit_seconds: deque[float] = deque(maxlen=5)
        #: When the save in flight started (a ``time.monotonic()``), or ``None``.
        self.saving_since: float | None = None
        self._known: int | None = None
        self._stalled_until = 0.0
        #: Saves committed by this object.
        self.commits = 0
        self.backend: Backend
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
            self.backend = MultiTierBackend(
                self.directory,
                run_name=run_name,
                backup_interval_minutes=backup_interval_minutes,
                init_timeout_seconds=init_timeout_seconds,
            )
            if mesh is not None:
                self.on_active_slices_changed(list(mesh.devices.flat), mesh)
        else:
            self.backend = OrbaxBackend(self.directory, max_to_keep)
            try:
                self._call("listing", None, self.backend.open)  # creates the directory, lists it
            except OSError as error:  # a bucket that does not exist, a listing refused
                raise StorageError.of("listing", self.directory, None, error) from error

    # -- bounds ----------------------------------------------------------------------------
    def bound(self, nbytes: int | None = None) -> float:
        """Seconds the storage may go without progress (no request answered, no byte moved)
        before one operation counts as stalled: the storage timeout.

        Args:
            nbytes: the state's bytes (default: those of the last state saved or restored).

        Returns:
            ``timeout``, else the automatic timeout for a state of ``nbytes``.
        """
        if self.timeout is not None:
            return float(self.timeout)
        return storage.automatic_timeout(self._nbytes if nbytes is None else nbytes, self.bandwidth)

    def _call(self, operation: str, step: int | None, call: Any, total: float | None = None,
              since: float | None = None) -> Any:
        """``call()`` under the storage timeout's no-progress deadline (:func:`storage.bounded`),
        and within ``total`` seconds when given."""
        try:
            return storage.bounded(operation, self.directory, step, self.bound(), call, total=total, since=since)
        except StorageTimeout as error:
            self._stalled_until = time.monotonic() + (error.bound or 0.0)
            raise

    @property
    def stalled(self) -> bool:
        """Whether a call to this storage passed its bound less than a bound ago: listings
        then answer from memory (:meth:`newest_known`) instead of asking it again."""
        return time.monotonic() < self._stalled_until

    # -- saves -----------------------------------------------------------------------------
    def save(self, step: int, state: Any, meta: dict, *, force: bool = False, bound: float | None = None) -> bool:
        """Start saving the state after ``step`` updates (asynchronous); ``wait`` commits it.

        A save still in flight is committed first (:meth:`wait_or_abandon`). A step at or below the
        newest committed one is skipped (logged): Orbax would otherwise garbage-collect the
        newer checkpoints in favour of the older step; so is an abandoned step. A start that
        fails or passes ``bound`` abandons the save (its failure is in :meth:`failures`).

        Args:
            step: the step whose state this is.
            state: the state.
            meta: its JSON-able meta (step, data position, ...).
            force: save even where Orbax's own policy would skip the step.
            bound: the most seconds the save may take from its start to its commit, progress
                or not (default: no such bound; the storage timeout's no-progress deadline
                always holds).

        Returns:
            Whether the save started.

        Raises:
            ValueError: a bad step, or a meta the backend cannot carry.
            jax.errors.JaxRuntimeError: a slice was lost while the state was read.
        """
        _check_step(step)
        encoded = meta_json(meta, "checkpoint")
        self._nbytes = storage.state_bytes(state)
        self.wait_or_abandon(bound)
        if step in self.abandoned:
            logger.warning("checkpoint of step %d skipped: an earlier save of that step was abandoned", step)
            return False
        started = time.monotonic()
        counters = progress.METER.counters()

        def start() -> bool:
            latest = self.backend.latest_step() if not self.abandoned else self._newest(self.backend.committed_steps())
            if latest is not None and step <= latest:
                logger.info("checkpoint of step %d skipped: step %d is already committed", step, latest)
                return False
            self.backend.save(int(step), state, encoded, force)
            return True

        try:
            began = self._call("save", step, start, bound)
        except MetaError:
            raise  # a meta the backend cannot carry: the caller's bug, not the storage's
        except (StorageError, OSError, ValueError) as error:
            self._abandon(step, error, started)
            return False
        if began:
            self._inflight = _InFlight(int(step), started, self._nbytes, bound, counters)
            self.saving_since = started
        return began

    def wait_or_abandon(self, bound: float | None = None) -> StorageError | None:
        """Wait for the save in flight to commit, for as long as its writes keep progressing.

        It is abandoned when the storage made no progress for the storage timeout
        (:meth:`bound`) since its start or its last progress, or when ``bound`` (or the time
        its save was given) passed.

        Args:
            bound: the most seconds to wait now, progress or not (default: no such bound).

        Returns:
            ``None`` when it committed (or none was in flight), else the
            :class:`~elastic_dew.elastic.state.storage.StorageError` of the save it abandoned
            (also kept for :meth:`failures`).

        Raises:
            jax.errors.JaxRuntimeError: a slice was lost while the save was written (the
                retry's to handle).
        """
        inflight = self._inflight
        if inflight is None:
            return None
        limit = bound
        if inflight.total is not None:
            left = inflight.started + inflight.total - time.monotonic()
            limit = left if limit is None else min(limit, left)
        try:
            self._call("commit", inflight.step, self.backend.wait,
                       None if limit is None else max(limit, 0.01), since=inflight.started)
        except StorageTimeout as error:
            return self._abandon(inflight.step, self._commit_timeout(inflight, error), inflight.started)
        except Exception as error:  # noqa: BLE001 - every failure of a write abandons it
            if _is_slice_loss(error):
                self._inflight = self.saving_since = None
                raise
            return self._abandon(inflight.step, error, inflight.started)
        self._committed(inflight)
        return None

    def _commit_timeout(self, inflight: _InFlight, error: StorageTimeout | None) -> StorageTimeout:
        """The timeout of ``inflight``'s commit: no progress for the storage timeout (``error``
        ``None`` or idle), or the time it was given passed."""
        bound = self.bound() if error is None or error.idle else error.bound
        return storage.timed_out(
            f"checkpoint save of step {inflight.step} in {self.directory}", operation="commit",
            storage=self.directory, step=inflight.step, bound=bound,
            waited=time.monotonic() - inflight.started, idle=error is None or error.idle, verb="commit")

    def poll(self, wait: float = 0.0) -> StorageError | None:
        """Commit the save in flight if it finished, abandon it if it failed or the storage
        made no progress for the storage timeout (or its given time passed); never waits
        longer than ``wait`` seconds for it to end, and abandons nothing for that wait.

        Args:
            wait: the most seconds to wait for the save in flight to end (default: none).

        Returns:
            The failure of an abandoned save, or ``None``.
        """
        deadline = time.monotonic() + wait
        while self._inflight is not None and self.backend.saving() and time.monotonic() < deadline:
            time.sleep(0.005)
        inflight = self._inflight
        if inflight is None:
            return None
        if self.backend.saving():
            now = time.monotonic()
            idle = progress.METER.idle(inflight.started) >= self.bound()
            over = inflight.total is not None and now - inflight.started >= inflight.total
            if not idle and not over:
                return None
            error = None if idle else StorageTimeout("", operation="commit", storage=self.directory,
                                                     step=inflight.step, bound=inflight.total, idle=False)
            timeout = self._commit_timeout(inflight, error)
            self._stalled_until = now + (timeout.bound or 0.0)
            return self._abandon(inflight.step, timeout, inflight.started)
        return self.wait_or_abandon()

    def wait(self, bound: float | None = None) -> None:
        """Block until the last save is committed.

        Args:
            bound: the most seconds to wait, progress or not (default: as long as it progresses).

        Raises:
            StorageError: the save was abandoned: it failed, or did not commit within
                ``bound`` or its own bound (:class:`~elastic_dew.elastic.state.storage.StorageTimeout`).
        """
        failure = self.wait_or_abandon(bound)
        if failure is not None:
            raise failure

    def failures(self) -> list[StorageError]:
        """Hand over the saves abandoned since the last call, and forget them.

        Returns:
            Their :class:`~elastic_dew.elastic.state.storage.StorageError`, oldest first.
        """
        out, self._failures = self._failures, []
        return out

    def committed_saves(self) -> list[Committed]:
        """Hand over the saves committed since the last call, and forget them.

        Returns:
            Each one's :class:`Committed`, oldest first.
        """
        out, self._committed_saves = self._committed_saves, []
        return out

    @property
    def saving(self) -> int | None:
        """The step of the save in flight, or ``None``."""
        return None if self._inflight is None else self._inflight.step

    def _committed(self, inflight: _InFlight) -> None:
        self._inflight = None
        self.saving_since = None
        self.commits += 1
        self._known = inflight.step if self._known is None else max(self._known, inflight.step)
        seconds = time.monotonic() - inflight.started
        self.bandwidth.add(inflight.nbytes, seconds)
        self.commit_seconds.append(seconds)
        moved = progress.METER.counters() - inflight.counters
        self._committed_saves.append(Committed(inflight.step, seconds, moved.retries, moved.nbytes))
        logger.info("checkpoint of step %d committed in %.1f s (%d retries, %d bytes moved meanwhile)",
                    inflight.step, seconds, moved.retries, moved.nbytes)

    def _abandon(self, step: int, error: BaseException, started: float) -> StorageError:
        """Give up on ``step``'s save: fence it, forget the backend's manager, keep the failure."""
        self._inflight = None
        self.saving_since = None
        waited = time.monotonic() - started
        if isinstance(error, StorageError):
            failure = error
            failure.waited = max(failure.waited, waited)
        elif storage.client_timeout(error):
            # A client's own per-request bound ended a request that got no answer: the
            # storage stalled, and the save's other writes may still be held (and land later).
            failure = StorageTimeout(
                f"checkpoint save of step {step} in {self.directory} got no answer within the storage "
                f"client's own per-request bound ({type(error).__name__}: {storage.short(error)}): "
                "the storage is not answering",
                operation="commit", storage=self.directory, step=step, bound=self.bound(), waited=waited,
            )
        else:
            failure = StorageError.of("save", self.directory, step, error, waited)
        if not isinstance(failure, StorageTimeout):
            # The write failed and ended: nothing of it is still running to commit it later.
            self._abandon_manager(close=True)
            logger.warning("checkpoint save of step %d failed after %.1f s: %s", step, waited, failure)
            self._failures.append(failure)
            return failure
        self.abandoned.add(int(step))
        storage.abandoned_write()
        if self.record_dir is not None:
            try:
                orbax_step.record_abandoned(self.record_dir, step)
            except OSError as record_error:
                logger.error("could not record abandoned checkpoint step %d in %s: %s", step, self.record_dir, record_error)
        self._abandon_manager()
        logger.warning("checkpoint save of step %d abandoned after %.1f s: %s", step, waited, failure)
        self._failures.append(failure)
        return failure

    def _abandon_manager(self, close: bool = False) -> None:
        try:
            if close:
                self._call("close", None, lambda: self.backend.abandon(close=True))
            else:
                self.backend.abandon()
        except Exception:  # noqa: BLE001 - a fresh manager is built on the next call all the same
            logger.exception("abandoning the checkpoint manager of the abandoned save failed")

    # -- listings and restores ----------------------------------------------------------
    def _newest(self, steps: list[int]) -> int | None:
        kept = [step for step in steps if step not in self.abandoned]
        newest = kept[-1] if kept else None
        if newest is not None:
            self._known = newest if self._known is None else max(self._known, newest)
        return newest

    def latest_step(self, bound: float | None = None) -> int | None:
        """The newest committed step; saves still in flight and abandoned steps do not count.

        Args:
            bound: the most seconds the listing may take, progress or not (default: as long
                as it progresses).

        Returns:
            The step, or ``None``.

        Raises:
            StorageTimeout: the listing did not finish within ``bound``.
        """
        if not self.abandoned and self.kind == "multi_tier":
            return self._call("listing", None, self.backend.latest_step, bound)
        return self._newest(self._call("listing", None, self.backend.committed_steps, bound))

    def newest_known(self) -> int | None:
        """The newest committed step, without asking a storage that just stalled.

        Returns:
            The step last seen committed when :attr:`stalled`; otherwise
            :meth:`latest_step` (the step last seen if that fails too); ``None`` for none.
        """
        if self.stalled:
            return self._known
        try:
            return self.latest_step()
        except Exception:  # noqa: BLE001 - for messages: what was last seen
            return self._known

    def restore(self, step: int, abstract_state: Any, bound: float | None = None) -> tuple[Any, dict]:
        """Return ``(state, meta)`` of committed ``step``, on ``abstract_state``'s shardings.

        Args:
            step: a committed step.
            abstract_state: the state's shapes and target shardings.
            bound: the most seconds the restore may take, progress or not (default: as
                long as it progresses; the no-progress deadline is :meth:`bound` of the
                state's bytes).

        Returns:
            The state and its meta.

        Raises:
            ValueError: ``step`` is not committed (naming the newest that is) or was
                abandoned; a :class:`DamagedCheckpoint` when a committed step cannot be read
                (saying what to do).
            StorageTimeout: the restore did not finish within ``bound``.
        """
        _check_step(step)
        if step in self.abandoned:
            raise ValueError(f"checkpoint step {step} in {self.directory} was abandoned while it was saved; it is never restored")
        self._nbytes = storage.state_bytes(abstract_state)
        started = time.monotonic()
        restored = self._call("restore", int(step), lambda: self.backend.restore(int(step), abstract_state), bound)
        self.bandwidth.add(self._nbytes, time.monotonic() - started)
        return restored

    def quarantine(self, step: int) -> str:
        """Move damaged committed ``step`` aside (renamed, never deleted).

        Args:
            step: the committed step that cannot be read.

        Returns:
            Where it went (``<step>.damaged``).

        Raises:
            NotImplementedError: the backend never moves a step (``multi_tier``).
            StorageTimeout: the rename did not finish within the storage timeout.
        """
        return self._call("quarantine", int(step), lambda: self.backend.quarantine(int(step)))

    def precompile_saves(self, state: Any) -> None:
        """Precompile the first save of ``state``'s layout while training goes on.

        For ``orbax``: compile, in a background thread, the per-device slicing Orbax's
        replica-parallel save compiles on its first save of a layout, for the leaves large
        enough to be saved replica-parallel (``orbax_private.REPLICA_PARALLEL_MIN_SLICE_BYTES``;
        smaller ones are written whole by one replica and compile nothing); a save stops
        it and compiles what it had not reached. The protocol calls this after every
        resume and scale-up. Nothing for ``multi_tier``.

        Args:
            state: the state the loop will save (its layout is what is compiled).
        """
        self.backend.precompile_saves(state)

    def saves_precompiled(self, timeout: float | None = None) -> bool:
        """Wait for :meth:`precompile_saves`'s background work.

        Args:
            timeout: the most seconds to wait; ``None`` waits until it is done.

        Returns:
            Whether it is done (``True`` when none was started).
        """
        return self.backend.saves_precompiled(timeout)

    def stop_precompiling(self) -> None:
        """Stop :meth:`precompile_saves`'s background work and wait for it to end.

        A run calls this when it ends, however it ends: a compile still running in XLA when
        the interpreter exits aborts the process (``FATAL: exception not rethrown``).
        """
        self.backend.stop_precompiling()

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
        self.backend.on_active_slices_changed(list(devices), mesh)

    def on_slice_lost(self) -> None:
        """A slice was lost: forget anything bound to the old devices, without calling it."""
        self.backend.on_slice_lost()

    def close(self) -> None:
        """Wait for the last save (within its bound) and release the backend; a save
        abandoned here is in :meth:`failures`, and a backend that does not close within the
        bound is left to its threads."""
        if self.stalled:  # the storage just stalled: do not wait on it a second time
            if self._inflight is not None:
                self._abandon(self._inflight.step, StorageTimeout(
                    f"checkpoint save of step {self._inflight.step} in {self.directory} was still being "
                    "written as the run ended, after the storage stalled",
                    operation="commit", storage=self.directory, step=self._inflight.step,
                ), self._inflight.started)
            return
        self.wait_or_abandon()
        self._call("close", None, self.backend.close)


def _is_slice_loss(error: BaseException) -> bool:
    """Whether ``error`` is a lost slice's (the retry's to handle), not the storage's."""
    import jax

    return isinstance(error, jax.errors.JaxRuntimeError)
