"""Checkpoint save and restore bandwidth: a local Cloud Storage server beside the local disk.

A state of ``restore_mb`` random float32 (incompressible, so OCDBT's compression does not
flatter it) on one CPU device is saved by tier 2 (``Checkpoints``: Orbax's
``CheckpointManager``, timed from ``save`` to the commit of ``wait``) and restored onto the
same device, to a directory on the local disk and to ``gs://`` on fake-gcs-server on
127.0.0.1 (its memory backend: :class:`elastic_dew.testing.gcs_server.GCSServer`), through
TensorStore's ``gcs`` driver and gcsfs exactly as a run against a bucket. The two alternate;
each figure is the median over ``restore_repeats``. The disk's figures come mostly from the
page cache (the checkpoint was just written); the server's include HTTP over loopback and the
server's own copy, and no network: a real bucket is slower per stream and scales with
parallel streams, which one loopback server does not show.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks.common import median

__all__ = ["measure"]


def _round(checkpoints, step: int, state, abstract) -> tuple[float, float]:
    import jax

    t = time.perf_counter()
    checkpoints.save(step, state, {"step": step}, force=True)
    checkpoints.wait()
    saved = time.perf_counter() - t
    t = time.perf_counter()
    restored, _ = checkpoints.restore(step, abstract)
    jax.block_until_ready(restored)
    return saved, time.perf_counter() - t


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import SingleDeviceSharding

    from elastic_dew.elastic.state.checkpoints import Checkpoints
    from elastic_dew.runtime import use_local_bucket
    from elastic_dew.runtime.local_bucket import EMULATOR_ENV, local_bucket_env
    from elastic_dew.testing.gcs_server import GCSServer

    nbytes = sizes.restore_mb * 2**20
    sharding = SingleDeviceSharding(jax.devices()[0])
    values = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    state = {"w": jax.device_put(values, sharding)}
    abstract = {"w": jax.ShapeDtypeStruct(values.shape, jnp.float32, sharding=sharding)}
    times: dict[str, list[float]] = {k: [] for k in ("disk_save", "disk_restore", "gcs_save", "gcs_restore")}
    with GCSServer(workdir / "fake-gcs-server.log") as server:
        for name in local_bucket_env({EMULATOR_ENV: server.url}):
            os.environ.pop(name, None)  # set for another server (an inherited environment)
        os.environ.update(server.env)
        use_local_bucket()
        bucket = server.create_bucket("elastic-dew-bench")
        disk = Checkpoints(str(workdir / "disk"), max_to_keep=1)
        gcs = Checkpoints(f"{bucket}/checkpoints", max_to_keep=1)
        for step in range(1, sizes.restore_repeats + 1):
            for name, checkpoints in (("disk", disk), ("gcs", gcs)):
                saved, restored = _round(checkpoints, step, state, abstract)
                times[f"{name}_save"].append(saved)
                times[f"{name}_restore"].append(restored)
        disk.close()
        gcs.close()
    gib = {k: nbytes / median(v) / 2**30 for k, v in times.items()}
    notes.append(
        f"Checkpoint bandwidth: {sizes.restore_mb} MB of random float32 on one device, "
        f"{sizes.restore_repeats} alternating rounds; save (to the commit) and restore, local disk "
        f"{gib['disk_save']:.2f} / {gib['disk_restore']:.2f} GiB/s, gs:// on fake-gcs-server over "
        f"loopback {gib['gcs_save']:.2f} / {gib['gcs_restore']:.2f} GiB/s (the disk's from the page "
        "cache; the server's include HTTP and its own copy, and no network)."
    )
    return {
        "checkpoint_save_disk_gib_s": gib["disk_save"],
        "checkpoint_restore_disk_gib_s": gib["disk_restore"],
        "checkpoint_save_gcs_gib_s": gib["gcs_save"],
        "checkpoint_restore_gcs_gib_s": gib["gcs_restore"],
        "checkpoint_save_gcs_over_disk": gib["gcs_save"] / gib["disk_save"],
        "checkpoint_restore_gcs_over_disk": gib["gcs_restore"] / gib["disk_restore"],
    }
