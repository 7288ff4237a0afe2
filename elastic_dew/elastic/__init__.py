"""The elastic layer: slices and meshes, two tiers of state, elastic data, one protocol.

Names are imported lazily, so ``elastic_dew.elastic.hooks`` and ``config`` stay cheap to
import (the simulator and the CLI read them before JAX starts).

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
``ElasticData``        Grain ``ElasticIterator`` with the attempt's global batch
=====================  ===========================================================
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ElasticConfig": "config",
    "BATCH_POLICIES": "config",
    "ElasticRun": "protocol",
    "Stop": "events",
    "Resume": "events",
    "Program": "protocol",
    "STOP_REASONS": "events",
    "RESUME_SOURCES": "events",
    "DURATION_KEYS": "events",
    "StepCompiler": "compiler",
    "RecoveryTimer": "recovery",
    "Tiers": "tiers",
    "AXES": "slices",
    "active_devices": "slices",
    "build_mesh": "slices",
    "global_batch_for": "slices",
    "check_batch": "slices",
    "batch_sharding": "slices",
    "replicated": "slices",
    "make_manager": "retry",
    "elastic_retry": "retry",
    "SliceLossRetryLimit": "retry",
    "Snapshots": "state",
    "Checkpoints": "state",
    "MultiTierError": "checkpoints",
    "newest": "state",
    "ElasticData": "data",
    "POSITION_KEY": "data",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic_dew.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"elastic_dew.elastic.{module}"), name)


def __dir__() -> list[str]:
    return __all__
