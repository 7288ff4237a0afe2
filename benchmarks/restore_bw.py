"""Item 5: restore bandwidth of both tiers, over the measured memory copy bandwidth.

A state of ``restore_mb`` float32 is snapshotted from a mesh of two simulated slices of
one device and loaded onto one slice (what a slice loss does), and checkpointed to disk and
restored onto one device. Bandwidth is the state's bytes over the restore's wall time,
compared with ``numpy.copyto`` of the same bytes (a plain memory copy). The checkpoint was
just written, so it is read from the page cache: this is the restore path's own cost, not
the disk's. The measurements alternate, and each restore and the primitive set against it
run in turn first. On the VM of ``docs/performance.md`` filling memory the process has not
used for a few seconds costs anywhere from nothing to several times the copy itself (most
likely the host taking freed memory back), which moved a median of five by a factor of two
between runs. So before each timed call three times the state's bytes are written and freed
(the allocations that follow get memory the host backs, as an accelerator's allocator holds
its own), and each figure is the fastest repeat (every repeat's seconds are in
``restore_bw_seconds_all``).

A restore has to write its bytes into memory the process has not used before (the new
arrays' buffers), and ``numpy.copyto`` into a buffer already written does not: on the CPU
client every large device buffer is a fresh allocation whose pages the kernel maps at
first touch, which on this VM costs several times the copy itself. So the restores are
also set against a copy into a fresh buffer (``numpy.empty`` then ``copyto``, freed after:
``memcpy_fresh_gib_s``). An accelerator's allocator hands out memory it already holds.

Each restore is also set against the one step of it that elastic_dew does not own, measured
beside it on the same bytes, so the ratio says how much the path adds around that step:

* the snapshot load against XLA's own copy of the bytes from ``pinned_host`` to device
  memory (``jax.device_put`` between the memory kinds, the copy every snapshot load ends
  with: a DMA on an accelerator, XLA's CPU client's copy here);
* the checkpoint restore against Orbax reading the same checkpoint as numpy arrays
  (TensorStore's read from the page cache, nothing placed on a device).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["measure"]


def _timed(call) -> tuple[Any, float]:
    import jax

    start = time.perf_counter()
    result = call()
    jax.block_until_ready(result)
    return result, time.perf_counter() - start


def _touch(nbytes: int) -> None:
    """Write ``nbytes`` of new memory and free it: the next allocations get pages the host
    backs (see the module), whichever call comes next."""
    import numpy as np

    np.ones(nbytes // 8)


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from elastic_dew.elastic.state.checkpoints import Checkpoints
    from elastic_dew.elastic.slices.mesh import AXES
    from elastic_dew.elastic.state.snapshots import Snapshots
    from elastic_dew.rundir import CHECKPOINTS_DIR
    from elastic_dew.simulate import SimulatedSlices

    nbytes = sizes.restore_mb * 2**20
    n = nbytes // 4
    src = np.ones(n, np.float32)
    dst = np.ones(n, np.float32)  # written once, so the timed copies fault in no page
    memcpy, fresh, snap, transfer, ckpt, read = [], [], [], [], [], []
    with SimulatedSlices(2, 1) as sim:
        two = Mesh(np.asarray(sim.devices[:2]).reshape(2, 1, 1), AXES)
        one = Mesh(np.asarray(sim.devices[:1]).reshape(1, 1, 1), AXES)
        on_one = NamedSharding(one, PartitionSpec())
        abstract = {"w": jax.ShapeDtypeStruct((n,), jnp.float32, sharding=on_one)}
        state = {"w": jax.device_put(jnp.ones(n, jnp.float32), NamedSharding(two, PartitionSpec()))}
        pinned = jax.device_put(jnp.ones(n, jnp.float32), on_one.with_memory_kind("pinned_host"))
        checkpoints = Checkpoints(str(workdir / CHECKPOINTS_DIR), max_to_keep=1)
        as_numpy = ocp.args.Composite(state=ocp.args.StandardRestore({"w": np.zeros(n, np.float32)}))
        for repeat in range(1, sizes.restore_repeats + 1):
            start = time.perf_counter()
            np.copyto(dst, src)
            memcpy.append(time.perf_counter() - start)
            start = time.perf_counter()
            into = np.empty(n, np.float32)
            np.copyto(into, src)
            fresh.append(time.perf_counter() - start)
            del into

            snapshots = Snapshots(replica_axis_index=0)
            snapshots.save(repeat, state, {"step": repeat}, two)
            snapshots.join()
            checkpoints.save(repeat, state, {"step": repeat}, force=True)
            checkpoints.wait()
            # Each restore and its primitive run in turn first (see the module).
            pairs = [
                (snap, lambda: snapshots.load(abstract)[0]),
                (transfer, lambda: jax.device_put(pinned, on_one)),
                (ckpt, lambda: checkpoints.restore(repeat, abstract)[0]),
                (read, lambda: checkpoints.manager.restore(repeat, args=as_numpy)["state"]),
            ]
            for times, call in pairs if repeat % 2 else [pairs[1], pairs[0], pairs[3], pairs[2]]:
                _touch(3 * nbytes)
                result, seconds = _timed(call)
                times.append(seconds)
                del result
            del snapshots
        checkpoints.close()
        del state, pinned
    gib_s = lambda seconds: nbytes / min(seconds) / 2**30  # noqa: E731 - the fastest repeat (see the module)
    memcpy_bw, fresh_bw, snap_bw, transfer_bw, ckpt_bw, read_bw = map(
        gib_s, (memcpy, fresh, snap, transfer, ckpt, read)
    )
    notes.append(
        f"Restore bandwidth: {sizes.restore_mb} MB state, the fastest of {sizes.restore_repeats} repeats; memcpy "
        f"{memcpy_bw:.2f} GiB/s ({fresh_bw:.2f} GiB/s into a fresh buffer), snapshot load {snap_bw:.2f} GiB/s (XLA's pinned_host-to-device "
        f"copy alone {transfer_bw:.2f} GiB/s), checkpoint restore {ckpt_bw:.2f} GiB/s (Orbax's "
        f"read of it as numpy alone {read_bw:.2f} GiB/s; checkpoint from the page cache)."
    )
    return {
        "restore_bw_seconds_all": {name: [round(x, 4) for x in times] for name, times in (
            ("memcpy", memcpy), ("fresh_memcpy", fresh), ("snapshot_restore", snap), ("host_to_device", transfer),
            ("checkpoint_restore", ckpt), ("numpy_read", read))},
        "memcpy_gib_s": memcpy_bw,
        "memcpy_fresh_gib_s": fresh_bw,
        "snapshot_restore_gib_s": snap_bw,
        "checkpoint_restore_gib_s": ckpt_bw,
        "host_to_device_gib_s": transfer_bw,
        "checkpoint_read_numpy_gib_s": read_bw,
        "snapshot_restore_bw_over_memcpy": snap_bw / memcpy_bw,
        "checkpoint_restore_bw_over_memcpy": ckpt_bw / memcpy_bw,
        "snapshot_restore_bw_over_fresh_memcpy": snap_bw / fresh_bw,
        "checkpoint_restore_bw_over_fresh_memcpy": ckpt_bw / fresh_bw,
        "host_to_device_bw_over_memcpy": transfer_bw / memcpy_bw,
        "snapshot_restore_bw_over_host_to_device": snap_bw / transfer_bw,
        "checkpoint_restore_bw_over_numpy_read": ckpt_bw / read_bw,
        # its primitive: Orbax's numpy read, then one host-to-device copy of the same bytes
        "checkpoint_restore_bw_over_read_then_copy": ckpt_bw * (1 / read_bw + 1 / transfer_bw),
    }
