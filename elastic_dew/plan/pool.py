"""The cluster's pool of slices: its rates, how many slices are down, and what its moves cost a policy.

The cluster (:class:`~elastic_dew.plan.inputs.Cluster`) is a pool of ``slices + spares``
slices, each failing independently after an exponential time of mean ``slice_mtbf_hours`` and
returning after an exponential time of mean ``return_minutes``; so the number of slices down
at any moment is binomial, ``Binomial(pool, q)`` with ``q = return / (mtbf + return)``
(whatever the job does). Whole-job preemptions come at ``preemptions_per_day``, as a Poisson
process, while the job runs.

What the pool's moves mean for the policies (:mod:`~elastic_dew.plan.model`): how often and
for how long it is short of healthy slices (:func:`shortage`), the chance that a pause-resume
pause loses every copy of the in-memory snapshot (:func:`snapshot_lost`), the sets of slices
new to the process that replica-resize lands on (:func:`new_meshes`), and the spares that keep
it short rarely (:func:`recommend_spares`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from elastic_dew.plan.inputs import Cluster

__all__ = [
    "Rates",
    "rates",
    "binomial",
    "shortage",
    "snapshot_lost",
    "new_meshes",
    "recommend_spares",
    "SPARE_SHORTAGE",
    "SNAPSHOT_LOSS_SLICES",
]

#: The spare count recommended when none is given keeps the pool short of healthy slices
#: at most this share of the time.
SPARE_SHORTAGE = 0.01


@dataclasses.dataclass(frozen=True)
class Rates:
    """The cluster's rates in seconds: ``alpha`` a slice's failure rate, ``mu`` its return
    rate (``inf``: at once), ``preempt`` whole-job preemptions, ``q`` the share of time a
    slice is down, ``reschedule`` seconds."""

    alpha: float
    mu: float
    preempt: float
    q: float
    reschedule: float


def rates(cluster: Cluster) -> Rates:
    """The cluster's rates per second."""
    alpha = 1.0 / (cluster.slice_mtbf_hours * 3600.0)
    back = cluster.return_minutes * 60.0
    mu = math.inf if back == 0 else 1.0 / back
    q = back / (cluster.slice_mtbf_hours * 3600.0 + back)
    return Rates(alpha, mu, cluster.preemptions_per_day / 86400.0, q, cluster.reschedule_minutes * 60.0)


