"""Tier 2: persistent checkpoints, over Orbax's ``CheckpointManager`` or the multi-tier replicator.

Two kinds, chosen by configuration:

``orbax``
    An ``ocp.CheckpointManager`` on a local directory or a ``gs://`` path. Each step is
    saved as two items, ``state`` (the arrays, ``StandardSave``) and ``meta`` (the step, the
    data position and other small values, ``JsonSave``): nothing is pickled. Orbax writes a
    step into ``<step>.orbax-checkpoint-tmp-<n>`` and renames it to ``<step>`` when it
    commits (on ``gs://`` it writes ``commit_success.txt`` instead), and only then deletes
    the checkpoints beyond ``max_to_keep``. A save cut short (the process SIGKILLed
    mid-write) therefore leaves only a temporary directory, which is never listed and never
    costs the previous checkpoint. This module additionally treats a step directory as
    committed only when Orbax's step metadata carries its commit timestamp and both items
    are present, so a partial or corrupt ``<step>`` directory is skipped too.

``multi_tier``
    The Pathways guide's multi-tier checkpointing: ``initialize_multi_tier_checkpointing``
    and a ``ReplicatorCheckpointManager``, both with ``use_colocated_python=True``. They
    need TPUs with colocated-Python sidecars and the GKE replicator service, so on any
    other backend (CPU included) construction is refused before anything is touched. The
    guide's rules are kept: steps start at 1 (the replicator reserves 0), and multi-tier
    checkpointing is initialised again with the active devices whenever the active slice
    count changes (:meth:`Checkpoints.on_active_slices_changed`). Colocated mode accepts
    only a ``state`` item (plus a ``dataset`` item that needs a separate persistent
    directory), so ``meta`` travels inside the state as a fixed-size ``uint8`` array of
    JSON, saved and replicated exactly like the arrays it describes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elastic_dew import rundir
from elastic_dew.elastic import orbax_private
from elastic_dew.elastic.config import CHECKPOINT_KINDS
from elastic_dew.elastic.meta import meta_json

__all__ = ["Checkpoints", "KINDS", "META_CAPACITY"]

logger = logging.getLogger(__name__)

KINDS = CHECKPOINT_KINDS

#: Bytes of JSON the multi-tier kind can carry as ``meta``.
META_CAPACITY = 1 << 16

_STATE = "state"
_META = "meta"
_ARRAYS = "arrays"


def _check_step(step: int) -> None:
    if not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(
            f"checkpoint step={step!r} must be an int >= 1: the state after `step` updates "
            "(step 0 is the untrained state, and the multi-tier replicator reserves it)"
        )


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _unwrap_keys(state: Any) -> Any:
    """Typed PRNG keys are saved as their key data (Orbax's array handlers need plain dtypes)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, state)


def _abstract_key_data(abstract: Any) -> Any:
    def convert(x: Any) -> Any:
        if not _is_key(x):
            return x
        shape = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
        return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=x.sharding)

    return jax.tree.map(convert, abstract)


def _rewrap_keys(restored: Any, abstract: Any) -> Any:
    # A typed key's dtype carries its implementation (threefry, rbg, ...).
    return jax.tree.map(
        lambda x, a: jax.random.wrap_key_data(x, impl=a.dtype._impl) if _is_key(a) else x,
        restored,
        abstract,
    )


