"""A Pathways program that trains on slice 0's devices only, whatever the allocation holds.

It imports nothing of elastic_dew: the proxy-boundary tests run it through the local
Pathways backend with a schedule that loses another slice, a loss it never meets.

    python one_slice.py STEPS
"""

import sys

import pathwaysutils

pathwaysutils.initialize()

import jax  # noqa: E402 - after initialize(), as Pathways programs do
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402


@jax.jit
def train_step(w):
    return w * 0.5 + 1.0


def main(steps: int) -> None:
    devices = [d for d in jax.devices() if d.slice_index == 0]
    mesh = Mesh(np.asarray(devices), ("data",))
    w = jax.device_put(jnp.zeros(32, jnp.float32), NamedSharding(mesh, PartitionSpec()))
    for step in range(1, steps + 1):
        w = train_step(w)
        print(f"step {step} {float(w[0]):.4f}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
