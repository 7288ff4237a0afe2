"""The ``orbax`` checkpoint kind: an Orbax ``CheckpointManager`` on a directory or ``gs://`` path.

Each step is saved as two items, ``state`` (the arrays, ``StandardSave``) and ``meta`` (the
step, the data position and other small values, ``JsonSave``): nothing is pickled. Orbax
writes a step into ``<step>.orbax-checkpoint-tmp-<n>`` and renames it to ``<step>`` when it
commits (on ``gs://`` it writes ``commit_success.txt`` instead), and only then deletes the
checkpoints beyond ``max_to_keep``. A save cut short (the process SIGKILLed mid-write)
therefore leaves only a temporary directory, which is never listed and never costs the
previous checkpoint. A step directory counts as committed only when Orbax's step metadata
carries its commit timestamp and both items are present
(:func:`elastic_dew.elastic.state.orbax_step.committed`), so a partial or corrupt ``<step>`` directory is
skipped too. A restore reads the step's metadata once, Orbax's own read: only when it fails
is the metadata read again, to tell a step written by a model of another shape, refused
naming its leaves (:func:`another_shape`), from one that was damaged (:func:`unreadable`
says how to resume without it).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Collection
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.elastic.state import orbax_step
from elastic_dew.elastic.state.packing import abstract_key_data, rewrap_keys, unwrap_keys
from elastic_dew.elastic.state.storage import classify

__all__ = ["DamagedCheckpoint", "another_shape", "unreadable", "quarantine", "manager", "close_quietly",
           "check_bucket", "save", "restore"]

logger = logging.getLogger(__name__)

_STATE = orbax_step.STATE_ITEM
_META = orbax_step.META_ITEM


def _leaf_shapes(tree: Any) -> dict[str, tuple]:
    """``{"params/w": shape}``; key names only, so a namedtuple and the dict Orbax stores it as agree."""
    return {
        "/".join(re.findall(r"\w+", jax.tree_util.keystr(path))): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def another_shape(directory: epath.Path, step: int, abstract: Any) -> ValueError | None:
    """The refusal of committed ``step`` in ``directory`` when its stored metadata names leaves
    of another shape than ``abstract``'s (a checkpoint of another model: resume it with that
    model, or train in a new run directory); ``None`` when they agree or the metadata cannot
    be read (the step was damaged, :func:`unreadable`). Asked once a restore failed.
    """
    try:
        stored_shapes = _leaf_shapes(ocp.StandardCheckpointHandler().metadata(directory / str(step) / _STATE))
    except Exception:  # noqa: BLE001 - unreadable metadata is damage, found by the restore
        return None
    wanted = _leaf_shapes(abstract)
    differences = [
        f"{name} is {stored_shapes.get(name, 'absent')} there and {shape} in the model"
        for name, shape in wanted.items()
        if stored_shapes.get(name) != shape
    ]
    differences += [f"{name} is there and not in the model" for name in stored_shapes if name not in wanted]
    if not differences:
        return None
    return ValueError(
        f"checkpoint step {step} in {directory} was written by a model of "
        f"another shape ({'; '.join(differences[:3])}); resume it with the model "
        "that wrote it, or train this model in a new run directory"
    )


class DamagedCheckpoint(ValueError):
    """A committed step that cannot be read: its bytes were damaged after it was committed."""

    def __init__(self, message: str, step: int) -> None:
        super().__init__(message)
        self.step = step


def unreadable(directory: epath.Path, step: int, error: Exception) -> DamagedCheckpoint:
    """Why committed ``step`` in ``directory``, of the model's shapes, cannot be restored: it
    was damaged after it was committed. The fix: move it aside and resume from the previous
    committed step (named), or from step 1."""
    path = directory / str(step)
    older = [s for s in orbax_step.committed_checkpoint_steps(directory) if s < step]
    previous = (
        f"to resume from the previous committed checkpoint {older[-1]}"
        if older else "to start again from step 1"
    )
    return DamagedCheckpoint(
        f"checkpoint step {step} in {directory} is committed but cannot be read, so it "
        f"was damaged after it was written ({type(error).__name__}: {str(error)[:200]}); "
        f"move it aside (mv {path} {path}.damaged) {previous}",
        step,
    )


def quarantine(directory: epath.Path, step: int) -> epath.Path:
    """Move committed ``step``'s directory aside to ``<step>.damaged`` (``.damaged-2`` and on
    when taken), never deleting a byte; the new path. A name that is not a step number is
    never listed as a checkpoint."""
    source = directory / str(step)
    target = directory / f"{step}.damaged"
    n = 1
    while target.exists():
        n += 1
        target = directory / f"{step}.damaged-{n}"
    source.rename(target)
    return target


def manager(path: epath.Path, arrays: Any, max_to_keep: int) -> ocp.CheckpointManager:
    """Orbax's manager of ``path``, saving arrays through the array handler ``arrays``
    (building one creates the directory and lists it: call it inside a bounded storage call)."""
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=True)
    return ocp.CheckpointManager(
        path, options=options,
        item_handlers={_STATE: orbax_private.state_item_handler(arrays), _META: ocp.JsonCheckpointHandler()},
    )


def close_quietly(manager: ocp.CheckpointManager) -> None:
    """Close the manager of a failed save; a failure to close is logged at debug level only
    (the save's failure is already reported)."""
    try:
        manager.close()
    except Exception:  # noqa: BLE001 - the failure is already reported
        logger.debug("closing the checkpoint manager of a failed save failed", exc_info=True)


def check_bucket(directory: str) -> None:
    """On ``gs://``, list the bucket itself, so that a bucket that does not exist raises
    ``FileNotFoundError`` rather than reading as an empty directory that every save then
    fails to write (a listing of one object, which the job's ``roles/storage.objectUser``
    allows, where a bucket's metadata needs more). Nothing elsewhere."""
    if directory.startswith("gs://"):
        import fsspec

        bucket = directory[len("gs://"):].partition("/")[0]
        fsspec.filesystem("gs").ls(bucket, max_results=1)  # gcsfs: FileNotFoundError when missing


def save(manager: ocp.CheckpointManager, path: epath.Path, step: int, state: Any, meta_json: str,
         force: bool) -> None:
    """Start ``manager``'s save of ``step`` (newer than the newest committed one) into ``path``,
    clearing a partial ``<step>`` directory there first (never committed, as the step is newer)."""
    partial = path / str(step)
    if partial.exists() or os.path.islink(os.fspath(partial)):
        manager.wait_until_finished()
        logger.warning("removing uncommitted checkpoint directory %s", partial)
        if os.path.islink(os.fspath(partial)):
            os.unlink(os.fspath(partial))  # a link placed there: remove the link, never what it points to
        else:
            partial.rmtree()
        manager.reload()
    manager.save(
        step,
        args=ocp.args.Composite(
            **{_STATE: ocp.args.StandardSave(unwrap_keys(state)), _META: ocp.args.JsonSave(json.loads(meta_json))}
        ),
        force=force,
    )


def restore(manager: ocp.CheckpointManager, path: epath.Path, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """``(state, meta)`` of committed ``step`` in ``path`` through ``manager``, on ``abstract_state``'s shardings.

    The step's metadata is read once, by Orbax's restore; again only when that fails.

    Raises:
        ValueError: :func:`another_shape`'s refusal; a :class:`DamagedCheckpoint`
            (:func:`unreadable`) when the bytes cannot be read.
        OSError: the storage refused the read (the bytes may be whole).
    """
    abstract = abstract_key_data(abstract_state)
    try:
        restored = manager.restore(
            step, args=ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(abstract), _META: ocp.args.JsonRestore()})
        )
    except (ValueError, OSError) as error:
        if classify(error)[0] in ("full", "read_only", "permission"):
            raise  # the storage refused the read: the bytes may be whole
        refused = another_shape(path, step, abstract)
        if refused is not None:
            raise refused from None
        raise unreadable(path, step, error) from error
    return rewrap_keys(restored[_STATE], abstract_state), dict(restored[_META])
