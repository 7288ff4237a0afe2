"""A linear regression the protocol tests train: small, deterministic, and sensitive to
every example (``seen`` sums the example indices a state has trained on, so a skipped or
repeated example changes it)."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.slices.mesh import batch_sharding, replicated

FEATURES = 4
GLOBAL_BATCH = 24  # divisible by the data-parallel devices of 4, 3, 2 and 1 slices of 2


def config(tmp_path, **overrides) -> ElasticConfig:
    """The protocol tests' configuration: fast polls, snapshots every 2 steps, checkpoints
    every 5 under ``tmp_path``; ``overrides`` set any field."""
    values = dict(
        minimum_slice_count=1,
        poll_interval=0.05,
        timeout=60,
        max_attempts=10,
        global_batch=GLOBAL_BATCH,
        snapshot_every=2,
        checkpoint_every=5,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    values.update(overrides)
    return ElasticConfig(**values)


def dataset(n: int = 4096) -> grain.MapDataset:
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n, FEATURES)).astype(np.float32)
    ys = (xs @ np.arange(1, FEATURES + 1, dtype=np.float32)).astype(np.float32)
    return grain.MapDataset.range(n).map(lambda i: {"x": xs[i], "y": ys[i], "index": np.int32(i)})


class LinearProgram:
    """A linear regression trained by SGD: small, deterministic, and sensitive to every example."""

    microbatch = None  # no gradient accumulation

    def abstract_state(self, mesh):
        s = replicated(mesh)
        return {
            "w": jax.ShapeDtypeStruct((FEATURES,), jnp.float32, sharding=s),
            "seen": jax.ShapeDtypeStruct((), jnp.int32, sharding=s),
        }

    def init_state(self, mesh):
        s = replicated(mesh)
        return {"w": jax.device_put(jnp.zeros(FEATURES), s), "seen": jax.device_put(jnp.int32(0), s)}

    def compile(self, mesh, global_batch):
        def step(state, batch):
            def loss(w):
                return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)

            value, grad = jax.value_and_grad(loss)(state["w"])
            # "seen" sums example indices: a skipped or repeated example changes it.
            seen = state["seen"] + jnp.sum(batch["index"])
            return {"w": state["w"] - 0.05 * grad, "seen": seen}, {"loss": value}

        s = replicated(mesh)
        b = batch_sharding(mesh)
        batch = {
            "x": jax.ShapeDtypeStruct((global_batch, FEATURES), jnp.float32, sharding=b),
            "y": jax.ShapeDtypeStruct((global_batch,), jnp.float32, sharding=b),
            "index": jax.ShapeDtypeStruct((global_batch,), jnp.int32, sharding=b),
        }
        return jax.jit(step, out_shardings=(s, s)).lower(self.abstract_state(mesh), batch).compile()
