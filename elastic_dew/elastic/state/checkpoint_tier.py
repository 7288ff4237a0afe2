"""Tier 2's half of :class:`~elastic_dew.elastic.state.tiers.Tiers`: the checkpoint cadence,
the final and preemption saves, and when failing saves stop the run (:class:`SavesFailing`).

:class:`CheckpointSaves` starts a checkpoint every ``checkpoint_every`` steps without holding
training for a commit still in flight (at most :data:`PATIENCE`; one due meanwhile is
queued), commits the final checkpoint of a finished run and the checkpoint of the step a
preemption agreed on, and emits each save, commit and abandoned save as an event. ``Tiers``
is a ``CheckpointSaves`` with tier 1 beside it. :func:`timed_save` times every save of both
tiers, after the wait for the step in flight (what a save's seconds are:
:mod:`~elastic_dew.elastic.state.tiers`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jax

from elastic_dew.elastic import hooks
from elastic_dew.elastic.events import Commit, Event, Save, Storage
from elastic_dew.elastic.state.checkpoints import Checkpoints
from elastic_dew.elastic.state.storage import StorageError, permanent

__all__ = ["CheckpointSaves", "SavesFailing", "PATIENCE", "StepWait", "timed_save"]

logger = logging.getLogger(__name__)

_NAME = "checkpoint"

#: Waits for the step in flight (the protocol's, bounded by its step deadline).
StepWait = Callable[[], Any]


def timed_save(tier: str, step: int, save: Callable[[], bool], wait_step: StepWait | None = None) -> Save:
    """Run ``save`` (which returns whether the tier took the state) and describe it.

    ``wait_step`` (the wait for the step in flight, when one is) runs first, off the clock:
    the event's ``seconds`` are ``save``'s alone.
    """
    if wait_step is not None:
        wait_step()
    started = time.monotonic()
    taken = bool(save())
    return Save(tier=tier, step=step, taken=taken, seconds=time.monotonic() - started)


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
        timeout: its timeout.
        waited: how long it ran.
        cause: the last failure.
    """


