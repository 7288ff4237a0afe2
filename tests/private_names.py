"""The tests' seam: every private name of another library that only the tests use.

elastic_dew's own private names live in ``elastic_dew._compat``. These are the points inside
other libraries that a test must reach and no public API exposes: where Orbax commits a step
(to kill or pause a writer there), the ``jax`` its Snapshotter's transfers call (to slow
them), how it groups Pathways devices by worker, and the job time ml-goodput-measurement's
percentages are shares of. Each is declared once, as an
:class:`elastic_dew._compat.Private` with why and what would replace it, and a test uses it
through that declaration (``.get()``, ``.owner()``, ``.set()``), never by importing the
private module itself. ``tests/test_compat.py`` (the canary) checks every one with the
library's own, so an upgrade that moves one fails there, naming it; ``tests/test_layering.py``
refuses a private import of the libraries anywhere else in the tests.
"""

from __future__ import annotations

from typing import Any

from elastic_dew._compat import Private

__all__ = [
    "PRIVATE",
    "ORBAX_RENAME",
    "ORBAX_WRITE_TEXT",
    "ORBAX_STEP_CREATE",
    "ORBAX_STEP_FINALIZE",
    "ORBAX_STEP_METADATA_STORE",
    "SNAPSHOTTER_JAX",
    "ORBAX_WORKER_GROUPS",
    "GOODPUT_TOTAL_JOB_TIME",
]

_ASYNC_PATH = "orbax.checkpoint._src.path.async_path"
_STEP_PATH = "orbax.checkpoint._src.path.atomicity:CommitFileTemporaryPath"
_NO_HOOK = "a hook at each point of a step's commit in CheckpointManager (Orbax has none)"


def _step_path() -> Any:
    """One ``CommitFileTemporaryPath`` for the canary to look at (nothing is created)."""
    from etils import epath

    return ORBAX_STEP_CREATE.owner()(None, epath.Path("/nonexistent/1"))


ORBAX_RENAME = Private(
    "orbax-checkpoint",
    f"{_ASYNC_PATH}:rename",
    why="Orbax commits a step on a local disk by renaming its temporary directory into place "
    "through this function; tests/faultlib.py SIGKILLs the process at that rename",
    instead=_NO_HOOK,
    params=("src", "dst"),
)
ORBAX_WRITE_TEXT = Private(
    "orbax-checkpoint",
    f"{_ASYNC_PATH}:write_text",
    why="a step in a bucket is committed by writing its commit_success.txt through this "
    "function; tests/test_gcs_checkpoints.py pauses a writer there",
    instead=_NO_HOOK,
    params=("path", "text"),
)
ORBAX_STEP_CREATE = Private(
    "orbax-checkpoint",
    f"{_STEP_PATH}.create",
    why="creates a step's directory (and its metadata) in a bucket before any array is "
    "written; tests/test_gcs_checkpoints.py pauses a writer right after it",
    instead=_NO_HOOK,
)
ORBAX_STEP_FINALIZE = Private(
    "orbax-checkpoint",
    f"{_STEP_PATH}.finalize",
    why="records a bucket step's commit once its items are written; "
    "tests/test_gcs_checkpoints.py pauses a writer instead of it",
    instead=_NO_HOOK,
)
ORBAX_STEP_METADATA_STORE = Private(
    "orbax-checkpoint",
    f"{_STEP_PATH}._checkpoint_metadata_store",
    why="the step's metadata store, whose write the paused writer waits for so the step's "
    "metadata object exists when it pauses",
    instead=_NO_HOOK,
    probe=_step_path,
)
SNAPSHOTTER_JAX = Private(
    "orbax-checkpoint",
    "orbax.checkpoint.experimental.v1._src.training.pathways.snapshotter:jax",
    why="the jax module the Snapshotter's worker calls block_until_ready through; "
    "tests/test_protocol.py slows a snapshot's transfer to host memory there",
    instead="a Snapshotter that takes its transfer function, or a public way to slow a "
    "device-to-host copy",
)
ORBAX_WORKER_GROUPS = Private(
    "orbax-checkpoint",
    "orbax.checkpoint._src.multihost.pathways:group_devices_by_worker",
    why="how Orbax groups Pathways devices by worker (by slice): "
    "tests/test_simulate_pathways.py checks it sees the simulated slices",
    instead="none: Orbax exports no grouping of devices by worker",
    params=("devices",),
)

GOODPUT_TOTAL_JOB_TIME = Private(
    "ml-goodput-measurement",
    "ml_goodput_measurement.src.goodput_elastic:ElasticGoodputCalculator._get_total_job_time",
    why="the job time the library's goodput percentages are shares of; tests/goodputlib.py "
    "turns its badput percentages into seconds to compare with elastic_dew's",
    instead="badput in seconds, or the total job time, from get_job_goodput",
    params=("query_time",),
)

#: Every private name the tests use, for the canary.
PRIVATE: tuple[Private, ...] = (
    ORBAX_RENAME,
    ORBAX_WRITE_TEXT,
    ORBAX_STEP_CREATE,
    ORBAX_STEP_FINALIZE,
    ORBAX_STEP_METADATA_STORE,
    SNAPSHOTTER_JAX,
    ORBAX_WORKER_GROUPS,
    GOODPUT_TOTAL_JOB_TIME,
)
