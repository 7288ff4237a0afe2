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
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
from jax.sharding import Mesh

from elastic_dew._deprecation import renamed_keywords, renamed_method
from elastic_dew.elastic.config import CHECKPOINT_KINDS
from elastic_dew.elastic.state.backend import Backend
from elastic_dew.elastic.state.meta import meta_json
from elastic_dew.elastic.state.multi_tier import META_CAPACITY, MultiTierBackend, MultiTierError
from elastic_dew.elastic.state.orbax_backend import OrbaxBackend

__all__ = ["Checkpoints", "KINDS", "META_CAPACITY", "MultiTierError"]

logger = logging.getLogger(__name__)

KINDS = CHECKPOINT_KINDS


def _check_step(step: int) -> None:
    if not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(
            f"checkpoint step={step!r} must be an int >= 1: the state after `step` updates "
            "(step 0 is the untrained state, and the multi-tier replicator reserves it)"
        )


class Checkpoints:
    """Persistent checkpoints of the training state and its meta (tier 2).

    ``directory`` is a local path or ``gs://`` URL (``orbax``), or the workers' local
    directory of the multi-tier volume (``multi_tier``). ``mesh`` (optional) binds a
    multi-tier setup at once; otherwise :meth:`on_active_slices_changed` does, on the first
    attempt. ``slices`` is informational (the multi-tier kind counts the replica axis of
    each mesh it is given). ``run_name`` names the multi-tier run (default: ``$JOBSET_NAME``);
    ``backup_interval_minutes`` is the replicator's backup cadence and
    ``init_timeout_seconds`` how long one initialisation may wait for it (multi-tier only).

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

    @renamed_keywords("Checkpoints", num_slices="slices")
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
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"checkpoint kind={kind!r} must be one of {', '.join(KINDS)}")
        if not directory:
            raise ValueError("checkpoint directory is empty; give a local path or a gs:// URL")
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep} must be >= 1")
        if slices is not None and slices < 1:
            raise ValueError(f"slices={slices} must be >= 1")
        self.kind = kind
        self.directory = str(directory)
        self.slices = slices
        self.backend: Backend
        if kind == "multi_tier":
            run_name = run_name or os.environ.get("JOBSET_NAME")
            if not run_name:
                raise ValueError(
                    "checkpoint kind 'multi_tier' needs a run name: pass run_name or set JOBSET_NAME"
                )
            if backup_interval_minutes < 1:
                raise ValueError(f"backup_interval_minutes={backup_interval_minutes} must be >= 1")
            if init_timeout_seconds < 1:
                raise ValueError(f"init_timeout_seconds={init_timeout_seconds} must be >= 1")
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

    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> None:
        """Start saving the state after ``step`` updates (asynchronous); ``wait`` commits it.

        A step at or below the newest committed one is skipped (logged): Orbax would
        otherwise garbage-collect the newer checkpoints in favour of the older step.

        Args:
            step: the step whose state this is.
            state: the state.
            meta: its JSON-able meta (step, data position, ...).
            force: save even where Orbax's own policy would skip the step.
        """
        _check_step(step)
        encoded = meta_json(meta, "checkpoint")
        latest = self.backend.latest_step()
        if latest is not None and step <= latest:
            logger.info("checkpoint of step %d skipped: step %d is already committed", step, latest)
            return
        self.backend.save(int(step), state, encoded, force)

    def wait(self) -> None:
        """Block until the last save is committed; raise if it failed."""
        self.backend.wait()

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

    prepare = renamed_method("Checkpoints", "prepare", precompile_saves)
    prepared = renamed_method("Checkpoints", "prepared", saves_precompiled)
    stop_preparing = renamed_method("Checkpoints", "stop_preparing", stop_precompiling)

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None``; saves still in flight do not count.

        Returns:
            The step, or ``None``.
        """
        return self.backend.latest_step()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """Return ``(state, meta)`` of committed ``step``, on ``abstract_state``'s shardings.

        Args:
            step: a committed step.
            abstract_state: the state's shapes and target shardings.

        Returns:
            The state and its meta.

        Raises:
            ValueError: ``step`` is not committed (naming the newest that is), or a
                committed step cannot be read (saying what to do).
        """
        _check_step(step)
        return self.backend.restore(int(step), abstract_state)

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
        self.backend.bind(list(devices), mesh)

    def on_slice_lost(self) -> None:
        """A slice was lost: forget anything bound to the old devices, without calling it."""
        self.backend.drop()

    def close(self) -> None:
        """Wait for the last save and release the backend."""
        self.backend.close()
