"""A user's elastic loop's set-up on the active slices, as code written against pathwaysutils
(imports nothing of elastic_dew): the loops of ``test_simulate_third_party`` (which announce
nothing) and ``test_simulate_clock`` (one that announces its phases) start from it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import manager


def replica_setup(elastic_manager: manager.Manager) -> tuple[Any, Any, NamedSharding, NamedSharding]:
    """A ``(replica, data)`` mesh over the active slices; returns a replicated zero vector of
    64, a ``jax.jit`` step ``w + x.mean()`` with replicated results, the replicated sharding
    and a batch sharding split over the replicas."""
    devices = [d for i in sorted(elastic_manager.active_slice_indices) for d in elastic_manager.slice_to_devices[i]]
    mesh = Mesh(np.asarray(devices).reshape(len(elastic_manager.active_slice_indices), -1), ("replica", "data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    w = jax.device_put(jnp.zeros((64,)), replicated)
    step_fn = jax.jit(lambda w, x: w + x.mean(), out_shardings=replicated)
    return w, step_fn, replicated, NamedSharding(mesh, PartitionSpec("replica"))
