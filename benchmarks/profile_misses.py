"""``python -m benchmarks.profile_misses [--out DIR]``: cProfile the paths behind missed targets.

Profiles, each on its own: an in-memory snapshot of the ``lm`` state every step (the
snapshot-cost target), a snapshot load and a checkpoint restore of a 256 MB state (the
restore-bandwidth targets). Writes ``DIR/<name>.prof`` and prints the top functions by
own time, so a claim about a bottleneck rests on a measurement.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
from pathlib import Path


def _report(name: str, profile: cProfile.Profile, out: Path, top: int = 18) -> None:
    profile.dump_stats(out / f"{name}.prof")
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    print(f"==== {name}: top {top} by own time ====")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-6000:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_misses")
    parser.add_argument("--out", default="benchmark-results/profiles")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from benchmarks.common import XLA_FLAGS
    from elastic_dew.runtime import prepare_process

    prepare_process(xla_flags=XLA_FLAGS)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from benchmarks.worker import lm_parts, lm_program
    from elastic_dew.elastic.state.checkpoints import Checkpoints
    from elastic_dew.elastic.slices.mesh import AXES, replicated
    from elastic_dew.elastic.state.snapshots import Snapshots
    from elastic_dew.simulate import SimulatedSlices

    parts = lm_parts()
    program = lm_program(parts)
    with SimulatedSlices(4, 2) as sim:
        mesh = Mesh(np.asarray(sim.devices).reshape(4, 2, 1), AXES)
        state = program.init_state(mesh)
        snapshots = Snapshots(replica_axis_index=0)
        snapshots.save(1, state, {"step": 1}, mesh)
        snapshots.join()
        profile = cProfile.Profile()
        profile.enable()
        for step in range(2, 32):
            state = jax.tree.map(lambda x: x + 0 if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
            snapshots.save(step, state, {"step": step}, mesh)
            snapshots.join()  # the next step's snapshot must not be skipped
        profile.disable()
        _report("snapshot_every_step", profile, out)

    n = 256 * 2**20 // 4
    with SimulatedSlices(2, 1) as sim, tempfile.TemporaryDirectory() as scratch:
        two = Mesh(np.asarray(sim.devices[:2]).reshape(2, 1, 1), AXES)
        one = Mesh(np.asarray(sim.devices[:1]).reshape(1, 1, 1), AXES)
        abstract = {"w": jax.ShapeDtypeStruct((n,), jnp.float32, sharding=NamedSharding(one, PartitionSpec()))}
        big = {"w": jax.device_put(jnp.ones(n, jnp.float32), replicated(two))}
        snapshots = Snapshots(replica_axis_index=0)
        snapshots.save(1, big, {"step": 1}, two)
        snapshots.join()
        profile = cProfile.Profile()
        profile.enable()
        jax.block_until_ready(snapshots.load(abstract)[0])
        profile.disable()
        _report("snapshot_load_256MB", profile, out)
        checkpoints = Checkpoints(str(Path(scratch) / "ckpt"), max_to_keep=1)
        checkpoints.save(1, big, {"step": 1}, force=True)
        checkpoints.wait()
        profile = cProfile.Profile()
        profile.enable()
        jax.block_until_ready(checkpoints.restore(1, abstract)[0])
        profile.disable()
        _report("checkpoint_restore_256MB", profile, out)
        checkpoints.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
