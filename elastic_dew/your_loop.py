"""Pieces a pathwaysutils loop of your own calls, each alone, with your own objects.

A loop written as pathwaysutils' resilience guide shows it (one ``Manager``, one Orbax
``Snapshotter``, ``elastic_retry`` around the training, Grain's ``ElasticIterator``) takes
these pieces one at a time; none of them owns the loop:

* :func:`install_health_checker`: every pathwaysutils ``Manager`` of the process checks its
  slices with :class:`~elastic_dew.elastic.slices.health.ReusableSliceHealthChecker` (each
  slice's probe compiled once, all dispatched before any is awaited, a probe that does not
  answer counts its slice down);
* :class:`~elastic_dew.elastic.deadline.StepDeadline`: a read of a step's result that does
  not finish becomes the slice-down error ``elastic_retry`` handles;
* :func:`save_checkpoint`, :func:`wait_for_checkpoint`, :func:`restore_checkpoint` and
  :func:`save_at_preemption` on your own Orbax ``CheckpointManager``: every wait on the
  storage (the save before, the commit, the listing) under the storage timeout's
  no-activity deadline (:func:`~elastic_dew.elastic.state.storage.bounded`), each commit
  returned as a :class:`~elastic_dew.elastic.events.Commit` event, the save at a preemption
  bounded by what is left of the grace window, and the data position
  (``ElasticIterator.get_state()``) saved and restored with the state. Orbax's own
  synchronous parts (a save's start: copying the arrays off the devices; a restore) run on
  your thread, as your program's own calls, so ``elastic-dew simulate`` sees them as yours.

The mesh over the active slices with your axes is
:func:`~elastic_dew.elastic.slices.mesh.build_mesh`; the preemption notice is
:class:`~elastic_dew.runtime.PreemptionNotice`. A storage call given up on keeps running in
a thread of its own (neither Orbax nor the storage clients can cancel one): after a
:class:`~elastic_dew.elastic.state.storage.StorageTimeout`, make a new ``CheckpointManager``
before the next save.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from elastic_dew.elastic.events import Commit, Sink
from elastic_dew.elastic.slices import health
from elastic_dew.elastic.state import activity, storage

__all__ = [
    "install_health_checker",
    "save_checkpoint",
    "wait_for_checkpoint",
    "restore_checkpoint",
    "save_at_preemption",
]

logger = logging.getLogger(__name__)

_STATE, _DATA = "state", "data"


def install_health_checker(probe_timeout: float | None = None) -> None:
    """Make every pathwaysutils ``Manager`` of this process, made before or after, check its
    slices with :class:`~elastic_dew.elastic.slices.health.ReusableSliceHealthChecker`: at
    its creation, in its monitor thread and in ``elastic_retry``'s wait for slices.

    Idempotent and process-wide (pathwaysutils' own health checks are process-wide too).

    Args:
        probe_timeout: seconds a slice's probe may go unanswered before the slice counts as
            down (a hung slice; ``None``: 30). pathwaysutils' own probe waits for ever.

    Raises:
        ValueError: ``probe_timeout`` is not above 0.
    """
    health.install(probe_timeout)


def _directory(manager: Any) -> str:
    return str(getattr(manager, "directory", "checkpoints"))


def _timeout(timeout: float | None, state: Any) -> float:
    return float(timeout) if timeout is not None else storage.automatic_timeout(storage.state_bytes(state))


def _args(state: Any, data: dict | None) -> Any:
    import orbax.checkpoint as ocp

    return ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state), _DATA: ocp.args.JsonSave(dict(data or {}))})


def save_checkpoint(manager: Any, step: int, state: Any, *, data: dict | None = None, force: bool = False,
                    timeout: float | None = None, total: float | None = None) -> bool:
    """Start saving ``state`` (and the data position ``data``) as ``step`` with your Orbax
    ``CheckpointManager``, once its save before has committed within the storage timeout's
    no-activity deadline.

    The save is asynchronous as Orbax makes it; :func:`wait_for_checkpoint` commits it.

    Args:
        manager: your ``orbax.checkpoint.CheckpointManager``.
        step: the step whose state this is.
        state: the training state (a pytree of arrays).
        data: the data position, ``ElasticIterator.get_state()`` (restored by
            :func:`restore_checkpoint`), or ``None``.
        force: save even where the manager's own interval would skip the step.
        timeout: seconds the storage may show no activity (default: automatic from the
            state's bytes, never under a few minutes).
        total: the most seconds the wait for the save before may take, activity or not
            (default: none).

    Returns:
        Whether the manager started a save (``CheckpointManager.save``'s answer).

    Raises:
        StorageTimeout: no activity for ``timeout`` seconds, or ``total`` passed.
        jax.errors.JaxRuntimeError: a slice was lost while the state was read.
    """
    wait_for_checkpoint(manager, timeout=_timeout(timeout, state), total=total)  # the save before, committed
    return bool(manager.save(step, args=_args(state, data), force=force))


def wait_for_checkpoint(manager: Any, *, timeout: float | None = None, total: float | None = None,
                        sink: Sink | None = None) -> Commit | None:
    """Wait for your ``CheckpointManager``'s save in flight to commit, under the storage
    timeout's no-activity deadline; return its :class:`~elastic_dew.elastic.events.Commit`.

    Args:
        manager: your ``orbax.checkpoint.CheckpointManager``.
        timeout: seconds the storage may show no activity (default: automatic, from the
            manager's newest step being unknown: a few minutes).
        total: the most seconds the wait may take, activity or not (default: none).
        sink: also given the commit event (a run's event sink), or ``None``.

    Returns:
        The commit of the newest step (its seconds: of this wait), or ``None`` when the
        manager has no committed step.

    Raises:
        StorageTimeout: no activity for ``timeout`` seconds, or ``total`` passed.
    """
    started, before = time.monotonic(), activity.METER.counters()
    idle = float(timeout) if timeout is not None else storage.FLOOR_SECONDS
    directory = _directory(manager)
    storage.bounded("commit", directory, None, idle, manager.wait_until_finished, total=total)
    step = manager.latest_step()
    if step is None:
        return None
    moved = activity.METER.counters() - before
    event = Commit(step=int(step), storage=directory, seconds=round(time.monotonic() - started, 3),
                   retries=moved.retries, nbytes=moved.nbytes)
    if sink is not None:
        sink(event)
    return event


def restore_checkpoint(manager: Any, abstract_state: Any, *, step: int | None = None,
                       timeout: float | None = None) -> tuple[Any, dict | None, int] | None:
    """The newest committed checkpoint (or ``step``'s) of your ``CheckpointManager``, as
    :func:`save_checkpoint` wrote it; the listing under the storage timeout's no-activity
    deadline.

    Args:
        manager: your ``orbax.checkpoint.CheckpointManager``.
        abstract_state: the state's ``jax.ShapeDtypeStruct`` leaves with their target
            shardings (the attempt's mesh).
        step: the step to restore (default: the newest).
        timeout: seconds the listing may show no activity (default: automatic from the
            state's bytes).

    Returns:
        ``(state, data position or None, step)``, or ``None`` when there is no checkpoint.

    Raises:
        StorageTimeout: the listing showed no activity for ``timeout`` seconds.
    """
    import orbax.checkpoint as ocp

    directory = _directory(manager)
    idle = _timeout(timeout, abstract_state)
    if step is None:
        step = storage.bounded("listing", directory, None, idle, manager.latest_step)
    if step is None:
        return None
    args = ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(abstract_state), _DATA: ocp.args.JsonRestore()})
    restored = manager.restore(step, args=args)
    return restored[_STATE], (dict(restored[_DATA]) or None), int(step)


def save_at_preemption(manager: Any, step: int, state: Any, *, data: dict | None = None,
                       received: float | None = None, grace: float | None = None,
                       timeout: float | None = None, sink: Sink | None = None) -> bool:
    """Save ``step`` at a preemption and wait for its commit, both within what is left of
    the grace window (then exit with :data:`~elastic_dew.runtime.PREEMPTED_EXIT`, 143).

    The window is ``grace`` seconds, else the pod's (``ELASTIC_DEW_GRACE_PERIOD``, which
    ``elastic-dew k8s render`` sets), else 30 s, from ``received`` (the notice's
    ``PreemptionNotice.received``; now when ``None``), less a margin for the exit.

    Args:
        manager: your ``orbax.checkpoint.CheckpointManager``.
        step: the step just completed.
        state: its training state.
        data: the data position, ``ElasticIterator.get_state()``, or ``None``.
        received: when the notice arrived (a ``time.monotonic()``), or ``None``.
        grace: the grace window in seconds (default: the pod's, else 30).
        timeout: seconds the storage may show no activity (default: automatic).
        sink: also given the commit event, or ``None``.

    Returns:
        Whether the checkpoint of ``step`` committed inside the window (else the newest
        committed one is what a restart resumes from).
    """
    window = storage.stop_timeout(storage.grace_seconds(grace), received, timeout)
    started = time.monotonic()
    try:
        save_checkpoint(manager, step, state, data=data, force=True, timeout=timeout, total=window)
        left = max(0.1, window - (time.monotonic() - started))
        commit = wait_for_checkpoint(manager, timeout=timeout, total=left, sink=sink)
    except storage.StorageError as error:
        logger.error("the preemption's checkpoint of step %d did not commit within the grace window: %s",
                     step, error)
        return False
    committed = commit is not None and commit.step == step
    if committed:
        logger.warning("preempted: checkpoint of step %d committed in %.1f s", step, time.monotonic() - started)
    return committed
