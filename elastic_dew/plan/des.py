"""A discrete-event simulation of the cluster the analytic model describes, event by event.

The same pool as :mod:`elastic_dew.plan.model` (``slices + spares`` slices failing and
returning independently, exponentially; preemptions as a Poisson process while the job
runs) and the same policies, followed one fault at a time: which slice fails is drawn
among the healthy ones (a working slice, or an idle spare), a recovery that a working
slice's loss falls in is followed, when it ends, by a whole recovery more (the model's and
the simulator's rule: one such loss a recovery, since the next fault counts from it), lost work is the running time since the last restore
point, and the wall time, the productive step time and the examples trained add up as the
run goes. Seeded and deterministic: the same inputs and seed give the same figures.

It is the check of the analytic model (their goodput agree within a point from 1 to 10,000
slices), never what the planner reports.
"""

from __future__ import annotations

import math
import random

from elastic_dew.plan import model
from elastic_dew.plan.inputs import Cluster, Costs

__all__ = ["simulate"]

#: The simulation also ends after this many events per fault asked for: a job that can
#: almost never run (a pool short of healthy slices nearly all the time) meets few faults.
_EVENTS_PER_FAULT = 50


def simulate(
    costs: Costs,
    cluster: Cluster,
    policy: str,
    *,
    snapshot_every: int | None,
    checkpoint_every: int | None,
    min_slices: int | None = None,
    seed: int = 0,
    faults: int = 20000,
) -> model.PolicyOutcome:
    """Run ``policy`` on ``cluster`` until ``faults`` slice losses and preemptions have met
    the run (or :data:`_EVENTS_PER_FAULT` times as many events have passed); the
    :class:`~elastic_dew.plan.model.PolicyOutcome` measured (``lost_seconds`` and
    ``downtime_seconds`` averaged over the losses)."""
    if policy not in model.POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {', '.join(model.POLICIES)}")
    rng = random.Random(seed)
    r = model.rates(cluster)
    n, spares = cluster.slices, cluster.spares
    pool = n + spares
    e, tau_s, tau_c = model._efficiency(costs, snapshot_every, checkpoint_every)
    restart = policy == "restart"
    tau = tau_c if restart else tau_s
    floor = (min_slices or n) if policy == "replica_resize" else n
    c = (costs.restart_seconds + costs.checkpoint_restore_seconds) if restart else (
        costs.recovery_seconds + costs.snapshot_restore_seconds)
    preempt_cost = (costs.checkpoint_seconds or 0.0) + r.reschedule + costs.restart_seconds + costs.checkpoint_restore_seconds
    instant_return = not math.isfinite(r.mu)
    # The pool starts in its stationary state: each slice down with probability q.
    down = 0 if instant_return else sum(1 for _ in range(pool) if rng.random() < r.q)

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

    def healthy() -> int:
        return pool - down

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
    while met < faults and events < _EVENTS_PER_FAULT * faults:
        events += 1
        used = active if mode in ("run", "recover", "scaleup") else 0
        fail_used = used * r.alpha
        fail_idle = (healthy() - used) * r.alpha
        back = 0.0 if instant_return else down * r.mu
        preempt = r.preempt if mode == "run" else 0.0
        total = fail_used + fail_idle + back + preempt
        dt = rng.expovariate(total) if total > 0 else math.inf
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
                phase = 0.0
                down_started = t
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
    wall = t
    return model.PolicyOutcome(
        goodput=productive / wall if wall > 0 else 0.0,
        useful_work=useful / wall if wall > 0 else 0.0,
        lost_seconds=lost_total / losses if losses else 0.0,
        downtime_seconds=downtime_total / losses if losses else 0.0,
        faults_per_day=86400.0 * met / wall if wall > 0 else 0.0,
    )
