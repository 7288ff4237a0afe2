"""The elastic layer: slices and meshes, two tiers of state, elastic data, one protocol.

Names are imported lazily, so ``elastic_dew.elastic.hooks`` and ``config`` stay cheap to
import (the simulator and the CLI read them before JAX starts).

The layer is four packages by job: :mod:`~elastic_dew.elastic.state` (the two state tiers:
snapshots, checkpoints and their backends), :mod:`~elastic_dew.elastic.slices` (meshes over
the active slices, their health, retries and the state's layout),
:mod:`~elastic_dew.elastic.loop` (the stop/resume protocol and what it drives: compiled steps,
evaluation, elastic data, recovery timing) and, directly here, the definitions they share
(``config``, ``events``, ``hooks``, ``deadline``).

Its public names:

- ``ElasticConfig``: frozen configuration (recovery mode, retry, batch, tiers);
  ``ElasticRun``: the stop/resume protocol around your ``Program`` (``abstract_state``,
  ``init_state``, ``compile``), which ends with ``Finished``; ``Stop``, ``Resume``: its
  typed events (:mod:`~elastic_dew.elastic.events`); ``Notice``: the preemption notice it
  asks (``elastic_dew.runtime.PreemptionNotice`` is one); ``Evaluation``: its evaluation
  passes; ``MeshSpec``: your mesh's axes and a slice's shape; ``SliceManager``: what it reads
  of pathwaysutils' ``Manager``.
- ``ElasticData``: Grain's ``ElasticIterator`` with the attempt's global batch;
  ``Snapshots``: in-memory snapshots (Orbax ``Snapshotter``); ``Checkpoints``: persistent
  checkpoints (Orbax ``CheckpointManager`` or the multi-tier replicator).
- ``AXES``: the default mesh axes (``replica`` x ``data`` x ``model``); ``build_mesh``,
  ``active_devices``: the mesh over the active slices with your axes and shape, and their
  devices; ``batch_sharding``, ``replicated``: the batch's and a replicated value's
  shardings.
- For a pathwaysutils loop of your own, each piece alone: ``StepDeadline`` (a step's read
  within a bound, else the slice-down error); the slice health checker and the pieces that
  take your own ``CheckpointManager`` are :mod:`elastic_dew.your_loop`'s.
- ``MultiTierError``: multi-tier checkpointing could not be initialised; ``StorageError``:
  a checkpoint save, commit, restore or data read failed or passed the storage timeout
  (``StorageTimeout``); ``SavesFailing``: saves kept failing and the run stopped.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ElasticConfig": "config",
    "ElasticRun": "loop.protocol",
    "Stop": "events",
    "Resume": "events",
    "Program": "loop.program",
    "Finished": "loop.program",
    "Notice": "loop.program",
    "Evaluation": "loop.evaluation",
    "MeshSpec": "slices.mesh",
    "SliceManager": "slices.manager",
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
    # The pieces a pathwaysutils loop of your own calls, each alone (docs/harden-your-loop.md).
    "active_devices": "slices.mesh",
    "build_mesh": "slices.mesh",
    "StepDeadline": "deadline",
}

__all__ = sorted(_EXPORTS)


def _lazy(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic_dew.elastic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"elastic_dew.elastic.{module}"), name)


__getattr__ = _lazy


def __dir__() -> list[str]:
    return __all__
