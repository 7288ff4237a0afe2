"""The ``multi_tier`` checkpoint kind: the guide's ``ReplicatorCheckpointManager`` over colocated Python.

``initialize_multi_tier_checkpointing`` and a ``ReplicatorCheckpointManager``, both with
``use_colocated_python=True``, as the Pathways guide calls them. Each TPU worker's
colocated-Python sidecar writes its shards of a step to the node's local directory (a RAM
disk); GKE's replicator service copies committed steps to peer nodes in other slices and
backs them up to a bucket, and restores a replaced node from a peer or the backup. They
need a Pathways backend (the CPU simulator stands in for one, with a stand-in for the
replicator: :mod:`elastic_dew.simulate.replicator`); anywhere else construction is refused
before anything is touched.

**Re-initialisation.** Orbax derives each worker's rank and peers from the devices it is
given, and the replicator learns them only from the ``replicator.yaml`` each worker writes
when multi-tier checkpointing is initialised; that handshake is also the only moment the
replicator restores a node whose local directory is empty. So
:meth:`~elastic_dew.elastic.state.checkpoints.Checkpoints.on_active_slices_changed` initialises
again (:func:`initialize`), and builds a new manager (:func:`manager`), whenever the set of
active devices differs from the one the manager was built for, and
:meth:`~elastic_dew.elastic.state.checkpoints.Checkpoints.on_slice_lost` (a slice lost) forgets
the manager without calling it: its calls would go to every worker of the old mesh, the
lost one included. The next attempt therefore always initialises again, even on the same
devices (pause-resume), where the returned slice may be a new node with an empty RAM disk.
A scale-up in place (every old worker healthy) commits the old manager's save and closes it
first.

**Steps** start at 1: the replicator reserves step 0 for "no checkpoint". Colocated mode
accepts only a ``state`` item (plus a ``dataset`` item that needs a separate persistent
directory), so ``meta`` travels inside the state as a fixed-size ``uint8`` array of JSON
(:data:`META_CAPACITY` bytes), saved and replicated exactly like the arrays it describes.

**Errors.** An initialisation the replicator does not answer within ``init_timeout_seconds``
(Orbax's ``jax_initialization_timeout_seconds``), and a ``replicator.failed`` answer, are a
:class:`MultiTierError` that says what to check; neither touches a committed step.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.elastic.state.meta import MetaError
from elastic_dew.elastic.state.packing import abstract_key_data, rewrap_keys, unwrap_keys

__all__ = ["MultiTierError", "META_CAPACITY", "require_colocated_python", "initialize", "manager", "save", "restore"]

logger = logging.getLogger(__name__)

#: Bytes of JSON the multi-tier kind can carry as ``meta``.
META_CAPACITY = 1 << 16

_STATE = "state"
_META = "meta"
_ARRAYS = "arrays"


class MultiTierError(RuntimeError):
    """Multi-tier checkpointing could not be initialised: the replicator failed or did not answer."""


def require_colocated_python() -> None:
    """Refuse multi-tier checkpointing where no Pathways backend (and so no sidecar) exists."""
    if not orbax_private.is_pathways_backend():
        platform = jax.devices()[0].platform
        raise RuntimeError(
            f"checkpoint kind 'multi_tier' uses colocated Python on a Pathways backend with TPU "
            f"sidecars, but this process runs JAX on {platform!r} without Pathways; use "
            "checkpoint_kind='orbax' (a local directory or gs:// path) here, or run inside "
            "elastic_dew.simulate.SimulatedSlices, which stands in for Pathways"
        )


def _modules() -> tuple[Any, Any]:
    from orbax.checkpoint.experimental.emergency.multi_tier_checkpointing import (
        initialization,
        replicator_checkpoint_manager,
    )

    return initialization, replicator_checkpoint_manager


def initialize(directory: str, devices: list[jax.Device], slices: int, *, run_name: str,
               backup_interval_minutes: int, init_timeout_seconds: int) -> None:
    """Initialise multi-tier checkpointing on ``devices`` (``slices`` of them): the
    replicator's handshake.

    Raises:
        MultiTierError: the replicator failed or did not answer within ``init_timeout_seconds``.
    """
    initialization, _ = _modules()
    logger.info("initialising multi-tier checkpointing on %d slices (%d devices)", slices, len(devices))
    try:
        initialization.initialize_multi_tier_checkpointing(
            epath.Path(directory),
            backup_interval_minutes=backup_interval_minutes,
            num_slices=slices,
            run_name=run_name,
            use_colocated_python=True,
            devices=devices,
            jax_initialization_timeout_seconds=init_timeout_seconds,
        )
    except TimeoutError as error:
        raise MultiTierError(
            f"multi-tier checkpointing was not initialised within {init_timeout_seconds} s on "
            f"{slices} slices ({error}): the replicator did not consume replicator.yaml or answer with "
            f"a restore marker in {directory}; check that multi-tier checkpointing is enabled on "
            "the node pool and GKE's CheckpointConfiguration is applied (elastic-dew k8s "
            "checkpoint-config), or raise ElasticConfig.mtc_init_timeout; no checkpoint was touched"
        ) from error
    except RuntimeError as error:
        if "Replicator fatal errors" not in str(error):
            raise
        raise MultiTierError(
            f"the multi-tier replicator failed while multi-tier checkpointing was initialised on "
            f"{slices} slices ({error}); read the replicator's log on the node named there "
            "(kubectl logs -n gke-managed-checkpointing), fix it and run again; no checkpoint "
            "was touched"
        ) from error


def manager(directory: str, mesh: Mesh) -> Any:
    """A ``ReplicatorCheckpointManager`` for ``mesh``, after :func:`initialize` on its devices."""
    _, replicator = _modules()
    options = replicator.ReplicatorCheckpointManagerOptions(save_interval_steps=1, use_colocated_python=True)
    return replicator.ReplicatorCheckpointManager(epath.Path(directory), options=options, global_mesh=mesh)


def _meta_array(meta_json: str, mesh: Mesh) -> jax.Array:
    raw = meta_json.encode()
    if len(raw) > META_CAPACITY:
        raise MetaError(
            f"checkpoint meta is {len(raw)} bytes of JSON; the multi-tier kind carries at most "
            f"{META_CAPACITY}: keep large values out of meta"
        )
    padded = np.full(META_CAPACITY, ord(" "), dtype=np.uint8)
    padded[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return jax.device_put(padded, NamedSharding(mesh, PartitionSpec()))


def save(manager: Any, mesh: Mesh, step: int, state: Any, meta_json: str, force: bool) -> None:
    """Start ``manager``'s save of ``step``: the state's arrays with the meta as an array beside them.

    Raises:
        MetaError: the meta is over :data:`META_CAPACITY` bytes.
    """
    item = {_ARRAYS: unwrap_keys(state), _META: _meta_array(meta_json, mesh)}
    manager.save(step, args=ocp.args.Composite(**{_STATE: ocp.args.PyTreeSave(item=item)}), force=force)


def restore(manager: Any, mesh: Mesh, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """``(state, meta)`` of committed ``step`` through ``manager``, on ``abstract_state``'s shardings."""
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract = {
        _ARRAYS: abstract_key_data(abstract_state),
        _META: jax.ShapeDtypeStruct((META_CAPACITY,), np.uint8, sharding=replicated),
    }
    restore_args = jax.tree.map(lambda x: ocp.type_handlers.ArrayRestoreArgs(sharding=x.sharding), abstract)
    restored = manager.restore(
        step,
        args=ocp.args.Composite(**{_STATE: ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args)}),
    )[_STATE]
    meta = json.loads(np.asarray(restored[_META]).tobytes().decode())
    return rewrap_keys(restored[_ARRAYS], abstract_state), meta
