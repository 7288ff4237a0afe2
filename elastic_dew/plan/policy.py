"""A recovery policy and the settings a plan evaluates it at: one :class:`PolicySettings`.

The model (:mod:`~elastic_dew.plan.model`), its discrete-event check
(:mod:`~elastic_dew.plan.des`), the retry budget (:mod:`~elastic_dew.plan.retry`) and the
check on finished runs (:mod:`~elastic_dew.plan.check`) all take a run's costs, the cluster
and one of these. It also holds the running time of a step at those cadences, the figure
each of them builds on.
"""

from __future__ import annotations

import dataclasses
import math

from elastic_dew.plan.inputs import KnownCosts

__all__ = ["POLICIES", "PolicySettings", "loop_seconds", "running_per_step", "efficiency"]

#: The policies a plan compares, in the order it lists them.
POLICIES: tuple[str, ...] = ("restart", "pause_resume", "replica_resize")


@dataclasses.dataclass(frozen=True)
class PolicySettings:
    """A recovery policy and its settings: the cadences (steps between saves; ``None`` or 0:
    never) and, for replica-resize, the floor of slices (``None``: every slice).

    Args:
        policy: the recovery policy, one of :data:`POLICIES`.
        snapshot_every: steps between snapshots (``None`` or 0: never).
        checkpoint_every: steps between checkpoints (``None`` or 0: never).
        min_slices: replica-resize's floor of slices (``None``: every slice).

    Raises:
        ValueError: an unknown policy.
    """

    policy: str
    snapshot_every: int | None = None
    checkpoint_every: int | None = None
    min_slices: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is not one of {', '.join(POLICIES)}")


def running_per_step(costs: KnownCosts, settings: PolicySettings) -> float:
    """The running time of one step of the loop at ``settings``' cadences, with its share of
    the saves."""
    per_step = loop_seconds(costs)
    if settings.snapshot_every:
        per_step += costs.snapshot_seconds / settings.snapshot_every
    if settings.checkpoint_every:
        per_step += costs.checkpoint_seconds / settings.checkpoint_every
    return per_step


def efficiency(costs: KnownCosts, settings: PolicySettings) -> tuple[float, float, float]:
    """The share of running time that is productive step time (not the wait for a batch,
    not the loop's own time between steps, not a save), and the running time between
    snapshots and between checkpoints (``inf`` when off)."""
    per_step = running_per_step(costs, settings)
    tau_s = settings.snapshot_every * per_step if settings.snapshot_every else math.inf
    tau_c = settings.checkpoint_every * per_step if settings.checkpoint_every else math.inf
    return costs.step_seconds / per_step, tau_s, tau_c


def loop_seconds(costs: KnownCosts) -> float:
    """The running time of one step of the loop, without saves: the step, its wait for the
    batch and the loop's own time between steps."""
    return costs.step_seconds + costs.data_wait_seconds + costs.loop_overhead_seconds
