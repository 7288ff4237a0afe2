"""A discrete-event simulation of the cluster the analytic model describes, event by event.

The same pool as :mod:`elastic_dew.plan.pool` (``slices + spares`` slices failing and
returning independently, exponentially; preemptions as a Poisson process while the job
runs) and the same policies as :mod:`elastic_dew.plan.model`, followed one fault at a
time: which slice fails is drawn among the healthy ones (a working slice, or an idle
spare), a recovery that a working slice's loss falls in is followed, when it ends, by a
whole recovery more (the model's and the simulator's rule: one such loss a recovery,
since the next fault counts from it), lost work is the running time since the last
restore point, and the wall time, the productive step time and the examples trained add
up as the run goes. Seeded and deterministic: the same inputs and seed give the same
figures.

It also follows the retry budget of ``elastic_retry`` as
:class:`~elastic_dew.elastic.slices.retry.SliceLossRetryLimit` counts it (:func:`give_up_share`):
each slice loss the run meets (running, scaling up, or met at the end of a recovery; never
one while it waits for slices, which raises nothing) adds one to the count, which starts
again at a loss once the run's furthest step is ``retry_reset_steps`` past where it was at
the count's first loss; a preemption (a new process) starts it again too.

It is the check of the analytic model (their goodput agree within a point from 1 to 10,000
slices) and of the retry budget's rule (:mod:`elastic_dew.plan.retry`), never what the
planner reports.
"""

from __future__ import annotations

import math
import random

from elastic_dew.plan import model, pool
from elastic_dew.plan.inputs import Cluster, KnownCosts
from elastic_dew.plan.policy import PolicySettings, efficiency, running_per_step
from elastic_dew.plan.retry import RetryRule

__all__ = ["simulate", "give_up_share"]

#: The simulation also ends after this many events per fault asked for: a job that can
#: almost never run (a pool short of healthy slices nearly all the time) meets few faults.
_EVENTS_PER_FAULT = 50


def simulate(
    costs: KnownCosts,
    cluster: Cluster,
    settings: PolicySettings,
    *,
    seed: int = 0,
    faults: int = 20000,
) -> model.PolicyOutcome:
    """Run the policy at its ``settings`` on ``cluster`` until ``faults`` slice losses and
    preemptions have met the run (or :data:`_EVENTS_PER_FAULT` times as many events have passed); the
    :class:`~elastic_dew.plan.model.PolicyOutcome` measured (``lost_seconds`` and
    ``downtime_seconds`` averaged over the losses)."""
    outcome, _ = _simulate(costs, cluster, settings, seed=seed, faults=faults)
    return outcome


def give_up_share(
    costs: KnownCosts, cluster: Cluster, settings: PolicySettings, rule: RetryRule, *, runs: int, seed: int = 0
) -> float:
    """The share of ``runs`` runs under ``rule`` (each from the pool's stationary state,
    seeds ``seed``, ``seed + 1``, ...) whose retry budget ends them before their last step.

    Raises ``ValueError`` for the restart policy (a slice loss ends its process, whose count
    starts again) or an unknown one.
    """
    if settings.policy not in ("pause_resume", "replica_resize"):
        raise ValueError(f"policy {settings.policy!r} has no in-process retry budget; give pause_resume or "
                         "replica_resize")
    gave_up = 0
    for i in range(runs):
        _, ended = _simulate(costs, cluster, settings, seed=seed + i, faults=10**9, rule=rule)
        gave_up += ended
    return gave_up / runs


