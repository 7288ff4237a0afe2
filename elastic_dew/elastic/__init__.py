"""The elastic layer: slices and meshes, two tiers of state, elastic data, one protocol.

Names are imported lazily, so ``elastic_dew.elastic.hooks`` and ``config`` stay cheap to
import (the simulator and the CLI read them before JAX starts).

=====================  ===========================================================
name                   what it is
=====================  ===========================================================
``ElasticConfig``      frozen configuration: recovery mode, retry, batch, tiers
``ElasticRun``         the stop/resume protocol (``Stop``, ``Resume`` events)
``active_devices``     a Manager's active devices (``manager.active_devices`` where
                       the installed pathwaysutils has it)
``build_mesh``         the mesh over the active slices: ``replica`` x ``data`` x ``model``
``make_manager``       pathwaysutils ``Manager``, once per process
``elastic_retry``      pathwaysutils ``elastic_retry`` with a policy that never counts
                       scale-ups
``Snapshots``          tier 1: Orbax ``Snapshotter`` in pinned host memory
``Checkpoints``        tier 2: Orbax ``CheckpointManager`` or multi-tier replicator
``ElasticData``        Grain ``ElasticIterator`` with the attempt's global batch
=====================  ===========================================================
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ElasticConfig": "config",
    "BATCH_POLICIES": "config",
    "ElasticRun": "protocol",
    "Stop": "protocol",
    "Resume": "protocol",
    "Program": "protocol",
    "STOP_REASONS": "protocol",
    "RESUME_SOURCES": "protocol",
    "DURATION_KEYS": "protocol",
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