def by_slices_down(cluster: Cluster, r: Rates, floor: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per count of slices down (0 to ``slices + spares``): the count, the slices the run
    works on, and how often the pool has that count where at least ``floor`` work (else 0)."""
    size = cluster.slices + cluster.spares
    down = np.arange(size + 1)
    active = np.minimum(cluster.slices, size - down)
    return down, active, np.where(active >= floor, binomial(size, r.q), 0.0)


@functools.lru_cache(maxsize=256)
def binomial(n: int, q: float) -> np.ndarray:
    """The pmf of ``Binomial(n, q)`` over 0..n (cached: read-only)."""
    k = np.arange(n + 1, dtype=float)
    if q <= 0 or q >= 1:
        out = np.zeros(n + 1)
        out[0 if q <= 0 else -1] = 1.0
        out.flags.writeable = False
        return out
    log_factorial = np.array([math.lgamma(i + 1.0) for i in range(n + 1)])
    log_pmf = log_factorial[n] - log_factorial - log_factorial[::-1] + k * math.log(q) + (n - k) * math.log1p(-q)
    out = np.exp(log_pmf)
    out.flags.writeable = False
    return out


def shortage(pool: int, spares: int, r: Rates) -> tuple[float, float, float]:
    """The pool's shortage of healthy slices: the share of time it has at least ``slices``
    healthy, the probability that a working slice's loss leaves it short, and the mean
    length of a shortage (the time until enough slices are healthy again)."""
    pmf = binomial(pool, r.q)
    ok = float(pmf[: spares + 1].sum())
    if ok <= 0:
        return 0.0, 1.0, math.inf
    at_edge = float(pmf[spares])
    short = max(0.0, 1.0 - ok)
    u = at_edge / ok
    if at_edge <= 0 or short <= 0:
        return ok, u, 0.0
    length = short / (at_edge * (pool - spares) * r.alpha)
    return ok, u, length


#: Above this many slices a pause that loses every holder of the snapshot is taken as
#: impossible (it needs every one of them lost within one pause).
SNAPSHOT_LOSS_SLICES = 64


@functools.lru_cache(maxsize=256)
def _snapshot_lost(n: int, spares: int, alpha: float, mu: float) -> float:
    if n <= 1:
        return 1.0  # the one slice held it
    if n > SNAPSHOT_LOSS_SLICES or not math.isfinite(mu) or alpha <= 0:
        return 0.0
    pool = n + spares
    # States (down, holders intact) while the pool is short (down > spares), holders >= 1.
    states = [(d, h) for d in range(spares + 1, pool + 1) for h in range(1, n) if d + h <= pool]
    index = {state: i for i, state in enumerate(states)}
    a = np.eye(len(states))
    b = np.zeros(len(states))
    for (d, h), i in index.items():
        others = pool - d - h  # up, but without the snapshot (returned, or spares)
        rates = {"holder": h * alpha, "other": others * alpha, "back": d * mu}
        total = sum(rates.values())
        for kind, rate in rates.items():
            if rate <= 0:
                continue
            share = rate / total
            if kind == "holder":
                target = (d + 1, h - 1)
                if h - 1 == 0:
                    b[i] += share  # the last holder lost: the snapshot is gone
                    continue
            elif kind == "other":
                target = (d + 1, h)
            else:
                target = (d - 1, h)
                if d - 1 <= spares:
                    continue  # enough slices again: the pause ends with the snapshot
            a[i, index[target]] -= share
    solved = np.linalg.solve(a, b)
    return float(solved[index[(spares + 1, n - 1)]])


def snapshot_lost(n: int, spares: int, r: Rates) -> float:
    """The probability that a pause-resume pause (a working slice lost leaving the pool
    short of ``n`` healthy slices) also loses every other slice that held the in-memory
    snapshot before enough slices are healthy again, so the run restores the newest
    checkpoint: each of the ``n - 1`` holders fails at the slices' rate while the pool's
    slices fail and return; a slice that returns holds nothing. 0 above
    :data:`SNAPSHOT_LOSS_SLICES` slices or with returns at once."""
    return _snapshot_lost(n, spares, r.alpha, r.mu)


def new_meshes(cluster: Cluster, r: Rates, floor: int, wall: float) -> float:
    """The expected recoveries and scale-ups of replica-resize over ``wall`` seconds that land
    on a set of slices the process has not yet run on (each compiles the step for its mesh).

    The pool moves as the binomial model has it; every move between slice counts the run
    may take (``floor`` and above) lands on a set of that count, each of the ``C(pool, k)``
    sets of ``k`` slices as likely as another (slices fail alike); ``L`` landings on ``M``
    sets meet ``M (1 - (1 - 1/M)^L)`` of them, less the set the run started on.
    """
    n, pool = cluster.slices, cluster.slices + cluster.spares
    pmf = binomial(pool, r.q)
    mu = r.mu if math.isfinite(r.mu) else 0.0
    landings = np.zeros(n + 1)
    for d in range(pool + 1):
        a = min(n, pool - d)
        if d + 1 <= pool:
            to = min(n, pool - d - 1)
            if to != a and to >= floor:
                landings[to] += pmf[d] * a * r.alpha
        if d >= 1:
            to = min(n, pool - d + 1)
            if to != a and to >= floor:
                landings[to] += pmf[d] * d * mu
    met = 0.0
    for k in range(floor, n + 1):
        count = landings[k] * wall
        if count <= 0:
            continue
        log_sets = math.lgamma(pool + 1.0) - math.lgamma(k + 1.0) - math.lgamma(pool - k + 1.0)
        if log_sets > 35.0:  # more sets than landings could ever repeat: each is new
            met += count
            continue
        sets = round(math.exp(log_sets)) - (1 if k == n else 0)
        if sets <= 0:
            continue
        met += sets * -math.expm1(count * math.log1p(-1.0 / sets)) if sets > 1 else min(1.0, count)
    return met


def recommend_spares(cluster: Cluster) -> int:
    """The fewest spares that keep the pool short of ``slices`` healthy slices at most
    :data:`SPARE_SHORTAGE` of the time."""
    r = rates(cluster)
    spares = 0
    while True:
        pmf = binomial(cluster.slices + spares, r.q)
        if 1.0 - pmf[: spares + 1].sum() <= SPARE_SHORTAGE or spares > 10 * cluster.slices:
            return spares
        spares += max(1, spares // 8)