def _simulate(
    costs: KnownCosts,
    cluster: Cluster,
    settings: PolicySettings,
    *,
    seed: int,
    faults: int,
    rule: RetryRule | None = None,
) -> tuple[model.PolicyOutcome, bool]:
    """The simulation; with ``rule`` it ends at the run's last step or where the retry
    budget gives up, and says whether it did."""
    policy = settings.policy
    rng = random.Random(seed)
    r = pool.rates(cluster)
    n, spares = cluster.slices, cluster.spares
    size = n + spares
    e, tau_s, tau_c = efficiency(costs, settings)
    per_step = running_per_step(costs, settings)
    restart = policy == "restart"
    tau = tau_c if restart else tau_s
    floor = (settings.min_slices or n) if policy == "replica_resize" else n
    c = (costs.restart_seconds + costs.checkpoint_restore_seconds) if restart else (
        costs.recovery_seconds + costs.snapshot_restore_seconds)
    preempt_cost = ((costs.checkpoint_seconds or 0.0) + r.reschedule + costs.restart_seconds
                    + costs.checkpoint_restore_seconds)
    instant_return = not math.isfinite(r.mu)
    # The pool starts in its stationary state: each slice down with probability q.
    down = 0 if instant_return else sum(1 for _ in range(size) if rng.random() < r.q)

    t = 0.0
    end = math.inf  # when the current phase ends (recover, reschedule, preempted, scale-up)
    mode = "wait"
    active = 0
    phase = 0.0  # running time since the last restore point, modulo tau
    productive = useful = 0.0
    met = losses = 0
    lost_total = 0.0
    down_started: float | None = None
    downtime_total = 0.0
    pending = False  # a working slice was lost during the recovery under way
    # The retry budget: the run's position and furthest point in running seconds, the count.
    position = furthest = 0.0
    limit, reset, target = (rule.max_attempts, rule.retry_reset_steps, rule.steps) if rule else (None, 0, math.inf)
    target_seconds = target * per_step
    count = 0
    counted_from = 0
    gave_up = False

    def count_loss() -> None:
        nonlocal count, counted_from, gave_up
        progress = int(furthest / per_step + 1e-9)
        if count and reset and progress - counted_from >= reset:
            count = 0
        if count == 0:
            counted_from = progress
        count += 1
        if limit is not None and count >= limit:
            gave_up = True

    def healthy() -> int:
        return size - down

    def enough() -> bool:
        return healthy() >= floor

    def recover() -> None:
        nonlocal mode, end, active
        if enough():
            mode, end, active = "recover", t + c, (min(n, healthy()) if not restart else n)
        else:
            mode, end, active = "wait", math.inf, 0

    def run() -> None:
        nonlocal mode, end, active, down_started, downtime_total
        mode, end, active = "run", math.inf, min(n, healthy())
        if down_started is not None:
            downtime_total += t - down_started
            down_started = None

    if enough():
        run()

    events = 0
    while met < faults and events < _EVENTS_PER_FAULT * faults and not gave_up:
        events += 1
        used = active if mode in ("run", "recover", "scaleup") else 0
        fail_used = used * r.alpha
        fail_idle = (healthy() - used) * r.alpha
        back = 0.0 if instant_return else down * r.mu
        preempt = r.preempt if mode == "run" else 0.0
        total = fail_used + fail_idle + back + preempt
        dt = rng.expovariate(total) if total > 0 else math.inf
        if mode == "run" and position + dt >= target_seconds:  # the run's last step
            dt = target_seconds - position
            productive += e * dt
            useful += e * dt * active / n
            t += dt
            break
        if t + dt >= end:
            t = end
            if mode == "reschedule":
                recover()
            elif mode == "preempted":
                if enough():
                    phase = 0.0
                    run()
                else:
                    mode, end, active = "wait", math.inf, 0
            elif mode == "recover" and pending:  # the loss met at the first step: recover again
                pending = False
                phase = 0.0
                recover()
            else:  # recover or scale-up ends: the run steps on every healthy slice it may take
                if mode == "recover":
                    phase = 0.0
                run()
            continue
        if mode == "run":
            productive += e * dt
            useful += e * dt * active / n
            phase = (phase + dt) % tau if math.isfinite(tau) else phase + dt
            position += dt
            furthest = max(furthest, position)
        t += dt
        pick = rng.random() * total
        if pick < fail_used:
            if mode == "recover":
                # Met at the recovery's end; the next loss counts from that one.
                if not instant_return:
                    down += 1
                if not pending:
                    met += 1
                    losses += 1
                    pending = True
                    count_loss()
                continue
            met += 1
            losses += 1
            if not instant_return:
                down += 1
            if mode in ("run", "scaleup"):
                lost = phase
                productive -= e * lost
                useful -= e * lost * active / n
                lost_total += e * lost
                position -= lost
                phase = 0.0
                down_started = t
                if not restart:
                    count_loss()
            if restart and mode == "run":
                mode, end, active = "reschedule", t + r.reschedule, 0
            else:
                recover()
        elif pick < fail_used + fail_idle:
            down += 1
        elif pick < fail_used + fail_idle + back:
            down -= 1
            if mode == "wait" and enough():
                recover()
            elif mode == "run" and policy == "replica_resize" and active < n and healthy() > active:
                mode, end = "scaleup", t + costs.scale_up_seconds
        else:
            met += 1
            mode, end, active = "preempted", t + preempt_cost, 0
            down_started = None
            count = 0  # a new process: its count starts again
    wall = t
    return model.PolicyOutcome(
        goodput=productive / wall if wall > 0 else 0.0,
        useful_work=useful / wall if wall > 0 else 0.0,
        lost_seconds=lost_total / losses if losses else 0.0,
        downtime_seconds=downtime_total / losses if losses else 0.0,
        faults_per_day=86400.0 * met / wall if wall > 0 else 0.0,
    ), gave_up
