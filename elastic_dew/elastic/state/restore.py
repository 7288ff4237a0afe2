"""Restoring the newest complete state across the two tiers.

:func:`restore` waits for a checkpoint still being written, asks :func:`~elastic_dew.elastic.state.newest`
which tier holds the newest complete state, and loads it onto the target shardings: a
snapshot from a replica on the surviving slices (tier 1), else the newest committed
checkpoint (tier 2), moving a damaged one aside and trying the previous one. It returns a
:class:`Restored`, or ``None`` for a fresh start. Each load announces its phase
(:mod:`~elastic_dew.elastic.hooks`) first, so the simulator can fire a fault inside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from elastic_dew.elastic import hooks
from elastic_dew.elastic.events import Event, Storage
from elastic_dew.elastic.state import newest
from elastic_dew.elastic.state.checkpoints import Checkpoints
from elastic_dew.elastic.state.orbax_backend import DamagedCheckpoint
from elastic_dew.elastic.state.snapshots import Snapshots

__all__ = ["Restored", "restore"]

logger = logging.getLogger(__name__)


class Restored(NamedTuple):
    """A restored state: its ``source`` tier (``"snapshot"`` or ``"checkpoint"``), its ``step``
    (the last completed one), the ``state`` on the target shardings and the ``meta`` saved
    beside it. It unpacks as ``source, step, state, meta``."""

    source: str
    step: int
    state: Any
    meta: dict


def restore(
    snapshots: Snapshots | None,
    checkpoints: Checkpoints | None,
    abstract: Any,
    *,
    quarantine: bool = True,
    emit: Callable[[Event], None] = lambda event: None,
) -> Restored | None:
    """The newest complete state across the tiers on ``abstract``'s shardings, or ``None``
    when neither tier holds one (a fresh start).

    A checkpoint still being written when the attempt ended is waited for first: its state
    is already on the host, and once committed it may be the newest one. A committed
    checkpoint that cannot be read is, with ``quarantine``, moved aside (a ``storage`` event
    to ``emit``) and the previous committed one restored.

    Args:
        snapshots: tier 1, or ``None``.
        checkpoints: tier 2, or ``None``.
        abstract: the state's shapes and target shardings.
        quarantine: whether a damaged committed checkpoint is moved aside.
        emit: takes the ``storage`` event of a quarantined checkpoint.

    Returns:
        The :class:`Restored` state, or ``None``.

    Raises:
        RuntimeError: from tier 1's load (no replica survived).
        ValueError: from either tier's restore (a state of another layout; an unreadable
            checkpoint when ``quarantine`` is off, a
            :class:`~elastic_dew.elastic.state.orbax_backend.DamagedCheckpoint`).
        StorageTimeout: a restore or listing past the storage timeout, never tried again here.
    """
    if checkpoints is not None:
        try:
            checkpoints.wait()
        except Exception as error:  # noqa: BLE001 - cut short by the fault: not committed
            logger.warning("the checkpoint in flight when the attempt ended did not commit: %s", error)
    source, saved = newest(snapshots, checkpoints)
    if source == "snapshot" and snapshots is not None and saved is not None:
        hooks.phase("snapshot_load", saved + 1)
        try:
            state, meta, step = snapshots.load(abstract)
            return Restored("snapshot", step, state, meta)
        except jax.errors.JaxRuntimeError:
            raise  # a slice lost during the load: the next attempt retries it
        except RuntimeError as error:  # every replica was on a lost slice
            logger.warning("no snapshot replica survived (%s); trying the checkpoint", error)
            saved = checkpoints.latest_step() if checkpoints is not None else None
            source = "checkpoint" if saved is not None else "fresh"
    while source == "checkpoint" and checkpoints is not None and saved is not None:
        hooks.phase("checkpoint_restore", saved + 1)
        try:
            state, meta = checkpoints.restore(saved, abstract)
        except DamagedCheckpoint as error:
            if not quarantine:
                raise
            try:
                moved = checkpoints.quarantine(saved)
            except NotImplementedError:
                raise error from None
            logger.error("checkpoint step %d cannot be read; moved aside to %s: %s", saved, moved, error)
            emit(Storage(operation="restore", outcome="quarantined", step=saved,
                         storage=checkpoints.directory, waited=0.0, error=str(error), moved_to=moved))
            source, saved = newest(snapshots, checkpoints)
            continue
        return Restored("checkpoint", saved, state, meta)
    if source == "snapshot" and snapshots is not None:  # a snapshot newer than what is left after a quarantine
        state, meta, step = snapshots.load(abstract)
        return Restored("snapshot", step, state, meta)
    return None