def _leaf_shapes(tree: Any) -> dict[str, tuple]:
    """``{"params/w": shape}``; key names only, so a namedtuple and the dict Orbax stores it as agree."""
    return {
        "/".join(re.findall(r"\w+", jax.tree_util.keystr(path))): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _prepare_replica_slices(state: Any, stop: threading.Event | None = None, handler: Any = None) -> None:
    """Compile, off the training loop, the per-device slicing Orbax's first save would compile.

    Orbax saves a replicated array replica-parallel: each replica transfers its own slice,
    cut by a small ``jax.lax.slice_in_dim`` program per (device, shard shape, slice), and
    compiling those programs was nearly all of a process's first checkpoint save (in the
    demo 4.1 s of the loop, where later saves took 0.03-0.46 s; ``benchmarks/first_save.py``
    profiles it). This runs Orbax's own slicing (private in this Orbax version, so through
    :func:`elastic_dew.elastic.orbax_private.slice_replicas`) on ``state``'s arrays, one leaf
    at a time, and drops the slices: the same programs are compiled and cached, and nothing
    reaches the host or the disk. It returns early once ``stop`` is set (a save began and
    compiles the rest itself).
    """
    for leaf in jax.tree.leaves(_unwrap_keys(state)):
        if stop is not None and stop.is_set():
            return
        if not isinstance(leaf, jax.Array) or leaf.is_deleted():
            continue
        orbax_private.slice_replicas(leaf, handler)


class _OrbaxKind:
    """``ocp.CheckpointManager`` with ``state`` + ``meta`` items and a strict commit check."""

    def __init__(self, directory: str, max_to_keep: int) -> None:
        self.directory = epath.Path(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True
        )
        # Small leaves are saved whole by one replica: nothing to compile on a first save
        # (orbax_private.REPLICA_PARALLEL_MIN_SLICE_BYTES); large ones replica-parallel.
        self._arrays = orbax_private.replica_parallel_array_handler()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={_STATE: orbax_private.state_item_handler(self._arrays), _META: ocp.JsonCheckpointHandler()},
        )
        self._preparing: threading.Thread | None = None
        self._stop_preparing = threading.Event()
        self._prepared: set = set()

    def prepare(self, state: Any) -> None:
        """Compile the first save's slicing for ``state``'s layout in a background thread.

        Once per layout (leaf shapes, dtypes and shardings): a later attempt or scale-up on
        a layout already prepared does nothing. A save stops the preparation where it is
        (one leaf's slices at most to wait for) and compiles what it had not reached.
        """
        layout = tuple((leaf.shape, leaf.dtype, getattr(leaf, "sharding", None)) for leaf in jax.tree.leaves(state))
        if layout in self._prepared:
            return
        self.stop_preparing()
        self._prepared.add(layout)
        self._stop_preparing.clear()
        # JAX caches a compile under the calling thread's context, and pathwaysutils runs
        # each attempt under jax.default_device: the worker compiles under the same one.
        device = jax.config.jax_default_device

        def work() -> None:
            try:
                with jax.default_device(device):
                    _prepare_replica_slices(state, self._stop_preparing, self._arrays)
            except Exception:  # only a warm-up: the save itself compiles what is missing
                logger.debug("preparing the checkpoint's replica slices failed", exc_info=True)

        self._preparing = threading.Thread(target=work, name="elastic-dew-checkpoint-prepare", daemon=True)
        self._preparing.start()

    def prepared(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the preparation; whether none is running."""
        if self._preparing is not None:
            self._preparing.join(timeout)
        return self._preparing is None or not self._preparing.is_alive()

    def stop_preparing(self) -> None:
        self._stop_preparing.set()
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None

    def committed(self, step: int) -> bool:
        return rundir.committed(self.directory / str(step))

    def steps_on_disk(self) -> list[int]:
        if not self.directory.exists():
            return []
        return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

    def latest_step(self) -> int | None:
        steps = rundir.committed_checkpoint_steps(self.directory)
        return steps[-1] if steps else None

    def save(self, step: int, state: Any, meta_json: str, force: bool) -> None:
        self.stop_preparing()
        latest = self.latest_step()
        if latest is not None and step <= latest:
            logger.info("checkpoint of step %d skipped: step %d is already committed", step, latest)
            return
        if step in self.steps_on_disk():
            # A partial <step> directory (never committed): clear it so the step can be written.
            self.manager.wait_until_finished()
            partial = self.directory / str(step)
            logger.warning("removing uncommitted checkpoint directory %s", partial)
            if os.path.islink(os.fspath(partial)):
                # A link placed there: remove the link, never what it points to.
                os.unlink(os.fspath(partial))
            else:
                partial.rmtree()
            self.manager.reload()
        self.manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    _STATE: ocp.args.StandardSave(_unwrap_keys(state)),
                    _META: ocp.args.JsonSave(json.loads(meta_json)),
                }
            ),
            force=force,
        )

    def wait(self) -> None:
        self.manager.wait_until_finished()
        self.manager.check_for_errors()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        abstract = _abstract_key_data(abstract_state)
        try:
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    **{_STATE: ocp.args.StandardRestore(abstract), _META: ocp.args.JsonRestore()}
                ),
            )
        except (ValueError, OSError) as error:
            raise self._unreadable(step, abstract, error) from error
        return _rewrap_keys(restored[_STATE], abstract_state), dict(restored[_META])

    def _unreadable(self, step: int, abstract: Any, error: Exception) -> ValueError:
        """Why a committed step cannot be restored, and the fix: another model, or damage."""
        path = self.directory / str(step)
        try:
            stored = ocp.StandardCheckpointHandler().metadata(path / _STATE)
            stored_shapes = _leaf_shapes(stored)
        except Exception:  # noqa: BLE001 - unreadable metadata is damage, reported below
            stored_shapes = None
        if stored_shapes is not None:
            wanted = _leaf_shapes(abstract)
            differences = [
                f"{name} is {stored_shapes.get(name, 'absent')} there and {shape} in the model"
                for name, shape in wanted.items()
                if stored_shapes.get(name) != shape
            ]
            differences += [f"{name} is there and not in the model" for name in stored_shapes if name not in wanted]
            if differences:
                return ValueError(
                    f"checkpoint step {step} in {self.directory} was written by a model of "
                    f"another shape ({'; '.join(differences[:3])}); resume it with the model "
                    "that wrote it, or train this model in a new run directory"
                )
        older = [s for s in self.steps_on_disk() if s < step and self.committed(s)]
        previous = (
            f"to resume from the previous committed checkpoint {older[-1]}"
            if older else "to start again from step 1"
        )
        return ValueError(
            f"checkpoint step {step} in {self.directory} is committed but cannot be read, so it "
            f"was damaged after it was written ({type(error).__name__}: {str(error)[:200]}); "
            f"move it aside (mv {path} {path}.damaged) {previous}"
        )

    def on_active_slices_changed(self, devices: list, mesh: Mesh) -> None:
        return None

    def close(self) -> None:
        self.stop_preparing()
        self.manager.wait_until_finished()
        self.manager.close()


def _require_colocated_python() -> None:
    """Refuse multi-tier checkpointing where no Pathways backend (and so no sidecar) exists."""
    if not orbax_private.is_pathways_backend():
        platform = jax.devices()[0].platform
        raise RuntimeError(
            f"checkpoint kind 'multi_tier' uses colocated Python on a Pathways backend with TPU "
            f"sidecars, but this process runs JAX on {platform!r} without Pathways; use "
            "checkpoint_kind='orbax' (a local directory or gs:// path) here"
        )


def _multi_tier_modules() -> tuple[Any, Any]:
    from orbax.checkpoint.experimental.emergency.multi_tier_checkpointing import (
        initialization,
        replicator_checkpoint_manager,
    )

    return initialization, replicator_checkpoint_manager


class _MultiTierKind:
    """The guide's ``ReplicatorCheckpointManager`` with colocated Python (Pathways + TPU only).

    The manager is bound to a mesh, so it is (re)created by :meth:`on_active_slices_changed`,
    which the elastic layer calls on every attempt and scale-up; before the first call there
    is no manager and ``latest_step`` is ``None``.
    """

    def __init__(
        self, directory: str, *, run_name: str | None, backup_interval_minutes: int
    ) -> None:
        self.directory = epath.Path(directory)
        self.run_name = run_name
        self.backup_interval_minutes = backup_interval_minutes
        self.initialization, self.replicator = _multi_tier_modules()
        self.manager: Any = None
        self.mesh: Mesh | None = None
        self.slices: int | None = None
        self.initializations = 0

    def on_active_slices_changed(self, devices: list, mesh: Mesh) -> None:
        slices = int(mesh.devices.shape[0])
        if slices != self.slices:
            if self.manager is not None:
                self.manager.wait_until_finished()
            logger.info("initialising multi-tier checkpointing on %d slices", slices)
            self.initialization.initialize_multi_tier_checkpointing(
                self.directory,
                backup_interval_minutes=self.backup_interval_minutes,
                num_slices=slices,
                run_name=self.run_name,
                use_colocated_python=True,
                devices=list(devices),
            )
            self.initializations += 1
            self.slices = slices
        if self.manager is None or mesh != self.mesh:
            if self.manager is not None:
                self.manager.wait_until_finished()
                self.manager.close()
            options = self.replicator.ReplicatorCheckpointManagerOptions(
                save_interval_steps=1, use_colocated_python=True
            )
            self.manager = self.replicator.ReplicatorCheckpointManager(
                self.directory, options=options, global_mesh=mesh
            )
            self.mesh = mesh

    def _require_manager(self) -> Any:
        if self.manager is None:
            raise RuntimeError(
                "multi-tier checkpointing is not initialised yet: call "
                "on_active_slices_changed(devices, mesh) with the active slices first"
            )
        return self.manager

    def latest_step(self) -> int | None:
        return None if self.manager is None else self.manager.latest_step()

    def _meta_array(self, meta_json: str) -> jax.Array:
        raw = meta_json.encode()
        if len(raw) > META_CAPACITY:
            raise ValueError(
                f"checkpoint meta is {len(raw)} bytes of JSON; the multi-tier kind carries at most "
                f"{META_CAPACITY}: keep large values out of meta"
            )
        padded = np.full(META_CAPACITY, ord(" "), dtype=np.uint8)
        padded[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        return jax.device_put(padded, NamedSharding(self.mesh, PartitionSpec()))

    def save(self, step: int, state: Any, meta_json: str, force: bool) -> None:
        manager = self._require_manager()
        item = {_ARRAYS: _unwrap_keys(state), _META: self._meta_array(meta_json)}
        manager.save(
            step,
            args=ocp.args.Composite(**{_STATE: ocp.args.PyTreeSave(item=item)}),
            force=force,
        )

    def wait(self) -> None:
        if self.manager is not None:
            self.manager.wait_until_finished()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        manager = self._require_manager()
        abstract = {
            _ARRAYS: _abstract_key_data(abstract_state),
            _META: jax.ShapeDtypeStruct(
                (META_CAPACITY,), np.uint8, sharding=NamedSharding(self.mesh, PartitionSpec())
            ),
        }
        restore_args = jax.tree.map(
            lambda x: ocp.type_handlers.ArrayRestoreArgs(sharding=x.sharding), abstract
        )
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                **{_STATE: ocp.args.PyTreeRestore(item=abstract, restore_args=restore_args)}
            ),
        )[_STATE]
        meta = json.loads(np.asarray(restored[_META]).tobytes().decode())
        return _rewrap_keys(restored[_ARRAYS], abstract_state), meta

    def close(self) -> None:
        if self.manager is not None:
            self.manager.wait_until_finished()
            self.manager.close()
            self.manager = None


class Checkpoints:
    """Persistent checkpoints of the training state and its meta (tier 2).

    ``directory`` is a local path or ``gs://`` URL (``orbax``), or the local RAM-disk
    directory of the multi-tier volume (``multi_tier``). ``mesh`` (optional) initialises a
    multi-tier setup at once; otherwise :meth:`on_active_slices_changed` does, on the first
    attempt. ``num_slices`` is informational (the multi-tier kind counts the replica axis of
    each mesh it is given). ``run_name`` names the multi-tier run (default: ``$JOBSET_NAME``).
    """

    def __init__(
        self,
        directory: str,
        *,
        kind: str = "orbax",
        max_to_keep: int = 3,
        mesh: Mesh | None = None,
        num_slices: int | None = None,
        run_name: str | None = None,
        backup_interval_minutes: int = 10,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"checkpoint kind={kind!r} must be one of {', '.join(KINDS)}")
        if not directory:
            raise ValueError("checkpoint directory is empty; give a local path or a gs:// URL")
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep} must be >= 1")
        if num_slices is not None and num_slices < 1:
            raise ValueError(f"num_slices={num_slices} must be >= 1")
        self.kind = kind
        self.directory = str(directory)
        self.num_slices = num_slices
        if kind == "multi_tier":
            _require_colocated_python()
            run_name = run_name or os.environ.get("JOBSET_NAME")
            if not run_name:
                raise ValueError(
                    "checkpoint kind 'multi_tier' needs a run name: pass run_name or set JOBSET_NAME"
                )
            if backup_interval_minutes < 1:
                raise ValueError(f"backup_interval_minutes={backup_interval_minutes} must be >= 1")
            self._kind: Any = _MultiTierKind(
                self.directory, run_name=run_name, backup_interval_minutes=backup_interval_minutes
            )
            if mesh is not None:
                self.on_active_slices_changed(list(mesh.devices.flat), mesh)
        else:
            self._kind = _OrbaxKind(self.directory, max_to_keep)

    def save(self, step: int, state: Any, meta: dict, *, force: bool = False) -> None:
        """Start saving the state after ``step`` updates (asynchronous); ``wait`` commits it.

        A step at or below the newest committed one is skipped (logged): Orbax would
        otherwise garbage-collect the newer checkpoints in favour of the older step.
        """
        _check_step(step)
        encoded = meta_json(meta, "checkpoint")
        self._kind.save(int(step), state, encoded, force)

    def wait(self) -> None:
        """Block until the last save is committed; raise if it failed."""
        self._kind.wait()

    def prepare(self, state: Any) -> None:
        """Get the first save of ``state``'s layout ready while training goes on.

        For ``orbax``: compile, in a background thread, the per-device slicing Orbax's
        replica-parallel save compiles on its first save of a layout (the bulk of that
        save's time); a save waits for it. The protocol calls this after every resume and
        scale-up. A no-op for ``multi_tier``.
        """
        prepare = getattr(self._kind, "prepare", None)
        if prepare is not None:
            prepare(state)

    def prepared(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`prepare`'s work; whether it is done."""
        prepared = getattr(self._kind, "prepared", None)
        return True if prepared is None else prepared(timeout)

    def stop_preparing(self) -> None:
        """Stop :meth:`prepare`'s background work and wait for it to end.

        A run calls this when it ends, however it ends: a compile still running in XLA when
        the interpreter exits aborts the process (``FATAL: exception not rethrown``).
        """
        stop = getattr(self._kind, "stop_preparing", None)  # multi_tier prepares nothing
        if stop is not None:
            stop()

    def latest_step(self) -> int | None:
        """The newest committed step, or ``None``; saves still in flight do not count."""
        return self._kind.latest_step()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """Return ``(state, meta)`` of committed ``step``, on ``abstract_state``'s shardings."""
        _check_step(step)
        if self.kind == "orbax" and not self._kind.committed(step):
            raise ValueError(
                f"checkpoint step {step} is not committed in {self.directory}; "
                f"the newest committed step is {self.latest_step()}"
            )
        return self._kind.restore(int(step), abstract_state)

    def on_active_slices_changed(self, devices: list, mesh: Mesh) -> None:
        """Re-initialise multi-tier checkpointing for a new set of active slices.

        Call it on every attempt and scale-up: it initialises again only when the active
        slice count changed, and rebinds the manager when the mesh changed. A no-op for
        ``orbax``.
        """
        self._kind.on_active_slices_changed(devices, mesh)

    def close(self) -> None:
        """Wait for the last save and release the manager."""
        self._kind.close()
