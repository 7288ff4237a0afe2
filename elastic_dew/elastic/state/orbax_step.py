"""An Orbax step directory of the persistent tier: its two items, and when it is committed.

The persistent tier (:mod:`~elastic_dew.elastic.state.orbax_kind`) saves each step as two
items, ``state`` (the arrays) and ``meta`` (JSON). A step directory is *committed* when
Orbax has written its commit timestamp into ``_CHECKPOINT_METADATA`` and both items exist; a
step without them is an interrupted save and is never restored. This module is that rule's
one home: the checkpoints restore by it, and the chaos harness and the benchmarks count steps
by it. It imports nothing heavier than ``json``, so a reader of a run directory can use it
without Orbax or JAX.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "STATE_ITEM",
    "META_ITEM",
    "ITEMS",
    "ORBAX_METADATA",
    "COMMIT_SUCCESS",
    "committed",
    "committed_checkpoint_steps",
    "newest_committed_step",
    "ABANDONED_FILE",
    "read_abandoned",
    "record_abandoned",
]

#: The item of a step holding the arrays (Orbax's ``StandardSave``).
STATE_ITEM = "state"
#: The item of a step holding its JSON ``meta`` (step, data position, ...).
META_ITEM = "meta"
#: Every item a committed step holds.
ITEMS = (STATE_ITEM, META_ITEM)
#: Orbax's per-step metadata file, which carries the commit timestamp.
ORBAX_METADATA = "_CHECKPOINT_METADATA"
#: Orbax's marker of a finalized step written in place (``gs://``).
COMMIT_SUCCESS = "commit_success.txt"
#: In the run directory: the steps whose save was given up on (a stalled or failing storage),
#: a JSON list of step numbers. Such a step is never restored, even if its writes land later.
ABANDONED_FILE = "abandoned_checkpoints.json"


def committed(step_dir: Any) -> bool:
    """Whether one Orbax step directory is committed (any ``pathlib``-like path, ``epath`` too).

    Its step metadata carries the commit timestamp and both items are present. On ``gs://``,
    where Orbax writes a step in place (no rename) and records the commit timestamp just
    before it writes ``commit_success.txt``, that file must be there too: Orbax's own rule
    for a finalized step, so a controller killed between the two leaves a step that neither
    Orbax nor this function counts.
    """
    try:
        metadata = json.loads((step_dir / ORBAX_METADATA).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(metadata, dict) or not metadata.get("commit_timestamp_nsecs"):
        return False
    if str(step_dir).startswith("gs://") and not (step_dir / COMMIT_SUCCESS).exists():
        return False
    return all((step_dir / item).exists() for item in ITEMS)


def committed_checkpoint_steps(directory: Any, *, abandoned: Iterable[int] = ()) -> list[int]:
    """The committed Orbax steps under a checkpoint directory, oldest first, less the steps
    ``abandoned`` names (a save given up on whose writes landed later:
    :func:`elastic_dew.rundir.read_abandoned`). The step lines the run record counts as
    committed are :func:`elastic_dew.record.committed_step_lines`."""
    if not directory.exists():
        return []
    fenced = set(abandoned)
    steps = (int(p.name) for p in directory.iterdir() if p.name.isdigit())
    return sorted(step for step in steps if step not in fenced and committed(directory / str(step)))


def newest_committed_step(directory: Any, *, abandoned: Iterable[int] = ()) -> int | None:
    """The newest committed Orbax step under a checkpoint directory, less the steps
    ``abandoned`` names, or ``None``: one listing, and the step metadata read from the
    newest step down until one is committed (one read when the newest is)."""
    if not directory.exists():
        return None
    fenced = set(abandoned)
    steps = sorted((int(p.name) for p in directory.iterdir() if p.name.isdigit()), reverse=True)
    return next((step for step in steps if step not in fenced and committed(directory / str(step))), None)


def read_abandoned(run_dir: str | os.PathLike[str] | None) -> set[int]:
    """The steps :func:`record_abandoned` recorded in ``run_dir`` (none without one)."""
    if run_dir is None:
        return set()
    try:
        steps = json.loads((Path(run_dir) / ABANDONED_FILE).read_text())
    except (OSError, ValueError):
        return set()
    return {int(step) for step in steps if isinstance(step, int)} if isinstance(steps, list) else set()


def record_abandoned(run_dir: str | os.PathLike[str], step: int) -> None:
    """Add ``step`` to ``run_dir``'s record of abandoned saves, whole or not at all (a
    temporary file, fsynced, renamed over it)."""
    path = Path(run_dir) / ABANDONED_FILE
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(json.dumps(sorted(read_abandoned(run_dir) | {int(step)})).encode())
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
