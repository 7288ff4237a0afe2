"""A plan: each policy's expected figures at its recommended settings, and how they grow with N.

:func:`plan` takes the run's costs and the cluster and, for each policy with and without
spares, recommends the cadences (the model's own optimum, started from Young's), the
replica-resize floor (:func:`~elastic_dew.plan.model.recommend_min_slices`), and reports the
goodput, the useful-work fraction, the work lost per slice loss and the downtime, and for
the policies that ride slice losses in process the retry budget
(:func:`~elastic_dew.plan.retry.recommend`) that keeps a run of the planned length from
giving up; it recommends the row with the most useful work, and repeats each policy over
:data:`SLICE_GRID` (1 to 10,000 slices) for the picture of how they grow.
:meth:`PolicyPlan.elastic_settings` is a row as
:class:`~elastic_dew.elastic.config.ElasticConfig` fields, what a run that follows it sets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from elastic_dew.plan import model, pool, retry, validity
from elastic_dew.plan.inputs import Cluster, Costs, KnownCosts, known
from elastic_dew.plan.policy import POLICIES, PolicySettings, loop_seconds, running_per_step

__all__ = ["PolicyPlan", "Plan", "plan", "plan_policy", "planned_steps", "SLICE_GRID", "UNRIDDEN_PER_DAY",
           "PLANNED_SECONDS", "with_retry"]

#: The slice counts a plan's ``by_slices`` covers.
SLICE_GRID: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 10000)

#: The rate of whole-job faults the elastic policies' checkpoint cadence is set against when
#: no preemption rate is given: one a day.
UNRIDDEN_PER_DAY = 1.0

#: The planned run, when no length is given: a day of running.
PLANNED_SECONDS = 86400.0


@dataclasses.dataclass(frozen=True)
class PolicyPlan:
    """One policy's recommended settings and its expected figures there.

    ``snapshot_every`` is ``None`` for restart (it never reads a snapshot);
    ``min_slices`` is ``None`` but for replica-resize. ``young_snapshot_every`` and
    ``young_checkpoint_every`` are Young's first-order optima, beside the model's.
    ``lost_steps``: steps done again per slice loss. ``retry``: the retry budget
    (:class:`~elastic_dew.plan.retry.RetryBudget`; ``None`` for restart, whose slice
    loss ends the process, or a row planned without one). ``outside_checked_range``: why
    the row's rates are outside the range the model was checked over against real runs
    (:func:`~elastic_dew.plan.validity.outside`); empty inside it.

    Args:
        policy: the recovery policy (``restart``, ``pause-resume``, ``replica-resize``).
        spares: the hot spare slices the row counts.
        goodput: the expected goodput.
        useful_work: the expected useful work.
        snapshot_every: the recommended snapshot cadence, in steps.
        checkpoint_every: the recommended checkpoint cadence, in steps.
        min_slices: the recommended floor of slices (replica-resize).
        lost_seconds: the step time done again per slice loss.
        lost_steps: the steps done again per slice loss.
        downtime_seconds: the time a slice loss stops the run.
        faults_per_day: slice losses and preemptions per day.
        young_snapshot_every: Young's optimum of the snapshot cadence.
        young_checkpoint_every: Young's optimum of the checkpoint cadence.
        retry: the retry budget.
        outside_checked_range: why the figures are outside the checked range, if they are.
    """

    policy: str
    spares: int
    goodput: float
    useful_work: float
    snapshot_every: int | None
    checkpoint_every: int
    min_slices: int | None
    lost_seconds: float
    lost_steps: float
    downtime_seconds: float
    faults_per_day: float
    young_snapshot_every: int | None
    young_checkpoint_every: int
    retry: retry.RetryBudget | None = None
    outside_checked_range: tuple[str, ...] = ()

    def elastic_settings(self) -> dict[str, Any]:
        """The row's settings as :class:`~elastic_dew.elastic.config.ElasticConfig` fields:
        ``ElasticConfig(**row.elastic_settings(), ...)`` is a run that follows it (restart
        takes no snapshots; pause-resume leaves ``minimum_slice_count`` at ``None``).

        Returns:
            The ``ElasticConfig`` keywords."""
        out: dict[str, Any] = {"snapshot_every": self.snapshot_every or 0, "checkpoint_every": self.checkpoint_every}
        if self.min_slices is not None:
            out["minimum_slice_count"] = self.min_slices
        if self.retry is not None:
            out["max_attempts"] = self.retry.max_attempts
            out["retry_reset_steps"] = self.retry.retry_reset_steps
        return out

    def to_json(self) -> dict[str, Any]:
        """The row as JSON (``elastic-dew plan --json``'s ``policies``).

        Returns:
            The row's fields, JSON-ready.
        """
        out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
               for k, v in dataclasses.asdict(self).items() if k != "retry"}
        out["retry"] = None if self.retry is None else self.retry.to_json()
        out["outside_checked_range"] = list(self.outside_checked_range)
        out["elastic_settings"] = self.elastic_settings()
        return out


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every policy's plan (``policies``), the one recommended (the most useful work), and
    ``by_slices``: each policy's goodput and useful work over :data:`SLICE_GRID`.

    Args:
        policies: every policy's row, without and with spares.
        recommended: the row with the most useful work.
        by_slices: each policy's goodput and useful work at each slice count of the grid.
    """

    policies: tuple[PolicyPlan, ...]
    recommended: PolicyPlan
    by_slices: tuple[dict[str, Any], ...]


def _steps(seconds: float, step: float) -> int:
    if not math.isfinite(seconds):
        return 10**7
    return max(1, round(seconds / step))


def plan_policy(costs: KnownCosts, cluster: Cluster, policy: str, steps: int | None = None) -> PolicyPlan:
    """``policy`` on ``cluster`` at its recommended cadences (and floor), for a run of
    ``steps`` steps (``None``: :data:`PLANNED_SECONDS` of running): replica-resize's
    recoveries onto a set of slices new to the process cost ``new_mesh_seconds`` more."""
    if steps is None:
        steps = max(1, round(PLANNED_SECONDS / loop_seconds(costs)))
    r = pool.rates(cluster)
    running = loop_seconds(costs)  # a step's running time: Young's optimum in steps
    losses = cluster.slices * r.alpha
    between_losses = 1.0 / losses
    if policy == "restart":
        young_c = _steps(model.young(costs.checkpoint_seconds, between_losses), running)

        def score_c(k: int) -> float:
            return model.evaluate(costs, cluster, PolicySettings(policy, checkpoint_every=k)).goodput

        every_c = model.best_cadence(score_c, young_c)
        settings = PolicySettings(policy, checkpoint_every=every_c)
        outcome = model.evaluate(costs, cluster, settings)
        return _row(costs, cluster, settings, outcome, None, young_c)
    unridden = r.preempt if r.preempt > 0 else UNRIDDEN_PER_DAY / 86400.0
    every_c = _steps(model.young(costs.checkpoint_seconds, 1.0 / unridden), running)
    young_s = _steps(model.young(costs.snapshot_seconds, between_losses), running)
    floor = None
    if policy == "replica_resize":
        floor = _floor(costs, cluster, young_s, every_c, steps)
    # A slice loss that takes every copy of the snapshot goes back to the checkpoint too.
    back = model.checkpoint_restores(costs, cluster, PolicySettings(policy, young_s, every_c, floor))
    if back > 0:
        every_c = _steps(model.young(costs.checkpoint_seconds, 1.0 / (unridden + back)), running)
        if policy == "replica_resize":
            floor = _floor(costs, cluster, young_s, every_c, steps)
    young_c = every_c

    def score_s(k: int) -> float:
        return model.evaluate(costs, cluster, PolicySettings(policy, k, every_c, floor), steps=steps).useful_work

    every_s = model.best_cadence(score_s, young_s)
    if policy == "replica_resize":
        floor = _floor(costs, cluster, every_s, every_c, steps)
    settings = PolicySettings(policy, every_s, every_c, floor)
    outcome = model.evaluate(costs, cluster, settings, steps=steps)
    return _row(costs, cluster, settings, outcome, young_s, young_c)


def _floor(costs: KnownCosts, cluster: Cluster, every_s: int, every_c: int, steps: int | None = None) -> int:
    def useful(m: int) -> float:
        return model.evaluate(costs, cluster, PolicySettings("replica_resize", every_s, every_c, m),
                              steps=steps).useful_work

    return model.recommend_min_slices(useful, cluster.slices)


def _row(costs: KnownCosts, cluster: Cluster, settings: PolicySettings, outcome: model.PolicyOutcome,
         young_s: int | None, young_c: int) -> PolicyPlan:
    return PolicyPlan(
        policy=settings.policy, spares=cluster.spares, goodput=outcome.goodput, useful_work=outcome.useful_work,
        snapshot_every=settings.snapshot_every, checkpoint_every=settings.checkpoint_every or 0,
        min_slices=settings.min_slices, lost_seconds=outcome.lost_seconds,
        lost_steps=outcome.lost_seconds / costs.step_seconds, downtime_seconds=outcome.downtime_seconds,
        faults_per_day=outcome.faults_per_day, young_snapshot_every=young_s, young_checkpoint_every=young_c,
        outside_checked_range=validity.outside(costs, cluster, settings),
    )


def _settings(row: PolicyPlan) -> PolicySettings:
    return PolicySettings(row.policy, row.snapshot_every, row.checkpoint_every, row.min_slices)


def planned_steps(costs: KnownCosts, row: PolicyPlan) -> int:
    """The steps of :data:`PLANNED_SECONDS` of running at ``row``'s cadences."""
    return max(1, round(PLANNED_SECONDS / running_per_step(costs, _settings(row))))


def with_retry(costs: KnownCosts, cluster: Cluster, row: PolicyPlan, *, steps: int | None = None,
               max_give_up: float = retry.MAX_GIVE_UP,
               retry_reset_steps: int = retry.DEFAULT_RETRY_RESET_STEPS) -> PolicyPlan:
    """``row`` with its retry budget for a run of ``steps`` steps (``None``:
    :func:`planned_steps`); restart's row as it is."""
    if row.policy not in retry.RETRIED_POLICIES:
        return row
    budget = retry.recommend(costs, cluster, _settings(row), steps=steps or planned_steps(costs, row),
                             max_give_up=max_give_up,
                             retry_reset_steps=retry_reset_steps)
    return dataclasses.replace(row, retry=budget)


def plan(costs: Costs, cluster: Cluster, *, grid: Sequence[int] = SLICE_GRID, steps: int | None = None,
         max_give_up: float = retry.MAX_GIVE_UP, retry_reset_steps: int = retry.DEFAULT_RETRY_RESET_STEPS) -> Plan:
    """Each policy without spares and with ``cluster.spares`` of them (or, when none are
    given, with :func:`~elastic_dew.plan.pool.recommend_spares`), each in-process policy
    with its retry budget for a run of ``steps`` steps (``None``: a day's,
    :func:`planned_steps`) that gives up with probability at most ``max_give_up``, counting over
    ``retry_reset_steps``; the recommended row, and each policy over ``grid`` with the
    cluster's own spares.

    Args:
        costs: what the run's program costs.
        cluster: the cluster it runs on.
        grid: the slice counts of ``by_slices``.
        steps: the run's length for the retry budget (``None``: a day's).
        max_give_up: the probability at most of giving up that the retry budget allows.
        retry_reset_steps: the steps of progress that reset the retry count.

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: a cost a policy needs is not known, or a ``max_give_up`` outside (0, 1).
    """
    ready = known(costs)
    spares = cluster.spares or pool.recommend_spares(cluster)
    counts = sorted({0, spares})
    rows = tuple(
        with_retry(ready, dataclasses.replace(cluster, spares=k), plan_policy(ready, dataclasses.replace(
            cluster, spares=k), policy, steps), steps=steps, max_give_up=max_give_up,
            retry_reset_steps=retry_reset_steps)
        for k in counts for policy in POLICIES
    )
    best = max(rows, key=lambda row: (row.useful_work, -row.spares))
    by_slices = []
    for n in grid:
        sized = dataclasses.replace(cluster, slices=n)
        for policy in POLICIES:
            row = plan_policy(ready, sized, policy, steps)
            by_slices.append({"slices": n, "policy": policy, "goodput": row.goodput, "useful_work": row.useful_work,
                              "snapshot_every": row.snapshot_every, "checkpoint_every": row.checkpoint_every,
                              "min_slices": row.min_slices})
    return Plan(rows, best, tuple(by_slices))
