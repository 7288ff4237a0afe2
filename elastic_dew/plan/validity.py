"""The range of rates the model was checked over against real runs, and a plan's flag outside it.

The model (:mod:`~elastic_dew.plan.model`) was checked against runs of elastic_dew under the
simulator, each under schedules drawn from the rates it was given (``docs/plan.md``, "How it
was checked"). Those runs met a slice loss every :data:`FEWEST_STEPS_BETWEEN_LOSSES` steps or
more, with ``h c`` (the working slices' loss rate times a recovery) at most
:data:`HIGHEST_LOSSES_TIMES_RECOVERY`; closer together, one checked case (replica-resize with a
floor of one slice, a loss every 17 steps) trained more than 5 points below the model. Where
losses come that close, several slices are down at once, a loss lands on a set of slices whose
step was not compiled ahead of it, and a recovery shares the host with the compiles of the
meshes the next loss would need: costs whose spread the model's typical figures do not carry. A plan whose rates are outside the checked
range says so beside each figure, with the reason (:func:`outside`): the figure is the
model's, not a checked prediction.

Each figure is taken at the allocation's full slice count (the run's highest loss rate) and the
policy's cadences: ``steps_between_losses`` is ``1 / (h t)``, ``h`` the working slices' loss
rate and ``t`` a step's running time with its share of the saves; ``h c`` takes the recovery
the policy makes (in process from a snapshot, or a restart and a checkpoint's restore).
"""

from __future__ import annotations

import math

from elastic_dew.plan import pool
from elastic_dew.plan.inputs import Cluster, KnownCosts
from elastic_dew.plan.policy import PolicySettings, running_per_step

__all__ = ["FEWEST_STEPS_BETWEEN_LOSSES", "HIGHEST_LOSSES_TIMES_RECOVERY", "steps_between_losses",
           "losses_times_recovery", "outside"]

#: The checked runs met a slice loss every this many steps or more.
FEWEST_STEPS_BETWEEN_LOSSES = 45.0

#: The checked runs' ``h c``, the working slices' loss rate times a recovery, was at most this.
HIGHEST_LOSSES_TIMES_RECOVERY = 0.4


def _loss_rate(cluster: Cluster) -> float:
    return cluster.slices * pool.rates(cluster).alpha


def steps_between_losses(costs: KnownCosts, cluster: Cluster, settings: PolicySettings) -> float:
    """The mean steps between two slice losses of the allocation's ``slices`` working slices
    (``inf`` when slices never fail).

    Args:
        costs: what the run's program costs.
        cluster: the cluster it runs on.
        settings: the policy and its cadences (a step's running time holds its saves).

    Returns:
        Steps between losses.
    """
    rate = _loss_rate(cluster)
    return math.inf if rate <= 0 else 1.0 / (rate * running_per_step(costs, settings))


def losses_times_recovery(costs: KnownCosts, cluster: Cluster, settings: PolicySettings) -> float:
    """``h c``: the working slices' loss rate times one recovery of the policy (restart: a new
    process and the checkpoint's restore; the others: the in-process recovery and the
    snapshot's restore).

    Args:
        costs: what the run's program costs.
        cluster: the cluster it runs on.
        settings: the policy.

    Returns:
        The expected losses during one recovery.
    """
    if settings.policy == "restart":
        recovery = costs.restart_seconds + costs.checkpoint_restore_seconds
    else:
        recovery = costs.recovery_seconds + costs.snapshot_restore_seconds
    return _loss_rate(cluster) * recovery


def outside(costs: KnownCosts, cluster: Cluster, settings: PolicySettings) -> tuple[str, ...]:
    """Why the policy's figures at these rates are outside the range the model was checked
    over, one reason a line; none when inside it.

    Args:
        costs: what the run's program costs.
        cluster: the cluster it runs on.
        settings: the policy and its cadences.

    Returns:
        The reasons (empty: inside the checked range).
    """
    reasons = []
    between = steps_between_losses(costs, cluster, settings)
    if between < FEWEST_STEPS_BETWEEN_LOSSES:
        reasons.append(f"a slice loss every {between:.3g} steps; the model was checked against runs that met one "
                       f"every {FEWEST_STEPS_BETWEEN_LOSSES:g} steps or more")
    hc = losses_times_recovery(costs, cluster, settings)
    if hc > HIGHEST_LOSSES_TIMES_RECOVERY:
        reasons.append(f"{hc:.3g} slice losses during one recovery on average (h c); the model was checked up to "
                       f"{HIGHEST_LOSSES_TIMES_RECOVERY:g}")
    return tuple(reasons)