class CheckpointSaves:
    """Tier 2: a persistent checkpoint every ``checkpoint_every`` steps, at the end, and on preemption.

    ``checkpoints`` is ``None`` when the run has no checkpoint directory: then nothing is
    ever saved. A save that fails or passes the storage timeout is abandoned by
    :class:`~elastic_dew.elastic.state.checkpoints.Checkpoints` and emitted as a
    :class:`~elastic_dew.elastic.events.Storage` event; the run goes on and the next save is
    tried at its cadence, until ``max_failures`` are abandoned in a row, or, with
    ``max_uncommitted`` seconds, until none committed for that long while saves failed, or
    at once when a save was refused for a cause saving again does not fix
    (:func:`~elastic_dew.elastic.state.storage.permanent`: a refused permission, a missing
    bucket): then :class:`SavesFailing`, naming the storage, the error, the newest committed
    step and the fix. :meth:`poll`, at every step boundary, settles a save that finished or
    passed its timeout without holding the loop.

    Args:
        checkpoints: tier 2, or ``None``.
        checkpoint_every: steps between cadence checkpoints (0: none on a cadence).
        emit: takes every save, commit and abandoned or skipped save event.
        max_failures: abandoned saves in a row that stop the run.
        max_uncommitted: seconds without a commit, while saves fail, that stop the run (``None``: no such timeout).
    """

    def __init__(
        self, checkpoints: Checkpoints | None, checkpoint_every: int, *,
        emit: Callable[[Event], None] = lambda event: None, max_failures: int = 3,
        max_uncommitted: float | None = None,
    ) -> None:
        self.checkpoints = checkpoints
        self.checkpoint_every = checkpoint_every
        self.emit = emit
        self.max_failures = max_failures
        self.max_uncommitted = max_uncommitted
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
                operation=last.operation, storage=last.storage, step=last.step, timeout=last.timeout,
                waited=last.waited, cause=last,
            )

    def poll(self) -> None:
        """At a step boundary: finish the save in flight if it finished, failed, or had no
        activity for the storage timeout; never waits."""
        if self.checkpoints is None or self.checkpoints.saving is None:
            return
        self.checkpoints.poll()
        self._note(self.checkpoints.failures())

    def _on_checkpoint_cadence(self, step: int) -> bool:
        return bool(self.checkpoint_every) and not step % self.checkpoint_every

    def checkpoint_due(self, step: int) -> bool:
        """Whether ``step`` checkpoints: on the cadence, or a queued checkpoint can start (the
        commit ahead of it ended). Never without a checkpoint directory."""
        if self.checkpoints is None:
            return False
        return self._on_checkpoint_cadence(step) or (self.queued is not None and self.checkpoints.saving is None)

    def checkpoint_on_step(self, step: int, state: Any, meta: dict, wait_step: StepWait | None = None) -> Save | None:
        """Start the checkpoint of ``step`` if it is due, waiting at most :data:`PATIENCE`
        for a commit still in flight: a slow commit never holds training. One due while
        the commit before it is still in flight after that is *queued* (its state kept, a
        ``save`` event with ``taken`` false) and started at the first step boundary after
        that commit ends; at most one waits: a newer one due meanwhile takes its place, and
        the older is skipped with a ``storage`` event naming its step and why. Returns the
        event of the save started or queued now, or ``None`` (not emitted: the caller does)."""
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
                hooks.phase(_NAME, queued_step)
                started = timed_save(_NAME, queued_step,
                                     lambda: self._start(queued_step, queued_state, queued_meta), wait_step)
                wait_step = None
        if not self._on_checkpoint_cadence(step):
            return started
        if checkpoints.saving is not None:
            if started is not None:
                return self._queue(step, state, meta, started)
            hooks.phase(_NAME, step)
            return timed_save(_NAME, step, lambda: self._start_or_queue(step, state, meta), wait_step)
        hooks.phase(_NAME, step)
        return timed_save(_NAME, step, lambda: self._start(step, state, meta), wait_step)

    def _start_or_queue(self, step: int, state: Any, meta: dict) -> bool:
        """Wait up to :data:`PATIENCE` for the commit in flight (a healthy disk's ends inside
        it), then start this save, or queue it when the commit is still in flight."""
        checkpoints = self._store()
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
        checkpoints = self._store()
        if self.queued is not None:
            self._skip(self.queued[0], f"the checkpoint of step {step} took its place in the queue behind the "
                       f"commit of step {checkpoints.saving}, still in flight after {_running(checkpoints):.1f} s")
        self.queued = (int(step), state, meta)
        logger.info("checkpoint of step %d queued behind the commit of step %d, still in flight after %.1f s",
                    step, checkpoints.saving, _running(checkpoints))
        return started

    def _store(self) -> Checkpoints:
        """Tier 2's manager, where only a tier that has one gets."""
        assert self.checkpoints is not None, "only a tier with checkpoints saves"
        return self.checkpoints

    def _start(self, step: int, state: Any, meta: dict) -> bool:
        checkpoints = self._store()
        if step in checkpoints.abandoned:
            self._skip(step, "an earlier save of this step was abandoned and is fenced (its writes may "
                       "still land), so it is never saved again")
            return False
        taken = checkpoints.save(step, state, meta)  # started: the write goes on in the background
        self._note(checkpoints.failures())
        return taken

    def _skip(self, step: int, why: str) -> None:
        """A checkpoint not taken: logged, and a ``storage`` event with its step and why."""
        logger.warning("checkpoint of step %d skipped: %s", step, why)
        checkpoints = self._store()
        self.emit(Storage(operation="save", outcome="skipped", step=int(step), storage=checkpoints.directory,
                          waited=round(_running(checkpoints), 3), error=why))

    def drop_queued(self, why: str) -> None:
        """Skip the queued checkpoint, if one waits (a newer save supersedes it, or its
        state is gone with a lost slice)."""
        if self.queued is not None:
            step, self.queued = self.queued[0], None
            self._skip(step, why)

    def save_final(self, step: int, state: Any, meta: dict) -> Save | None:
        """Commit the last step's checkpoint (unless the cadence already did); its event
        (emitted), or ``None``. A final save that is abandoned is reported like any other."""
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
            hooks.phase(_NAME, step)

            def write() -> bool:
                taken = checkpoints.save(step, state, meta, force=True)
                return taken and checkpoints.wait_or_abandon() is None

            saved = timed_save(_NAME, step, write)
        self._note(checkpoints.failures(), stopping=True)
        if saved is not None:
            self.emit(saved)
        return saved

    def save_preemption(self, step: int, state: Any, meta: dict, timeout: float | None = None) -> Save | None:
        """Write and commit the checkpoint of the step a preemption agreed on, all of it
        within ``timeout`` seconds (the grace window's share; default: no timeout but the
        storage timeout's no-activity deadline). It does not wait for a step in flight (its
        result is dropped). The commit in flight is let finish first; a queued checkpoint
        is superseded; a step this process already knows committed is not written or listed
        again; the agreed step's is taken only when what ``timeout`` leaves is at least
        the slowest of the last commits (``Checkpoints.commit_seconds``; else a
        ``storage`` event says why). The event (emitted) says in ``taken`` whether it committed.

        ``None``, with an error logged, when there is nowhere to write it.
        """
        checkpoints = self.checkpoints
        if checkpoints is None:
            logger.error("no checkpoint directory is configured: step %d is not saved", step)
            return None
        self.drop_queued(f"the preemption's checkpoint of step {step} supersedes it")
        limit = timeout
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.01, deadline - time.monotonic())

        def write() -> bool:
            checkpoints.wait_or_abandon(left())  # the commit in flight finishes first, while it is active
            if checkpoints.newest_known() == step:  # what this process knows: not listed again
                return True
            remaining, needs = left(), max(checkpoints.commit_seconds, default=None)
            if remaining is not None and needs is not None and remaining < needs:
                why = (f"{remaining:.1f} s of the grace window are left and the last commits took up to "
                       f"{needs:.1f} s; the newest committed step is {checkpoints.newest_known()}")
                logger.warning("the preemption checkpoint of step %d is not taken: %s", step, why)
                self.emit(Storage(operation="save", outcome="skipped", step=int(step), storage=checkpoints.directory,
                                  waited=0.0, error=why))
                return False
            if not checkpoints.save(step, state, meta, force=True, timeout=left()):
                return False
            return checkpoints.wait_or_abandon(left()) is None

        saved = timed_save(_NAME, step, write)
        self._note(checkpoints.failures(), stopping=True)
        self.emit(saved)
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
