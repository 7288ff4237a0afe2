"""How a run stops: a preemption at a step boundary or during a recovery, and the errors of a
run that gives up.

:class:`Stopping` holds the stop paths of one :class:`~elastic_dew.elastic.loop.protocol.ElasticRun`.
A preemption notice reached at a step boundary commits that step's checkpoint within what is
left of the grace window (:meth:`Stopping.at_step`); one that ends a recovery saves what a
readable copy still holds (:meth:`Stopping.in_recovery`). Either ends with a ``preempted``
:class:`~elastic_dew.elastic.events.Stop` and :class:`~elastic_dew.runtime.Preempted` of the
step a re-run resumes after. A run whose slices did not come back, or whose retry policy gave
up, ends with an error that says after which step and what the tiers kept
(:meth:`Stopping.timed_out`, :meth:`Stopping.gave_up`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from pathwaysutils.elastic import elastic as pw_elastic
from pathwaysutils.elastic.manager import ElasticRuntimeError

from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.events import Event, Stop
from elastic_dew.elastic.loop.program import Notice, Program, ReceivedNotice
from elastic_dew.elastic.slices.manager import SliceManager
from elastic_dew.elastic.slices.mesh import MeshSpec, build_mesh
from elastic_dew.elastic.slices.retry import SliceLossRetryLimit
from elastic_dew.elastic.state import storage
from elastic_dew.elastic.state.tiers import Tiers
from elastic_dew.runtime import Preempted

__all__ = ["Stopping"]

logger = logging.getLogger(__name__)


class Stopping:
    """The stop paths of one run.

    Args:
        program: the run's model side (a persisted snapshot is loaded on its layout).
        manager: the run's pathwaysutils ``Manager``.
        tiers: the run's state tiers.
        notice: the preemption notice, or ``None``.
        config: the run's configuration (the grace period, the timeout, the model axis).
        emit: called with each event of a stop.
        mesh_spec: the run's mesh (its axes and a slice's shape), ``None`` for the default.
    """

    def __init__(
        self, program: Program, manager: SliceManager, tiers: Tiers, notice: Notice | None,
        config: ElasticConfig, emit: Callable[[Event], None], *, mesh_spec: MeshSpec | None = None,
    ) -> None:
        self.program = program
        self.manager = manager
        self.tiers = tiers
        self.notice = notice
        self.config = config
        self.emit = emit
        self.mesh_spec = MeshSpec() if mesh_spec is None else mesh_spec
        #: A preemption stop was made: the process exits next (``Preempted`` goes up).
        self.preempted = False

    def stop_timeout(self) -> float:
        """Seconds a preemption's stop may spend on storage: what is left of the grace
        window since the notice, less a margin (:func:`~elastic_dew.elastic.state.storage.stop_timeout`)."""
        noticed = self.notice.received if isinstance(self.notice, ReceivedNotice) else None
        return storage.stop_timeout(storage.grace_seconds(self.config.grace_period), noticed)

    def at_step(self, step: int, state: Any, meta: dict) -> NoReturn:
        """Write the agreed step's checkpoint, commit it, and raise ``Preempted`` of it.

        The save starts at once: the step in flight, if any, is dropped, so nothing waits
        for its result (``state`` is the agreed step's, which that step only reads). With
        no checkpoint directory nothing outlives the process, so the stop (and
        ``Preempted``) is of step 0: the step a re-run resumes after.

        Raises:
            Preempted: always, of the step a re-run resumes after.
        """
        logger.warning("preemption notice reached at step %d; writing its checkpoint", step)
        hooks.phase("stop", step)
        timeout = self.stop_timeout()
        saved = self.tiers.save_preemption(step, state, meta, timeout=timeout)
        if saved is None:
            step = 0  # commit logged that nothing is saved
        elif not saved.taken:  # not committed inside the grace window: the newest committed is the stop
            checkpoints = self.tiers.checkpoints
            step = (checkpoints.newest_known() if checkpoints is not None else None) or 0
        self.emit(Stop(reason="preempted", step=step))
        self.preempted = True
        raise Preempted(step)

    def in_recovery(self, last_step: int) -> Preempted:
        """A preemption notice ended a recovery (the wait for slices, or a loss while the
        agreed step's checkpoint was written): save what a readable copy still holds, then
        stop as a preemption does; the :class:`Preempted` to raise.

        In order, within the grace period: the checkpoint in flight is waited for (it may
        still commit); then the newest snapshot, if newer than the newest committed
        checkpoint, is loaded from a replica on the surviving slices and committed as a
        checkpoint. The stop's step is the step the re-run resumes after: that snapshot's,
        else the newest committed checkpoint's, else 0 (nothing persisted; the re-run
        starts fresh). Steps completed past it (up to ``last_step``) are lost: the log says
        how many, and the run record counts them as wasted progress (the re-run's resume
        re-does them).
        """
        step = None
        checkpoints = self.tiers.checkpoints
        if checkpoints is not None:
            self.tiers.drop_queued("a preemption notice during a recovery stops the run first")
            deadline = time.monotonic() + self.stop_timeout()
            try:
                checkpoints.wait(max(0.01, deadline - time.monotonic()))  # one in flight may commit
            except Exception as error:  # noqa: BLE001 - cut short by the fault: not committed
                logger.warning("the checkpoint in flight did not commit: %s", error)
            try:
                newer = not checkpoints.stalled and self.tiers.newest().source == "snapshot"
            except storage.StorageError as error:
                logger.error("could not list the checkpoints while stopping: %s", error)
                newer = False
            if newer:
                try:
                    step = self._save_newest_snapshot(max(0.01, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - the grace period is short: stop all the same
                    logger.exception("could not persist the newest snapshot while stopping")
            if step is None:
                step = checkpoints.newest_known()
        if step is None:
            step = 0
        lost = last_step - step
        if lost > 0:
            logger.warning(
                "preemption notice during a recovery: stopping at step %d, the newest persisted state; "
                "steps %d..%d (%d) were not persisted and will be run again",
                step, step + 1, last_step, lost,
            )
        else:
            logger.warning("preemption notice during a recovery: stopping at step %d", step)
        self.emit(Stop(reason="preempted", step=step))
        self.preempted = True
        return Preempted(step)

    def _save_newest_snapshot(self, timeout: float | None = None) -> int | None:
        """Load the newest snapshot onto the healthy slices and commit it as a checkpoint
        within ``timeout`` seconds; its step, or ``None`` when no snapshot could be loaded or
        committed."""
        self.manager.active_slice_indices = pw_elastic.get_active_slice_indices(self.manager.slice_to_devices)
        spec = self.mesh_spec
        mesh = build_mesh(self.manager, self.config.model_axis, axes=spec.axes, slice_shape=spec.slice_shape)
        self.tiers.on_active_slices_changed(mesh)
        restored = self.tiers.restore(self.program.abstract_state(mesh))
        if restored is None or restored.source != "snapshot":
            return None
        _, step, state, meta = restored
        logger.warning("writing snapshot %d as a checkpoint before stopping", step)
        saved = self.tiers.save_preemption(step, state, meta, timeout=timeout)
        return step if saved is not None and saved.taken else None

    def timed_out(self, error: TimeoutError, last_step: int) -> TimeoutError:
        """pathwaysutils' timeout, with the run's position and what to do next."""
        wanted = self.config.minimum_slice_count or self.manager.total_slice_count
        return TimeoutError(
            f"waited timeout={self.config.timeout} s for {wanted} healthy "
            f"slice{'s' if wanted != 1 else ''} after step {last_step}, and they did not "
            f"come ({error}); {self.tiers.resume_from_text()}, or raise ElasticConfig.timeout"
        )

    def gave_up(self, error: ElasticRuntimeError, last_step: int, policy: SliceLossRetryLimit) -> ElasticRuntimeError:
        """The retry policy's end, with the run's position, what the tiers kept and what to do next."""
        return ElasticRuntimeError(
            f"gave up after step {last_step}: {policy.describe()} ({error}); "
            f"{self.tiers.resume_from_text()}, or raise ElasticConfig.max_attempts"
        )
