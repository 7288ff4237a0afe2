"""Item 5: restore bandwidth of both tiers, over the measured memory copy bandwidth.

A state of ``restore_mb`` float32 is snapshotted from a mesh of two simulated slices of
one device and loaded onto one slice (what a slice loss does), and checkpointed to disk and
restored onto one device. Bandwidth is the state's bytes over the restore's wall time,
compared with ``numpy.copyto`` of the same bytes (a plain memory copy). The checkpoint was
just written, so it is read from the page cache: this is the restore path's own cost, not
the disk's. The three measurements alternate; each figure is the median over repeats.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import median

__all__ = ["measure"]


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from elastic_dew.elastic.checkpoints import Checkpoints
    from elastic_dew.elastic.slices import AXES
    from elastic_dew.elastic.snapshots import Snapshots
    from elastic_dew.rundir import CHECKPOINTS_DIR
    from elastic_dew.simulate import SimulatedSlices

    nbytes = sizes.restore_mb * 2**20
    n = nbytes // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)
    memcpy, snap, ckpt = [], [], []
    with SimulatedSlices(2, 1) as sim:
        two = Mesh(np.asarray(sim.devices[:2]).reshape(2, 1, 1), AXES)
        one = Mesh(np.asarray(sim.devices[:1]).reshape(1, 1, 1), AXES)
        abstract = {"w": jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(one, PartitionSpec()))}
        state = {"w": jax.device_put(jnp.ones(n, jnp.float32), NamedSharding(two, PartitionSpec()))}
        checkpoints = Checkpoints(str(workdir / CHECKPOINTS_DIR), max_to_keep=1)
        for repeat in range(1, sizes.restore_repeats + 1):
            t = time.perf_counter()
            np.copyto(dst, src)
            memcpy.append(time.perf_counter() - t)

            snapshots = Snapshots(replica_axis_index=0)
            snapshots.save(repeat, state, {"step": repeat}, two)
            snapshots.join()
            t = time.perf_counter()
            loaded, _, _ = snapshots.load(abstract)
            jax.block_until_ready(loaded)
            snap.append(time.perf_counter() - t)
            del loaded, snapshots

            checkpoints.save(repeat, state, {"step": repeat}, force=True)
            checkpoints.wait()
            t = time.perf_counter()
            restored, _ = checkpoints.restore(repeat, abstract)
            jax.block_until_ready(restored)
            ckpt.append(time.perf_counter() - t)
            del restored
        checkpoints.close()
        del state
    memcpy_bw = nbytes / median(memcpy)
    snap_bw = nbytes / median(snap)
    ckpt_bw = nbytes / median(ckpt)
    notes.append(
        f"Restore bandwidth: {sizes.restore_mb} MB state, {sizes.restore_repeats} repeats; memcpy "
        f"{memcpy_bw / 2**30:.2f} GiB/s, snapshot load {snap_bw / 2**30:.2f} GiB/s, checkpoint "
        f"restore {ckpt_bw / 2**30:.2f} GiB/s (checkpoint from the page cache)."
    )
    return {
        "memcpy_gib_s": memcpy_bw / 2**30,
        "snapshot_restore_gib_s": snap_bw / 2**30,
        "checkpoint_restore_gib_s": ckpt_bw / 2**30,
        "snapshot_restore_bw_over_memcpy": snap_bw / memcpy_bw,
        "checkpoint_restore_bw_over_memcpy": ckpt_bw / memcpy_bw,
    }
