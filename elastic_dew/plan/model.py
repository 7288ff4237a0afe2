"""The analytic model of a run's goodput on a cluster whose slices fail: per policy, per cadence.

The cluster is the pool of :mod:`~elastic_dew.plan.pool`: ``slices + spares`` slices failing
and returning independently, so the slices down at any moment are binomial. Whole-job
preemptions each end in a checkpoint at SIGTERM (no work lost) and a restart after
``reschedule_minutes``.

The policies (:data:`~elastic_dew.plan.policy.POLICIES`), each at its
:class:`~elastic_dew.plan.policy.PolicySettings`:

- ``restart``: what a JobSet does without elastic training: a slice lost ends the whole job;
  it is rescheduled, restarted on ``slices`` healthy slices (a spare's, or it waits for the
  lost one) and restores the newest checkpoint; the steps since it are done again.
- ``pause_resume``: the controller stays up; a slice lost pauses the run until ``slices``
  slices are healthy again (a spare's at once), which then restores the newest in-memory
  snapshot; the steps since it are done again.
- ``replica_resize``: a slice lost is recovered in process from the snapshot and the run
  carries on with the slices left, as long as at least ``min_slices`` are healthy; a slice
  returning is scaled up into the run (no work lost).

A slice lost while a recovery is under way is met when the recovery ends, at the run's
first step, and costs a whole recovery more (with nothing to redo: the run is at its
restore point), so a recovery of ``c`` seconds costs ``c exp(h c)`` on average. That is
the simulator's rule (a fault due while the run recovers fires at its next step); on
Pathways a lost slice surfaces as the error of a later computation that touches it, the
restore's transfer or the first step (unverified without a cluster), and the two readings
differ only in the part of the interrupted recovery already spent, second order in ``h c``.

A pause-resume pause in which every other slice is lost too, before enough slices are
healthy again, has lost every copy of the in-memory snapshot (a returned slice holds
none): the run restores the newest checkpoint and redoes the steps since it
(:func:`~elastic_dew.plan.pool.snapshot_lost`).

Two figures per policy (:class:`PolicyOutcome`): ``goodput``, as ml-goodput-measurement defines it
(the productive step time over the wall time: a step on three of four slices is productive
time), and ``useful_work``, the examples trained over what every slice of the allocation,
healthy, would train in the same wall time (that step is three quarters of the work).
Only the step's own time is productive: a step's running time also holds its wait for the
batch and the loop's own time between steps (``data_wait_seconds`` and
``loop_overhead_seconds``), and the saves add theirs every so many steps.

The model is a renewal argument: the run's time is cut into cycles, each a stretch of
running (exponential, ended by a fault) and the recovery it ends in; a cycle's productive
time over its length is the goodput. Lost work is the running time since the restore point
the recovery goes back to, ``E[X mod tau]`` for an exponential ``X`` and the restore
points ``tau`` apart. A recovery of ``c`` seconds during which slices fail at rate ``h`` and
each failure met at its end costs a whole recovery more lasts ``c exp(h c)`` on average.
Replica-resize mixes the
cycles of each slice count the binomial gives, weighted by how often the pool has it. The
discrete-event simulation :mod:`elastic_dew.plan.des` runs the same cluster event by event;
the two agree within a point of goodput from 1 to 10,000 slices (``benchmarks``).

A recovery or scale-up of replica-resize onto a set of slices the process has not run on
compiles the step for its mesh, ``new_mesh_seconds`` more: given the run's ``steps``,
:func:`evaluate` adds the expected compiles of the sets it meets first over that run
(:func:`~elastic_dew.plan.pool.new_meshes`) to its wall time.

The cadences (:func:`best_cadence`): Young's first-order optimum ``sqrt(2 delta M)`` (``delta``
the save's cost, ``M`` the mean time between the faults that go back to that tier) is where
the search starts; the cadence reported is the model's own optimum over whole steps, so
the derivative of goodput in the cadence changes sign there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from elastic_dew.plan import pool
from elastic_dew.plan.inputs import Cluster, KnownCosts
from elastic_dew.plan.policy import PolicySettings, efficiency, running_per_step

__all__ = [
    "PolicyOutcome",
    "evaluate",
    "lost_running",
    "snapshot_gone",
    "checkpoint_restores",
    "young",
    "best_cadence",
    "recommend_min_slices",
    "MIN_SLICES_TOLERANCE",
]

#: The recommended ``min_slices`` is the highest floor whose useful work is within this
#: much of the lowest floor's (1 slice).
MIN_SLICES_TOLERANCE = 0.001


@dataclasses.dataclass(frozen=True)
class PolicyOutcome:
    """A policy's expected figures on a cluster.

    ``goodput``: productive step time over wall time. ``useful_work``: examples trained over
    what the whole healthy allocation would train in the same wall time. ``lost_seconds``:
    the expected step time done again per slice lost. ``downtime_seconds``: the expected
    time a slice loss stops the run (replica-resize: the recovery alone). ``faults_per_day``:
    slice losses and preemptions the run meets per day of wall time.

    Args:
        goodput: productive step time over wall time.
        useful_work: examples trained over what the healthy allocation would train.
        lost_seconds: step time done again per slice lost.
        downtime_seconds: time a slice loss stops the run.
        faults_per_day: slice losses and preemptions per day.
    """

    goodput: float
    useful_work: float
    lost_seconds: float
    downtime_seconds: float
    faults_per_day: float


def lost_running(tau: float, rate: float) -> float:
    """``E[X mod tau]`` for ``X`` exponential of ``rate``: the running time since the last
    restore point when a fault ends the run (``tau``: running time between restore points;
    ``inf``: none since the start)."""
    if rate <= 0:
        return tau / 2 if math.isfinite(tau) else math.inf
    if not math.isfinite(tau):
        return 1.0 / rate
    x = rate * tau
    if x < 1e-9:
        return tau / 2
    if x > 700:
        return 1.0 / rate
    return 1.0 / rate - tau / math.expm1(x)


def _cascade(c: float, h: float) -> tuple[float, float]:
    """A recovery of ``c`` seconds during which failures come at rate ``h``, a failure
    within it met at its end (the run's first step) and answered by a whole recovery more:
    its expected length counting the further recoveries, ``c exp(h c)``, and their expected
    number, ``expm1(h c)``."""
    if h <= 0 or c <= 0:
        return c, 0.0
    x = min(h * c, 700.0)
    return c * math.exp(x), math.expm1(x)


def evaluate(
    costs: KnownCosts,
    cluster: Cluster,
    settings: PolicySettings,
    *,
    steps: int | None = None,
) -> PolicyOutcome:
    """The expected :class:`PolicyOutcome` of a policy at its ``settings`` on ``cluster``, over
    a run of ``steps`` steps (``None``: the steady state, where a new set of slices' compile
    is paid once and counts for nothing).

    Args:
        costs: what the run's program costs.
        cluster: the cluster it runs on.
        settings: the recovery policy, its cadences and, for replica-resize, its floor.
        steps: the run's length in steps (``None``: the steady state).

    Returns:
        The policy's expected figures.

    Raises:
        ValueError: a cost the policy needs that is not known, or a ``min_slices`` outside
            ``1..slices``.
    """
    policy, min_slices = settings.policy, settings.min_slices
    missing = [name for name in _NEEDS[policy] if getattr(costs, name) is None]
    if missing:
        raise ValueError(f"the {policy} policy needs {', '.join(missing)}; give or measure them")
    r = pool.rates(cluster)
    n, spares = cluster.slices, cluster.spares
    e, tau_s, tau_c = efficiency(costs, settings)
    preempt_cost = (
        (costs.checkpoint_seconds or 0.0) + r.reschedule + costs.restart_seconds + costs.checkpoint_restore_seconds
    )
    if policy == "replica_resize":
        # A run shorter than the checkpoint cadence goes back to its start at the most.
        reach = min(tau_c, steps * running_per_step(costs, settings)) if steps is not None else tau_c
        out = _replica_resize(costs, cluster, r, e, (tau_s, reach), preempt_cost, min_slices or n)
        if steps is None or not costs.new_mesh_seconds or out.goodput <= 0:
            return out
        wall = steps * running_per_step(costs, settings) * e / out.goodput
        extra = costs.new_mesh_seconds * pool.new_meshes(cluster, r, min_slices or n, wall)
        share = wall / (wall + extra)
        return dataclasses.replace(out, goodput=out.goodput * share, useful_work=out.useful_work * share)
    ok, u, shortage = pool.shortage(n + spares, spares, r)
    if ok <= 0:
        return PolicyOutcome(0.0, 0.0, 0.0, math.inf, 0.0)
    h = n * r.alpha
    total = h + r.preempt
    if policy == "restart":
        tau, c = tau_c, costs.restart_seconds + costs.checkpoint_restore_seconds
        # The reschedule runs while the pool is short: the run waits for the longer of the two.
        wait = r.reschedule + (u * shortage * math.exp(-r.reschedule / shortage) if shortage > 0 else 0.0)
        lost = lost_running(tau, total)
    else:
        # A pause in which every slice that held the snapshot is lost too restores the
        # newest checkpoint instead.
        gone = u * pool.snapshot_lost(n, spares, r)
        restore = (1 - gone) * costs.snapshot_restore_seconds + gone * costs.checkpoint_restore_seconds
        tau, c = tau_s, costs.recovery_seconds + restore
        wait = u * shortage
        lost = (1 - gone) * lost_running(tau_s, total) + gone * lost_running(tau_c, total)
    recovery, restarts = _cascade(c, h)
    downtime = wait + recovery + restarts * u * shortage
    cycle = 1.0 / total + (h / total) * downtime + (r.preempt / total) * preempt_cost
    productive = e * (1.0 / total - (h / total) * lost)
    goodput = _clip(productive / cycle)
    faults = 86400.0 * (1.0 + (h / total) * restarts) / cycle
    return PolicyOutcome(goodput, goodput, e * lost, downtime, faults)


#: The costs each policy reads.
_NEEDS: dict[str, tuple[str, ...]] = {
    "restart": ("step_seconds", "checkpoint_seconds", "checkpoint_restore_seconds", "restart_seconds"),
    "pause_resume": ("step_seconds", "snapshot_seconds", "checkpoint_seconds", "snapshot_restore_seconds",
                     "checkpoint_restore_seconds", "recovery_seconds", "restart_seconds"),
    "replica_resize": ("step_seconds", "snapshot_seconds", "checkpoint_seconds", "snapshot_restore_seconds",
                       "checkpoint_restore_seconds", "recovery_seconds", "restart_seconds", "scale_up_seconds"),
}


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def snapshot_gone(costs: KnownCosts, cluster: Cluster, floor: int, tau_s: float) -> np.ndarray:
    """Replica-resize's share of a working slice's losses that lose every copy of the
    in-memory snapshot, per count of slices down (0 to ``slices + spares``), so the run
    restores the newest checkpoint and does again every step since it.

    Two ways: a loss that leaves fewer than ``floor`` slices healthy, after which the
    ``floor - 1`` left, which hold the snapshot, are lost too before enough slices are
    healthy again (:func:`~elastic_dew.plan.pool.snapshot_lost`; at a floor of one slice,
    always: the one slice held it); and, at a floor of one, the loss of one of two slices
    while the other, scaled up from the one, holds no snapshot yet: the scale-up and half
    a snapshot interval (``tau_s`` seconds of running) on average.

    Args:
        costs: what the run's program costs.
        cluster: the cluster it runs on.
        floor: replica-resize's ``min_slices``.
        tau_s: the running time between snapshots.

    Returns:
        The share, per count of slices down.
    """
    n, size = cluster.slices, cluster.slices + cluster.spares
    r = pool.rates(cluster)
    gone = np.zeros(size + 1)
    gone[size - floor] = pool.snapshot_lost(floor, size - floor, r)
    if floor == 1 and n >= 2 and math.isfinite(r.mu) and r.alpha > 0:
        pmf = pool.binomial(size, r.q)
        one, two = size - 1, size - 2
        if pmf[two] > 0:
            window = costs.scale_up_seconds + tau_s / 2
            # Scale-ups from one slice to two, per second, each open for `window`.
            risky = pmf[one] * one * r.mu * -math.expm1(-r.alpha * window)
            gone[two] += risky / (pmf[two] * 2 * r.alpha)
    return np.clip(gone, 0.0, 1.0)


def checkpoint_restores(costs: KnownCosts, cluster: Cluster, settings: PolicySettings) -> float:
    """How often, per second, a slice loss makes the policy restore the newest checkpoint:
    every loss for restart; for pause-resume and replica-resize, a loss that takes every
    copy of the in-memory snapshot (:func:`~elastic_dew.plan.pool.snapshot_lost`,
    :func:`snapshot_gone`). Preemptions, whose checkpoint is taken at SIGTERM, are not
    counted.

    Args:
        costs: what the run's program costs.
        cluster: the cluster it runs on.
        settings: the policy, its snapshot cadence and floor.

    Returns:
        Checkpoint restores per second of the run.
    """
    r = pool.rates(cluster)
    n, spares = cluster.slices, cluster.spares
    if settings.policy == "restart":
        return n * r.alpha
    if settings.policy == "pause_resume":
        _, u, _ = pool.shortage(n + spares, spares, r)
        return n * r.alpha * u * pool.snapshot_lost(n, spares, r)
    floor = settings.min_slices or n
    _, active, weight = pool.by_slices_down(cluster, r, floor)
    _, tau_s, _ = efficiency(costs, settings)
    gone = snapshot_gone(costs, cluster, floor, tau_s)
    return float((weight * active * r.alpha * gone).sum() / max(weight.sum(), 1e-300))


def _replica_resize(
    costs: KnownCosts, cluster: Cluster, r: pool.Rates, e: float, taus: tuple[float, float], preempt_cost: float,
    floor: int
) -> PolicyOutcome:
    n = cluster.slices
    if not 1 <= floor <= n:
        raise ValueError(f"min_slices={floor} must be between 1 and slices={n}")
    tau_s, reach = taus
    down, active, weight = pool.by_slices_down(cluster, r, floor)
    h = active * r.alpha
    # A loss that takes every copy of the snapshot restores the checkpoint and does again
    # the steps since it (at most the run's own, ``reach``).
    gone = snapshot_gone(costs, cluster, floor, tau_s)
    held = 1.0 - gone
    c = costs.recovery_seconds + held * costs.snapshot_restore_seconds + gone * costs.checkpoint_restore_seconds
    total = h + r.preempt
    x = np.minimum(h * c, 700.0)
    recovery = c * np.exp(x)
    # A return while the run is short of slices is scaled up into it.
    returns = np.where(active < n, down * (r.mu if math.isfinite(r.mu) else 0.0), 0.0)
    back = float((weight * h * gone).sum() / max(weight.sum(), 1e-300))  # as checkpoint_restores
    redone = lost_running(reach, back) if back > 0 else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        lost = held * np.array([lost_running(tau_s, t) for t in total]) + np.where(gone > 0, gone * redone, 0.0)
    # A slice lost during a scale-up ends it (the time so far is spent) in a recovery.
    cut = -np.expm1(-h * costs.scale_up_seconds)
    scale_up = np.where(h > 0, cut / np.where(h > 0, h, 1.0), costs.scale_up_seconds)
    with np.errstate(over="ignore"):  # a recovery that never ends: no goodput at that count
        overhead = h * recovery + returns * (scale_up + cut * recovery) + r.preempt * preempt_cost
    local = e * np.clip(1.0 - (h + returns * cut) * lost, 0.0, 1.0) / (1.0 + overhead)
    goodput = float((weight * local).sum())
    useful = float((weight * local * active / n).sum())
    faults = float((weight * total).sum()) * 86400.0
    lost_mean = float((weight * h * lost).sum() / max((weight * h).sum(), 1e-300)) * e
    down_mean = float((weight * h * recovery).sum() / max((weight * h).sum(), 1e-300))
    return PolicyOutcome(_clip(goodput), _clip(useful), lost_mean, down_mean, faults)


def young(save_seconds: float, mean_between_faults: float) -> float:
    """Young's optimum of the running time between saves, ``sqrt(2 delta M)``."""
    if not math.isfinite(mean_between_faults):
        return math.inf
    return math.sqrt(2.0 * save_seconds * mean_between_faults)


def best_cadence(score: Callable[[int], float], start: int, *, largest: int = 10**7) -> int:
    """The whole number of steps ``k >= 1`` where ``score(k)`` (unimodal) is highest,
    searched from ``start`` (Young's optimum): doubling outward to bracket it, then a
    golden-section search on whole numbers."""
    start = max(1, min(largest, int(start)))
    cache: dict[int, float] = {}

    def f(k: int) -> float:
        if k not in cache:
            cache[k] = score(k)
        return cache[k]

    lo, hi = start, start
    while lo > 1 and f(max(1, lo // 2)) >= f(lo):
        lo = max(1, lo // 2)
    while hi < largest and f(min(largest, hi * 2)) >= f(hi):
        hi = min(largest, hi * 2)
    lo, hi = max(1, lo // 2), min(largest, hi * 2)
    while hi - lo > 3:
        a = lo + (hi - lo) // 3
        b = hi - (hi - lo) // 3
        if f(a) < f(b):
            lo = a
        else:
            hi = b
    return max(range(lo, hi + 1), key=lambda k: (f(k), -k))


def recommend_min_slices(useful: Callable[[int], float], slices: int) -> int:
    """The highest floor whose useful work is within :data:`MIN_SLICES_TOLERANCE` of a
    floor of one slice (useful work does not grow with the floor: a higher floor only adds
    waits), found by bisection."""
    best = useful(1)
    lo, hi = 1, slices
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if useful(mid) >= best - MIN_SLICES_TOLERANCE:
            lo = mid
        else:
            hi = mid - 1
    return lo

