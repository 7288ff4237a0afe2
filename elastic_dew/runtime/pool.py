"""Joining the JAX process pool, decided from what the scheduler left in the environment.

Every decision is made first, as a :class:`_PoolPlan`, from the environment alone: an
``elastic-dew launch`` pool (``DEW_*``), a Slurm step (one task forms no pool; several
tasks with fewer on this node than the GPUs its task sees are refused), mpirun, JAX's
cluster detection, or a Pathways single controller (``pathwaysutils.initialize()``, no
JAX pool). Only then is the pool joined. Most of this never runs under Pathways; it is
what a GPU box or a Slurm cluster needs.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import Any

from elastic_dew._compat import jax as jax_private

__all__: list[str] = []

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _PoolPlan:
    """How this process joins (or does not join) a pool: decided before anything changes."""

    action: str  # "none", "pathways", "dew", "detect"
    why: str
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    required: bool = False


def _int_env(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not an integer; fix the launcher") from None


def _slurm_tasks_on_node(env: Mapping[str, str]) -> int | None:
    """Tasks of this Slurm step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` ("2(x3),1")."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if spec:
        counts: list[int] = []
        for part in spec.split(","):
            m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
            if not m:
                return None
            counts += [int(m.group(1))] * int(m.group(2) or 1)
        node = int(env.get("SLURM_NODEID", "0") or 0)
        if 0 <= node < len(counts):
            return counts[node]
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    return int(per_node) if per_node and per_node.isdigit() else None


def _slurm_gpus_seen(env: Mapping[str, str]) -> int | None:
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    on_node = env.get("SLURM_GPUS_ON_NODE")
    return int(on_node) if on_node and on_node.isdigit() else None


def _pool_plan(multi_host: bool | None, env: Mapping[str, str], pathways: bool) -> _PoolPlan:
    """Decide how to join the pool from the environment a scheduler left."""
    if pathways:
        if multi_host:
            raise ValueError(
                "multi_host=True asks for a JAX process pool, but JAX_PLATFORMS names the "
                "Pathways proxy backend: a Pathways single controller forms no pool. "
                "Pass multi_host=None (or False) under Pathways."
            )
        return _PoolPlan("pathways", "JAX_PLATFORMS names the Pathways proxy backend")
    if multi_host is False:
        return _PoolPlan("none", "multi_host=False")
    if "DEW_PROCESS_COUNT" in env or "DEW_PROCESS_ID" in env:
        missing = [
            n
            for n in ("DEW_PROCESS_COUNT", "DEW_PROCESS_ID", "JAX_COORDINATOR_ADDRESS")
            if not env.get(n)
        ]
        if missing:
            raise ValueError(
                f"a launcher left DEW_PROCESS_COUNT/DEW_PROCESS_ID but not {missing}; "
                "start the ranks with `elastic-dew launch -n N -- CMD`, which sets all three"
            )
        count, rank = _int_env(env, "DEW_PROCESS_COUNT"), _int_env(env, "DEW_PROCESS_ID")
        if not 0 <= rank < count:
            raise ValueError(
                f"DEW_PROCESS_ID={rank} is outside the pool of DEW_PROCESS_COUNT={count}"
            )
        return _PoolPlan(
            "dew",
            f"elastic-dew launch rank {rank} of {count}",
            {
                "coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
                "num_processes": count,
                "process_id": rank,
                "cluster_detection_method": "deactivate",
            },
            required=True,
        )
    mpirun = "OMPI_MCA_orte_hnp_uri" in env  # what JAX's Open MPI detection reads
    slurm = all(
        n in env
        for n in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
    )
    if slurm and not mpirun:
        tasks = _int_env(env, "SLURM_NTASKS")
        if tasks == 1 and not multi_host:
            return _PoolPlan(
                "none",
                "a Slurm step of one task: no pool (pass multi_host=True to ask for one)",
            )
        if tasks > 1:
            on_node, gpus = _slurm_tasks_on_node(env), _slurm_gpus_seen(env)
            if on_node is not None and gpus is not None and on_node < gpus:
                raise ValueError(
                    f"this Slurm step runs {on_node} task(s) on this node, but its task sees "
                    f"{gpus} GPUs: JAX gives each task only the GPU at its SLURM_LOCALID, so "
                    f"{gpus - on_node} would sit idle. Run one task per GPU "
                    f"(srun --ntasks-per-node={gpus}), or one task in all and "
                    "`elastic-dew launch -n N` inside it."
                )
    return _PoolPlan("detect", "JAX cluster detection", required=bool(multi_host))


def _join_pool(plan: _PoolPlan) -> None:
    if plan.action == "pathways":
        import pathwaysutils

        logger.info("Pathways single controller: pathwaysutils.initialize(), no JAX pool")
        pathwaysutils.initialize()
        return
    if plan.action == "none":
        logger.debug("no JAX process pool: %s", plan.why)
        return
    import jax

    if jax.distributed.is_initialized():
        logger.debug("the JAX process pool is already joined")
        return
    try:
        jax.distributed.initialize(**plan.kwargs)
    except ValueError as err:
        if plan.action == "detect" and "coordinator_address" in str(err):
            if plan.required:
                raise RuntimeError(
                    "multi_host=True requires a JAX process pool, but no cluster environment "
                    f"names a coordinator ({err}). Start the ranks with a scheduler (Slurm, "
                    "mpirun, a TPU pod) or `elastic-dew launch -n N -- CMD`."
                ) from err
            logger.debug("single host: %s", err)
            return
        raise
    logger.info("joined the JAX process pool (%s)", plan.why)


def _pool_size() -> int:
    return jax_private.pool_size()
