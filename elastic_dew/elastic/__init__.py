"""The elastic layer: slices and meshes, two tiers of state, elastic data, one protocol.

Names are imported lazily, so ``elastic_dew.elastic.hooks`` and ``config`` stay cheap to
import (the simulator and the CLI read them before JAX starts).

The layer is four packages by job: :mod:`~elastic_dew.elastic.state` (the two state tiers:
snapshots, checkpoints and their backends), :mod:`~elastic_dew.elastic.slices` (meshes over
the active slices, their health, retries and the state's layout),
:mod:`~elastic_dew.elastic.loop` (the stop/resume protocol and what it drives: compiled steps,
evaluation, elastic data, recovery timing) and, directly here, the definitions they share
(``config``, ``events``, ``hooks``, ``deadline``, ``fault_token``).

=====================  ===========================================================
name                   what it is
=====================  ===========================================================
``ElasticConfig``      frozen configuration: recovery mode, retry, batch, tiers
``ElasticRun``         the stop/resume protocol: a loop over the collaborators below
``Stop``, ``Resume``   its typed events (:mod:`~elastic_dew.elastic.events`)
``StepCompiler``       compiled steps per (devices, batch), smaller meshes precompiled
``RecoveryTimer``      a resume's durations (detection, wait, mesh and compile, restore)
``Tiers``              both state tiers, each deciding its own save cadence
``active_devices``     a Manager's active devices (``manager.active_devices`` where
                       the installed pathwaysutils has it)
``build_mesh``         the mesh over the active slices: ``replica`` x ``data`` x ``model``
``make_manager``       pathwaysutils ``Manager``, once per process
``elastic_retry``      pathwaysutils ``elastic_retry`` with a policy that never counts
                       scale-ups
``Snapshots``          tier 1: Orbax ``Snapshotter`` in pinned host memory
``Checkpoints``        tier 2: Orbax ``CheckpointManager`` or multi-tier replicator
``MultiTierError``     multi-tier checkpointing could not be initialised (replicator)
``StorageError``       a checkpoint save, commit, restore or data read failed or passed
                       the storage timeout (``StorageTimeout``); ``SavesFailing``: saves
                       kept failing and the run stopped
``ElasticData``        Grain ``ElasticIterator`` with the attempt's global batch
=====================  ===========================================================
"""

from __future__ import annotations

import importlib

from elastic_dew.elastic import _moved

_moved.install()

_EXPORTS = {
    "ElasticConfig": "config",
    "BATCH_POLICIES": "config",
    "ElasticRun": "loop.protocol",
    "Stop": "events",
    "Resume": "events",
    "Program": "loop.program",
    "STOP_REASONS": "events",
    "RESUME_SOURCES": "events",
    "DURATION_KEYS": "events",
    "StepCompiler": "loop.compiler",
    "RecoveryTimer": "loop.recovery",
    "Tiers": "state.tiers",
    "AXES": "slices.mesh",
    "active_devices": "slices.mesh",
    "build_mesh": "slices.mesh",
    "global_batch_for": "slices.mesh",
    "check_batch": "slices.mesh",
    "batch_sharding": "slices.mesh",
    "replicated": "slices.mesh",
    "make_manager": "slices.retry",
    "elastic_retry": "slices.retry",
    "SliceLossRetryLimit": "slices.retry",
    "Snapshots": "state.snapshots",
    "Checkpoints": "state.checkpoints",
    "MultiTierError": "state.checkpoints",
    "StorageError": "state.storage",
    "StorageTimeout": "state.storage",
    "SavesFailing": "state.tiers",
    "newest": "state",
    "ElasticData": "loop.data",
    "POSITION_KEY": "loop.data",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic_dew.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"elastic_dew.elastic.{module}"), name)


def __dir__() -> list[str]:
    return __all__
