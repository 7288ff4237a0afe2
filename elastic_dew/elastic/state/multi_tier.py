"""The ``multi_tier`` checkpoint backend: the guide's ``ReplicatorCheckpointManager`` over colocated Python.

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
replicator restores a node whose local directory is empty. So :meth:`MultiTierBackend.on_active_slices_changed`
initialises again, and builds a new manager, whenever the set of active devices differs from
the one the manager was built for, and :meth:`MultiTierBackend.on_slice_lost` (a slice lost) forgets
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
from elastic_dew.elastic.state.backend import abstract_key_data, rewrap_keys, unwrap_keys
from elastic_dew.elastic.state.meta import MetaError

__all__ = ["MultiTierBackend", "MultiTierError", "META_CAPACITY", "require_colocated_python"]

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


class MultiTierBackend:
    """The guide's multi-tier checkpointing for the active devices (see the module for the rules).

    Before the first :meth:`on_active_slices_changed` there is no manager and :meth:`latest_step` is ``None``;
    after :meth:`on_slice_lost` it is the newest step this process saw committed, until the next
    :meth:`on_active_slices_changed` asks the workers again.
    """

    def __init__(
        self,
        directory: str,
        *,
        run_name: str,
        backup_interval_minutes: int,
        init_timeout_seconds: int,
    ) -> None:
        require_colocated_python()
        self.directory = str(directory)
        self.run_name = run_name
        self.backup_interval_minutes = backup_interval_minutes
        self.init_timeout_seconds = init_timeout_seconds
        self.initialization, self.replicator = _modules()
        self.manager: Any = None
        self.mesh: Mesh | None = None
        self.devices: frozenset[jax.Device] | None = None
        #: Times multi-tier checkpointing was initialised by this backend.
        self.initializations = 0
        self._saving: int | None = None
        self._committed: int | None = None

    # -- the active devices --------------------------------------------------------------
    def on_active_slices_changed(self, devices: list[jax.Device], mesh: Mesh) -> None:
        active = frozenset(devices)
        if self.manager is not None and active == self.devices:
            if mesh != self.mesh:
                self._finish()
                self.manager = self._manager(mesh)
            return
        if self.manager is not None:
            self._finish()  # a scale-up: every worker of the old mesh is healthy
        self._initialize(list(devices), int(mesh.devices.shape[0]))
        self.devices = active
        self.manager = self._manager(mesh)

    def on_slice_lost(self) -> None:
        if self.manager is not None:
            logger.info("dropping the multi-tier checkpoint manager of the lost slice's mesh")
        self.manager, self.mesh, self.devices, self._saving = None, None, None, None

    def _finish(self) -> None:
        """Commit the old manager's save and close it; a failure costs only that save."""
        manager, self.manager = self.manager, None
        try:
            manager.wait_until_finished()
            if self._saving is not None:
                self._committed = self._saving
            manager.close()
        except Exception:  # noqa: BLE001 - the new manager is built all the same
            logger.exception("closing the previous multi-tier checkpoint manager failed")
        self._saving = None

    def _initialize(self, devices: list[jax.Device], slices: int) -> None:
        logger.info("initialising multi-tier checkpointing on %d slices (%d devices)", slices, len(devices))
        try:
            self.initialization.initialize_multi_tier_checkpointing(
                epath.Path(self.directory),
                backup_interval_minutes=self.backup_interval_minutes,
                num_slices=slices,
                run_name=self.run_name,
                use_colocated_python=True,
                devices=devices,
                jax_initialization_timeout_seconds=self.init_timeout_seconds,
            )
        except TimeoutError as error:
            raise MultiTierError(
                f"multi-tier checkpointing was not initialised within {self.init_timeout_seconds} s on "
                f"{slices} slices ({error}): the replicator did not consume replicator.yaml or answer with "
                f"a restore marker in {self.directory}; check that multi-tier checkpointing is enabled on "
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
        self.initializations += 1

    def _manager(self, mesh: Mesh) -> Any:
        options = self.replicator.ReplicatorCheckpointManagerOptions(save_interval_steps=1, use_colocated_python=True)
        manager = self.replicator.ReplicatorCheckpointManager(
            epath.Path(self.directory), options=options, global_mesh=mesh
        )
        self.mesh = mesh
        return manager

    def _require_manager(self) -> Any:
        if self.manager is None:
            raise RuntimeError(
                "multi-tier checkpointing is not bound to the active slices: call "
                "on_active_slices_changed(devices, mesh) with them first"
            )
        return self.manager

    def _bound_mesh(self) -> Mesh:
        """The mesh the manager was bound with (:meth:`on_active_slices_changed` sets both)."""
        self._require_manager()
        assert self.mesh is not None, "the mesh is bound with the manager"
        return self.mesh

    # -- steps ---------------------------------------------------------------------------
    def latest_step(self) -> int | None:
        return self._committed if self.manager is None else self.manager.latest_step()

    def committed_steps(self) -> list[int]:
        if self.manager is None:
            return [] if self._committed is None else [self._committed]
        return sorted(self.manager.all_steps())

    def saving(self) -> bool:
        return self.manager is not None and self._saving is not None and self.manager.is_saving_in_progress()

    def abandon(self, close: bool = False) -> None:
        """Forget the manager of a save given up on, without calling it, and bind a fresh
        one to the same devices on the next :meth:`on_active_slices_changed` (the protocol calls it at every
        attempt; here at once, when the mesh is known)."""
        mesh, devices = self.mesh, self.devices
        self.on_slice_lost()
        if mesh is not None and devices is not None:
            self.on_active_slices_changed(list(devices), mesh)

    def quarantine(self, step: int) -> str:
        raise NotImplementedError(
            "a damaged multi-tier checkpoint is restored by GKE's replicator from a peer or the backup; "
            "elastic_dew does not move it aside"
        )

    def _meta_array(self, meta_json: str) -> jax.Array:
        raw = meta_json.encode()
        if len(raw) > META_CAPACITY:
            raise MetaError(
                f"checkpoint meta is {len(raw)} bytes of JSON; the multi-tier kind carries at most "
                f"{META_CAPACITY}: keep large values out of meta"
            )
        padded = np.full(META_CAPACITY, ord(" "), dtype=np.uint8)
        padded[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        return jax.device_put(padded, NamedSharding(self._bound_mesh(), PartitionSpec()))

    def save(self, step: int, state: Any, meta_json: str, force: bool) -> None:
        manager = self._require_manager()
        item = {_ARRAYS: unwrap_keys(state), _META: self._meta_array(meta_json)}
        manager.save(step, args=ocp.args.Composite(**{_STATE: ocp.args.PyTreeSave(item=item)}), force=force)
        self._saving = step

    def wait(self) -> None:
        if self.manager is None:
            return
        self.manager.wait_until_finished()
        self.manager.check_for_errors()
        if self._saving is not None:
            self._committed, self._saving = self._saving, None

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        manager = self._require_manager()
        replicated = NamedSharding(self._bound_mesh(), PartitionSpec())
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

    # -- nothing to precompile: colocated saves do not slice replicas on the controller ---
    def precompile_saves(self, state: Any) -> None:
        return None

    def saves_precompiled(self, timeout: float | None = None) -> bool:
        return True

    def stop_precompiling(self) -> None:
        return None

    def close(self) -> None:
        if self.manager is not None:
            self._finish()
