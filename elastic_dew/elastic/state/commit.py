"""Tier 2's save in flight and its commit, each storage call under its timeout.

:class:`Commits` is the half of :class:`~elastic_dew.elastic.state.checkpoints.Checkpoints`
that follows a save written in the background: it runs every storage call under the
storage timeout (:meth:`Commits.storage_timeout`, :func:`~elastic_dew.elastic.state.storage.bounded`),
commits the save in flight when it ends (:meth:`Commits.wait_or_abandon`, :meth:`Commits.poll`),
and abandons it when it fails or passes its timeout: a save that passed its timeout is *fenced*
(its step added to the record of abandoned steps, kept in the run directory and in memory),
Orbax's manager is forgotten without being waited for, and the failure is kept for
:meth:`Commits.failures`. ``Checkpoints`` starts the saves, lists, restores and quarantines.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from collections import deque
from typing import Any, NamedTuple

from elastic_dew.elastic.state import orbax_step, activity, storage
from elastic_dew.elastic.state.storage import StorageError, StorageTimeout

__all__ = ["Commits", "Committed"]

logger = logging.getLogger(__name__)


class _InFlight(NamedTuple):
    """A save written in the background: its step, when it started, its bytes, the most
    seconds it was given from its start, active or not (``None``: no such timeout, only the
    storage timeout's no-activity deadline), and the storage clients' counts at its start."""

    step: int
    started: float
    nbytes: int
    total: float | None = None
    counters: activity.Counters = activity.Counters(0, 0, 0)


class Committed(NamedTuple):
    """A save that committed: its step, its seconds from start to commit, and the retries
    and bytes the storage clients saw meanwhile (process-wide)."""

    step: int
    seconds: float
    retries: int
    nbytes: int


class Commits(abc.ABC):
    """The save in flight in ``directory`` and its commit, every storage call bounded.

    Args:
        directory: the directory or ``gs://`` path.
        timeout: the storage timeout in seconds (``None``: automatic, see :meth:`storage_timeout`).
        record_dir: the run directory that keeps the record of abandoned steps, or ``None``.
    """

    def __init__(self, directory: str, timeout: float | None, record_dir: str | os.PathLike[str] | None) -> None:
        self.directory = str(directory)
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
        #: Whether a listing answered (:meth:`~elastic_dew.elastic.state.checkpoints.Checkpoints.newest_known`).
        self._listed = False
        self._stalled_until = 0.0
        #: Saves committed by this object.
        self.commits = 0

    def storage_timeout(self, nbytes: int | None = None) -> float:
        """Seconds the storage may go without activity (no request answered, no byte moved)
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
        """``call()`` under the storage timeout's no-activity deadline (:func:`storage.bounded`),
        and within ``total`` seconds when given."""
        try:
            return storage.bounded(operation, self.directory, step, self.storage_timeout(), call, total=total,
                                   since=since)
        except StorageTimeout as error:
            self._stalled_until = time.monotonic() + (error.timeout or 0.0)
            raise

    @property
    def stalled(self) -> bool:
        """Whether a call to this storage passed its timeout less than a timeout ago: listings
        then answer from memory (:meth:`newest_known`) instead of asking it again."""
        return time.monotonic() < self._stalled_until

    # -- Orbax's manager, the subclass's: its save written, waited for, forgotten ----------------
    @abc.abstractmethod
    def _writing(self) -> bool:
        """Whether Orbax's manager is still writing a save (without waiting)."""

    @abc.abstractmethod
    def _wait(self) -> None:
        """Wait for Orbax's manager's save and raise its error, if it failed."""

    @abc.abstractmethod
    def _abandon_manager(self, close: bool = False) -> None:
        """Forget Orbax's manager of a save given up on without waiting for it (closing it
        first when ``close``: the save failed and its writers ended); never raises."""

    def _begin(self, step: int, started: float, total: float | None, counters: activity.Counters) -> None:
        """The save of ``step`` started at ``started`` is in flight (``total``: the most seconds it was given)."""
        self._inflight = _InFlight(step, started, self._nbytes, total, counters)
        self.saving_since = started

    def _end(self) -> None:
        """No save is in flight any more."""
        self._inflight = self.saving_since = None

    def wait_or_abandon(self, timeout: float | None = None) -> StorageError | None:
        """Wait for the save in flight to commit, for as long as its writes stay active.

        It is abandoned when the storage had no activity for the storage timeout
        (:meth:`storage_timeout`) since its start or its last activity, or when ``timeout`` (or the time
        its save was given) passed.

        Args:
            timeout: the most seconds to wait now, active or not (default: no such timeout).

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
        limit = timeout
        if inflight.total is not None:
            left = inflight.started + inflight.total - time.monotonic()
            limit = left if limit is None else min(limit, left)
        try:
            self._call("commit", inflight.step, self._wait,
                       None if limit is None else max(limit, 0.01), since=inflight.started)
        except StorageTimeout as error:
            return self._abandon(inflight.step, self._commit_timeout(inflight, error), inflight.started)
        except Exception as error:  # noqa: BLE001 - every failure of a write abandons it
            if _is_slice_loss(error):
                self._end()
                raise
            return self._abandon(inflight.step, error, inflight.started)
        self._committed(inflight)
        return None

    def _commit_timeout(self, inflight: _InFlight, error: StorageTimeout | None) -> StorageTimeout:
        """The timeout of ``inflight``'s commit: no activity for the storage timeout (``error``
        ``None`` or idle), or the time it was given passed."""
        timeout = self.storage_timeout() if error is None or error.idle else error.timeout
        return storage.timed_out(
            f"checkpoint save of step {inflight.step} in {self.directory}", operation="commit",
            storage=self.directory, step=inflight.step, timeout=timeout,
            waited=time.monotonic() - inflight.started, idle=error is None or error.idle, verb="commit")

    def poll(self, wait: float = 0.0) -> StorageError | None:
        """Commit the save in flight if it finished, abandon it if it failed or the storage
        had no activity for the storage timeout (or its given time passed); never waits
        longer than ``wait`` seconds for it to end, and abandons nothing for that wait.

        Args:
            wait: the most seconds to wait for the save in flight to end (default: none).

        Returns:
            The failure of an abandoned save, or ``None``.
        """
        deadline = time.monotonic() + wait
        while self._inflight is not None and self._writing() and time.monotonic() < deadline:
            time.sleep(0.005)
        inflight = self._inflight
        if inflight is None:
            return None
        if self._writing():
            now = time.monotonic()
            idle = activity.METER.idle(inflight.started) >= self.storage_timeout()
            over = inflight.total is not None and now - inflight.started >= inflight.total
            if not idle and not over:
                return None
            error = None if idle else StorageTimeout("", operation="commit", storage=self.directory,
                                                     step=inflight.step, timeout=inflight.total, idle=False)
            given_up = self._commit_timeout(inflight, error)
            self._stalled_until = now + (given_up.timeout or 0.0)
            return self._abandon(inflight.step, given_up, inflight.started)
        return self.wait_or_abandon()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the last save is committed.

        Args:
            timeout: the most seconds to wait, active or not (default: as long as it is active).

        Raises:
            StorageError: the save was abandoned: it failed, or did not commit within
                ``timeout`` or its own timeout (:class:`~elastic_dew.elastic.state.storage.StorageTimeout`).
        """
        failure = self.wait_or_abandon(timeout)
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
        self._end()
        self.commits += 1
        self._known = inflight.step if self._known is None else max(self._known, inflight.step)
        seconds = time.monotonic() - inflight.started
        self.bandwidth.add(inflight.nbytes, seconds)
        self.commit_seconds.append(seconds)
        moved = activity.METER.counters() - inflight.counters
        self._committed_saves.append(Committed(inflight.step, seconds, moved.retries, moved.nbytes))
        logger.info("checkpoint of step %d committed in %.1f s (%d retries, %d bytes moved meanwhile)",
                    inflight.step, seconds, moved.retries, moved.nbytes)

    def _abandon(self, step: int, error: BaseException, started: float) -> StorageError:
        """Give up on ``step``'s save: fence it, forget Orbax's manager, keep the failure."""
        self._end()
        waited = time.monotonic() - started
        if isinstance(error, StorageError):
            failure = error
            failure.waited = max(failure.waited, waited)
        elif storage.client_timeout(error):
            # A client's own per-request timeout ended a request that got no answer: the
            # storage stalled, and the save's other writes may still be held (and land later).
            failure = StorageTimeout(
                f"checkpoint save of step {step} in {self.directory} got no answer within the storage "
                f"client's own per-request timeout ({type(error).__name__}: {storage.short(error)}): "
                "the storage is not answering",
                operation="commit", storage=self.directory, step=step, timeout=self.storage_timeout(), waited=waited,
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


def _is_slice_loss(error: BaseException) -> bool:
    """Whether ``error`` is a lost slice's (the retry's to handle), not the storage's."""
    import jax

    return isinstance(error, jax.errors.JaxRuntimeError)
