"""Fault schedules drawn from a cluster's rates, in the simulator's grammar.

The one function that turns the planner's rates into faults a simulated run meets: each of
the cluster's ``slices`` slices fails after an exponential time of mean
``slice_mtbf_hours`` and returns after one of mean ``return_minutes``, preemptions come as
a Poisson process, all in wall time compressed by a factor (so a run of a few hundred steps
meets tens of faults). The faults are written in the order they fall, each keyed to time
after the one before it (``lose:2@+3.1,restore:2@+0.8,...``,
:mod:`elastic_dew.simulate.fault_token`'s form), so the simulator fires them at those gaps
whether the run is stepping or paused waiting for a slice. Spares are not drawn (the
simulator's slices are the run's own), nor is the reschedule (the supervisor restarts a
process at once).

The validation benchmark draws its schedules here, and ``elastic-dew plan --draw-schedule
SEED --steps S`` prints one, so anyone can repeat the check on their own program.
"""

from __future__ import annotations

import dataclasses
import heapq
import random

from elastic_dew.simulate.fault_token import Token
from elastic_dew.plan.inputs import Cluster

__all__ = ["compression", "compressed", "draw_schedule", "TARGET_FAULTS", "HORIZON", "LOSSES"]

#: The actions a drawn slice loss can be written as.
LOSSES: tuple[str, ...] = ("lose", "kill", "error")

#: The faults a drawn run of ``steps`` steps is compressed to meet, on average.
TARGET_FAULTS = 20

#: Faults are drawn over this many times the steps' own time (a run also spends time
#: recovering): a run ends before the schedule does, and the faults it meets are Poisson.
#: Every slice lost within it has its return written.
HORIZON = 20.0


def compression(cluster: Cluster, step_seconds: float, steps: int, faults: float = TARGET_FAULTS) -> float:
    """The factor that compresses the cluster's time so that ``steps`` steps of
    ``step_seconds`` meet ``faults`` slice losses and preemptions on average."""
    per_second = cluster.slices / (cluster.slice_mtbf_hours * 3600.0) + cluster.preemptions_per_day / 86400.0
    if steps <= 0 or step_seconds <= 0:
        raise ValueError(f"steps={steps} and step_seconds={step_seconds} must be > 0")
    return faults / (per_second * steps * step_seconds)


def compressed(cluster: Cluster, factor: float) -> Cluster:
    """The cluster a schedule drawn with ``factor`` describes: every time of the cluster
    (a slice's MTBF, its return, the reschedule) divided by ``factor``, preemptions
    ``factor`` times as frequent; the slices and spares as they are. A plan of it is the
    prediction for a run under that schedule (whose costs are the run's own).

    Raises ``ValueError`` for a ``factor`` that is not > 0.
    """
    if not factor > 0:
        raise ValueError(f"factor={factor} must be > 0")
    return dataclasses.replace(
        cluster, slice_mtbf_hours=cluster.slice_mtbf_hours / factor, return_minutes=cluster.return_minutes / factor,
        preemptions_per_day=cluster.preemptions_per_day * factor,
        reschedule_minutes=cluster.reschedule_minutes / factor)


def draw_schedule(
    cluster: Cluster, step_seconds: float, steps: int, seed: int, *, factor: float, loss: str = "lose",
    start_step: int | None = None,
) -> str:
    """A fault schedule for a run of ``steps`` steps of ``step_seconds`` on ``cluster`` with
    its time compressed ``factor`` times, drawn with ``seed`` (the same arguments give the
    same text).

    ``loss`` is the action of a slice loss (:data:`LOSSES`): ``lose`` (the slice fails; it
    returns with a ``restore``), or, for the restart policy, which ends the whole program at
    any slice loss, ``kill`` (SIGKILL: a supervisor or a JobSet starts it again) or
    ``error`` (a runtime error that is not retried: an in-process supervisor starts the
    training again); the new program has every slice, so no returns are written then.

    ``start_step``: the faults count from the run's first announcement of this step, not
    from its start (so the time a program takes to start and compile meets none): the
    schedule opens with ``restore:0@START_STEP``, the return of a slice that is healthy
    then, which changes nothing and anchors the time-keyed faults after it.

    Args:
        cluster: the cluster whose rates the faults are drawn from.
        step_seconds: a step's seconds.
        steps: the run's steps.
        seed: the random seed.
        factor: how many times the run's time is compressed.
        loss: the action of a slice loss (``lose``, ``kill`` or ``error``).
        start_step: the step the faults count from (``None``: the run's start).

    Returns:
        The schedule, in the simulator's grammar.

    Raises:
        ValueError: a ``loss`` that is not one, or a ``factor``, ``steps`` or ``step_seconds``
            not above 0.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} must be one of {', '.join(LOSSES)}")
    if not factor > 0:
        raise ValueError(f"factor={factor} must be > 0")
    rng = random.Random(seed)
    frame = compressed(cluster, factor)
    up_mean = frame.slice_mtbf_hours * 3600.0
    down_mean = frame.return_minutes * 60.0
    preempt_rate = frame.preemptions_per_day / 86400.0
    horizon = HORIZON * steps * step_seconds
    queue: list[tuple[float, int, str, int | None]] = []  # (time, order, action, slice)
    order = 0
    for first in range(cluster.slices):
        heapq.heappush(queue, (rng.expovariate(1.0 / up_mean), order, "fail", first))
        order += 1
    if preempt_rate > 0:
        heapq.heappush(queue, (rng.expovariate(preempt_rate), order, "preempt", None))
        order += 1
    tokens = []
    last = 0.0
    down: set[int] = set()
    while queue:
        at, _, kind, index = heapq.heappop(queue)
        if at > horizon:
            if not down:
                break
            if kind != "return":
                continue  # past the horizon only the returns of slices still down are written
        if kind == "fail":
            assert index is not None, "a slice's own events name it"
            action = loss
            if loss == "lose":
                down.add(index)
                back = at + (rng.expovariate(1.0 / down_mean) if down_mean > 0 else 0.0)
                heapq.heappush(queue, (back, order, "return", index))
            else:
                heapq.heappush(queue, (at + rng.expovariate(1.0 / up_mean), order, "fail", index))
        elif kind == "return":
            action = "restore"
            down.discard(index)
            heapq.heappush(queue, (at + rng.expovariate(1.0 / up_mean), order, "fail", index))
        else:
            action = "preempt"
            heapq.heappush(queue, (at + rng.expovariate(preempt_rate), order, "preempt", None))
        order += 1
        gap = at - last
        last = at
        takes_slice = action in ("lose", "restore")
        tokens.append(str(Token(action, str(index) if takes_slice else None, f"+{_seconds(gap)}", None)))
    if start_step is not None:
        tokens.insert(0, str(Token("restore", "0", str(start_step), None)))
    return ",".join(tokens)


def _seconds(gap: float) -> str:
    """A gap as the grammar's ``SECONDS``: a plain decimal, to the millisecond."""
    text = f"{max(0.0, gap):.3f}".rstrip("0").rstrip(".")
    return text or "0"
