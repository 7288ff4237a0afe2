"""Where the persistent checkpoint tier may write when Pathways persistence is on.

With ``JAX_PLATFORMS`` naming ``proxy`` and ``ENABLE_PATHWAYS_PERSISTENCE=1``,
``pathwaysutils.initialize()`` (``pathwaysutils/_initialize.py``) registers Orbax's
``CloudPathwaysArrayHandler`` as the handler of every ``jax.Array``. That handler does not
write arrays from the controller: it sends the checkpoint directory to a Pathways plugin
program (``pathwaysutils/persistence/helper.py``, ``write_arrays``: a
``persistenceWriteRequest`` carrying ``b64_location``) that runs on the TPU workers, and each
worker writes its shards to that location itself. Only the metadata is written by the
controller. A directory that exists only in the controller's pod (a local disk, or a Cloud
Storage FUSE mount such as ``/gcs/...``) therefore gives a checkpoint that looks committed and
holds no arrays. The workers can all reach a ``gs://`` URL, which is why MaxText writes its
checkpoints to one.

``checkpoint_dir_problem`` is the check, as a pure function of the directory and the
environment, so the train command can refuse a bad combination before anything is touched.
It concerns Orbax's ordinary persistent tier; the multi-tier kind writes into the workers'
own local volume on purpose (through their colocated-Python sidecars) and is not checked here.
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_dew.settings import mention

__all__ = ["PERSISTENCE_ENV", "persistence_enabled", "checkpoint_dir_problem"]

#: The variable pathwaysutils reads to install its Pathways array handler ("1", "0" or unset).
PERSISTENCE_ENV = "ENABLE_PATHWAYS_PERSISTENCE"


def persistence_enabled(env: Mapping[str, str]) -> bool:
    """Whether pathwaysutils would install its Pathways array handler under ``env``: the
    proxy backend is in ``JAX_PLATFORMS`` and ``ENABLE_PATHWAYS_PERSISTENCE`` is ``1``."""
    platforms = env.get("JAX_PLATFORMS", "") or ""
    return "proxy" in platforms and env.get(PERSISTENCE_ENV) == "1"


def checkpoint_dir_problem(checkpoint_dir: str, env: Mapping[str, str]) -> str | None:
    """None when the persistent tier can write to ``checkpoint_dir`` under ``env``, else a
    message that says what is wrong and how to fix it, naming the setting with
    :func:`~elastic_dew.settings.mention` (a :class:`~elastic_dew.settings.SettingError` of
    ``checkpoint_dir`` words it).

    ``checkpoint_dir`` is the directory the tier will really use (the default included, e.g.
    ``RUN_DIR/checkpoints``); ``env`` is the process environment (``os.environ``).
    """
    value = env.get(PERSISTENCE_ENV)
    if value is not None and value not in ("0", "1"):
        return (f"{PERSISTENCE_ENV}={value!r} is not understood (pathwaysutils accepts only 1, 0 or "
                "unset, and raises at start-up otherwise); set it to 1 to let the TPU workers write "
                "checkpoint arrays to a gs:// directory, or to 0")
    if not persistence_enabled(env):
        return None
    if checkpoint_dir.startswith("gs://"):
        bucket = checkpoint_dir[len("gs://"):].partition("/")[0]
        if bucket:
            return None
        return (f"{mention('checkpoint_dir', checkpoint_dir)} names no bucket; "
                f"give {mention('checkpoint_dir', 'gs://BUCKET/runs/NAME/checkpoints')}")
    return (f"{mention('checkpoint_dir', checkpoint_dir)} is not a gs:// URL, but {PERSISTENCE_ENV}=1 under "
            "JAX_PLATFORMS=proxy makes the TPU workers write the checkpoint arrays themselves "
            "(pathwaysutils' Pathways array handler), and the workers cannot see a directory of "
            "this pod (a local disk or a Cloud Storage FUSE mount): the checkpoint would hold "
            f"metadata and no arrays. Give {mention('checkpoint_dir', 'gs://BUCKET/runs/NAME/checkpoints')}, "
            f"or set {PERSISTENCE_ENV}=0 to write through the controller")
