"""The elastic layer: slices and meshes, two tiers of state, elastic data, one protocol.

Names are imported lazily, so ``elastic_dew.elastic.hooks`` and ``config`` stay cheap to
import (the simulator and the CLI read them before JAX starts).

The layer is four packages by job: :mod:`~elastic_dew.elastic.state` (the two state tiers:
snapshots, checkpoints and their backends), :mod:`~elastic_dew.elastic.slices` (meshes over
the active slices, their health, retries and the state's layout),
:mod:`~elastic_dew.elastic.loop` (the stop/resume protocol and what it drives: compiled steps,
evaluation, elastic data, recovery timing) and, directly here, the definitions they share
(``config``, ``events``, ``hooks``, ``deadline``).

=====================  ===========================================================
name                   what it is
=====================  ===========================================================
``ElasticConfig``      frozen configuration: recovery mode, retry, batch, tiers
``ElasticRun``         the stop/resume protocol around your ``Program``
``Program``            what your model gives it: ``abstract_state``, ``init_state``,
                       ``compile``; ``ElasticRun.run`` returns ``Finished``
``Stop``, ``Resume``   its typed events (:mod:`~elastic_dew.elastic.events`)
``ElasticData``        Grain ``ElasticIterator`` with the attempt's global batch
``Snapshots``          tier 1: Orbax ``Snapshotter`` in pinned host memory
``Checkpoints``        tier 2: Orbax ``CheckpointManager`` or multi-tier replicator
``batch_sharding``,    the batch's and a replicated value's shardings on a mesh
``replicated``
``AXES``               the mesh's axes: ``replica`` x ``data`` x ``model``
``MultiTierError``     multi-tier checkpointing could not be initialised (replicator)
``StorageError``       a checkpoint save, commit, restore or data read failed or passed
                       the storage timeout (``StorageTimeout``); ``SavesFailing``: saves
                       kept failing and the run stopped
=====================  ===========================================================
"""

from __future__ import annotations

import importlib

from elastic_dew._deprecation import moved_names
from elastic_dew.elastic import _moved

_moved.install()

_EXPORTS = {
    "ElasticConfig": "config",
    "ElasticRun": "loop.protocol",
    "Stop": "events",
    "Resume": "events",
    "Program": "loop.program",
    "Finished": "loop.program",
    "AXES": "slices.mesh",
    "batch_sharding": "slices.mesh",
    "replicated": "slices.mesh",
    "Snapshots": "state.snapshots",
    "Checkpoints": "state.checkpoints",
    "MultiTierError": "state.checkpoints",
    "StorageError": "state.storage",
    "StorageTimeout": "state.storage",
    "SavesFailing": "state.checkpoint_tier",
    "ElasticData": "loop.data",
}

__all__ = sorted(_EXPORTS)

#: The names that left the public list in 0.2.0 (the loop's own parts, and the events' and
#: the settings' constants, which their modules export), served from here with a warning
#: until 0.3.
_LEFT = {
    "BATCH_POLICIES": "elastic_dew.elastic.config.BATCH_POLICIES",
    "STOP_REASONS": "elastic_dew.elastic.events.STOP_REASONS",
    "RESUME_SOURCES": "elastic_dew.elastic.events.RESUME_SOURCES",
    "DURATION_KEYS": "elastic_dew.elastic.events.DURATION_KEYS",
    "StepCompiler": "elastic_dew.elastic.loop.compiler.StepCompiler",
    "RecoveryTimer": "elastic_dew.elastic.loop.recovery.RecoveryTimer",
    "Tiers": "elastic_dew.elastic.state.tiers.Tiers",
    "active_devices": "elastic_dew.elastic.slices.mesh.active_devices",
    "build_mesh": "elastic_dew.elastic.slices.mesh.build_mesh",
    "global_batch_for": "elastic_dew.elastic.slices.mesh.global_batch_for",
    "check_batch": "elastic_dew.elastic.slices.mesh.check_batch",
    "make_manager": "elastic_dew.elastic.slices.retry.make_manager",
    "elastic_retry": "elastic_dew.elastic.slices.retry.elastic_retry",
    "SliceLossRetryLimit": "elastic_dew.elastic.slices.retry.SliceLossRetryLimit",
    "newest": "elastic_dew.elastic.state.newest",
    "POSITION_KEY": "elastic_dew.elastic.loop.data.POSITION_KEY",
}


def _lazy(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic_dew.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"elastic_dew.elastic.{module}"), name)


__getattr__ = moved_names(__name__, _LEFT, fallback=_lazy)


def __dir__() -> list[str]:
    return __all__
