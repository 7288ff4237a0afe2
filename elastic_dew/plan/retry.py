"""The retry budget a plan recommends: ``max_attempts`` and ``retry_reset_steps`` for a run riding losses in process.

``elastic_retry``'s policy (:class:`~elastic_dew.elastic.slices.retry.SliceLossRetryLimit`)
counts the slice losses the run meets and gives up at the ``max_attempts``-th loss of one
count; a count starts at a loss and ends once the run's furthest step is
``retry_reset_steps`` past where it was then. The losses it counts: a loss while the run
steps or scales up, and one met at the end of a recovery (a loss during a recovery shows
itself at the first step after it, once however many fell in it). A slice lost while the
run waits for slices raises nothing and is not counted. Progress is the furthest step:
the steps done again after a restore are none.

So the losses of one count (a *window*) are, under the model's Poisson losses at rate
``h`` (the working slices' rate, :mod:`elastic_dew.plan.pool`):

- its first loss and the *primary* losses of ``R = retry_reset_steps`` steps of progress
  after it, Poisson with mean ``h R t`` (``t``: a step's running time, saves and, for
  replica-resize, scale-ups included); and
- each loss's *cluster*: a recovery of ``c`` seconds (the in-process recovery and the
  snapshot restore) ends in one loss more with probability ``1 - exp(-h c)``, itself
  recovered again; then the steps since the snapshot, ``Y`` seconds (``Y`` distributed as
  ``X mod tau``, ``X`` exponential, ``tau`` the running time between snapshots), are done
  again without progress, and a loss within them (probability ``1 - exp(-h Y)`` each try)
  is a member more, with its own recoveries, before the redo starts again.

The window's count ``K`` is the first cluster plus a compound Poisson sum of clusters; its
distribution is computed exactly under those assumptions (a compound geometric sum, mixed
over ``Y`` by quadrature, then Panjer's recursion). A window gives up when ``K >=
max_attempts``; a run of ``S`` steps holds about ``S t / (R t + 1/h)`` windows (each ``R``
steps of progress and the wait for the next loss), and gives up with probability ``1 - (1 -
P(K >= max_attempts))`` to that power. The event-by-event simulation
(:func:`elastic_dew.plan.des.give_up_share`) counts as the policy does and is the check.

The recommendation (:func:`recommend`): ``retry_reset_steps`` the configuration's default
(50 steps), and the fewest ``max_attempts``, never below the default (10, the guide's),
whose give-up probability over the planned run is at most :data:`MAX_GIVE_UP`. A crash
loop (a recovery that fails every time, a slice that dies again before the run gets
further) makes no progress and ends after ``max_attempts`` losses whatever the window, so
the fewest attempts that an honest run needs is also the quickest stop; the floor is there
because the model's failures are independent and a correlated failure (a rack, a power
domain) brings several losses at once. The restart policy has no budget: a slice loss
ends its process, and a new process's count starts again.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, cast

import numpy as np

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.plan import pool
from elastic_dew.plan.inputs import Cluster, KnownCosts
from elastic_dew.plan.policy import PolicySettings, efficiency, running_per_step

__all__ = [
    "RetryRule",
    "RetryBudget",
    "MAX_GIVE_UP",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETRY_RESET_STEPS",
    "LARGEST_MAX_ATTEMPTS",
    "RETRIED_POLICIES",
    "window_losses",
    "give_up_probability",
    "recommend",
]

#: The share of runs of the planned length that may give up: one in a thousand.
MAX_GIVE_UP = 1e-3

#: ``ElasticConfig``'s defaults: 10 slice losses within 50 steps of progress.
DEFAULT_MAX_ATTEMPTS: int = cast(int, ElasticConfig().max_attempts)
DEFAULT_RETRY_RESET_STEPS: int = ElasticConfig().retry_reset_steps

#: The largest ``max_attempts`` the recommendation searches.
LARGEST_MAX_ATTEMPTS = 1000

#: The policies that ride slice losses in process, under the retry budget.
RETRIED_POLICIES: tuple[str, ...] = ("pause_resume", "replica_resize")

#: Quadrature nodes over the redone steps' time ``Y``.
_NODES = 48


@dataclasses.dataclass(frozen=True)
class RetryRule:
    """A run of ``steps`` steps under ``elastic_retry``'s budget: it gives up at the
    ``max_attempts``-th slice loss of one count, a count ending ``retry_reset_steps`` steps of
    progress after its first loss (0: the whole run).

    Raises:
        ValueError: ``max_attempts`` or ``steps`` below 1, or a negative ``retry_reset_steps``.
    """

    max_attempts: int
    steps: int
    retry_reset_steps: int = DEFAULT_RETRY_RESET_STEPS

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.steps < 1 or self.retry_reset_steps < 0:
            raise ValueError(f"{self} needs max_attempts >= 1, steps >= 1 and retry_reset_steps >= 0")


@dataclasses.dataclass(frozen=True)
class RetryBudget:
    """A recommended retry budget and what it and the defaults give.

    ``max_attempts`` (``None``: no budget up to :data:`LARGEST_MAX_ATTEMPTS` gives up at
    most ``max_give_up``) and ``retry_reset_steps`` are :class:`~elastic_dew.elastic.config.ElasticConfig`'s
    fields. ``give_up_probability``: the chance a run of ``steps`` steps gives up with them;
    ``default_give_up_probability``: with the defaults (``DEFAULT_MAX_ATTEMPTS`` within
    ``DEFAULT_RETRY_RESET_STEPS``). ``window_mean``: the mean losses of one count.
    ``crash_loop_seconds``: how long a crash loop of failing recoveries takes to end
    (``max_attempts`` recoveries).
    """

    max_attempts: int | None
    retry_reset_steps: int
    steps: int
    max_give_up: float
    give_up_probability: float
    default_give_up_probability: float
    window_mean: float
    crash_loop_seconds: float

    @property
    def defaults_too_low(self) -> bool:
        """Whether the defaults give up more often than ``max_give_up``."""
        return self.default_give_up_probability > self.max_give_up

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["defaults_too_low"] = self.defaults_too_low
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


@dataclasses.dataclass(frozen=True)
class _Window:
    """One count's figures: the loss rate, the primary losses' mean, the windows in a run."""

    rate: float
    primaries: float
    windows: float
    recovery: float
    tau: float


def _window(costs: KnownCosts, cluster: Cluster, settings: PolicySettings, reset_steps: int, steps: int) -> _Window:
    policy = settings.policy
    if policy not in RETRIED_POLICIES:
        raise ValueError(f"policy {policy!r} has no in-process retry budget (one of {', '.join(RETRIED_POLICIES)})")
    if reset_steps < 0 or steps < 1:
        raise ValueError(f"retry_reset_steps={reset_steps} must be >= 0 and steps={steps} >= 1")
    r = pool.rates(cluster)
    n = cluster.slices
    t = running_per_step(costs, settings)
    scale_ups = 0.0
    if policy == "replica_resize":
        down, active, weight = pool.by_slices_down(cluster, r, settings.min_slices or n)
        if weight.sum() <= 0:
            return _Window(0.0, 0.0, 0.0, 0.0, math.inf)
        rate = r.alpha * float((weight * active).sum() / weight.sum())
        returns = np.where(active < n, down * (r.mu if math.isfinite(r.mu) else 0.0), 0.0)
        scale_ups = float((weight * returns).sum() / weight.sum())
        t *= 1.0 + scale_ups * (costs.scale_up_seconds or 0.0)
    else:
        rate = n * r.alpha
    window = steps if reset_steps == 0 else min(reset_steps, steps)
    primaries = rate * window * t
    windows = 1.0 if window >= steps or rate <= 0 else steps * t / (window * t + 1.0 / rate)
    _, tau, _ = efficiency(costs, settings)
    return _Window(rate, primaries, max(1.0, windows), costs.recovery_seconds + costs.snapshot_restore_seconds, tau)


def _cluster_pmf(w: _Window, largest: int) -> np.ndarray:
    """The pmf over 0..largest of one loss's cluster: the loss, its failed recoveries, and
    the losses while the steps since the snapshot are done again (each with its own)."""
    h, c = w.rate, w.recovery
    p_c = -math.expm1(-h * c)
    k = np.arange(largest + 1)
    member = np.where(k >= 1, (1.0 - p_c) * p_c ** np.maximum(k - 1, 0), 0.0)  # 1 + its failed recoveries
    # The redone time Y, as X mod tau for X exponential of rate h, by Gauss-Legendre.
    top = min(w.tau, 50.0 / h)
    x, wx = np.polynomial.legendre.leggauss(_NODES)
    y = 0.5 * top * (x + 1.0)
    density = h * np.exp(-h * y) / (-math.expm1(-h * w.tau) if math.isfinite(w.tau) else 1.0)
    weight = 0.5 * top * wx * density
    weight /= weight.sum()
    done = np.exp(-h * y)  # the redo finishes without a loss
    g = np.zeros((_NODES, largest + 1))
    g[:, 0] = done
    for j in range(1, largest + 1):
        g[:, j] = (1.0 - done) * (g[:, :j][:, ::-1] @ member[1:j + 1])
    mixed = weight @ g
    return np.convolve(member, mixed)[: largest + 1]


def window_losses(
    costs: KnownCosts,
    cluster: Cluster,
    settings: PolicySettings,
    *,
    retry_reset_steps: int = DEFAULT_RETRY_RESET_STEPS,
    steps: int,
    largest: int = LARGEST_MAX_ATTEMPTS,
) -> tuple[np.ndarray, float]:
    """The pmf over ``0..largest`` of the slice losses one count holds (what is missing
    from 1 lies beyond ``largest``), and the counts a run of ``steps`` steps holds.

    Raises ``ValueError`` for the restart policy (no in-process budget), an unknown one,
    or a negative ``retry_reset_steps``.
    """
    w = _window(costs, cluster, settings, retry_reset_steps, steps)
    out = np.zeros(largest + 1)
    if w.rate <= 0:
        out[1] = 1.0
        return out, 0.0
    if w.primaries > 600:  # more than the recursion can start from: every count beyond largest
        return out, w.windows
    cluster_pmf = _cluster_pmf(w, largest)
    s = np.zeros(largest + 1)
    s[0] = math.exp(-w.primaries)
    j = np.arange(largest + 1)
    jc = j * cluster_pmf
    for k in range(1, largest + 1):
        s[k] = w.primaries / k * float(jc[1:k + 1] @ s[:k][::-1])
    return np.convolve(cluster_pmf, s)[: largest + 1], w.windows


def _run_give_up(pmf: np.ndarray, windows: float, max_attempts: int) -> float:
    window = max(0.0, 1.0 - float(pmf[:max_attempts].sum())) if max_attempts < len(pmf) else float("nan")
    if windows <= 0:
        return 0.0
    if window >= 1.0:
        return 1.0
    return -math.expm1(windows * math.log1p(-window))


def give_up_probability(costs: KnownCosts, cluster: Cluster, settings: PolicySettings, rule: RetryRule) -> float:
    """The probability that a run at ``settings`` under ``rule`` gives up: some count reaches
    ``rule.max_attempts`` slice losses.

    Raises ``ValueError`` as :func:`window_losses`.
    """
    pmf, windows = window_losses(costs, cluster, settings, retry_reset_steps=rule.retry_reset_steps,
                                 steps=rule.steps, largest=rule.max_attempts)
    return _run_give_up(pmf, windows, rule.max_attempts)


def recommend(
    costs: KnownCosts,
    cluster: Cluster,
    settings: PolicySettings,
    *,
    steps: int,
    max_give_up: float = MAX_GIVE_UP,
    retry_reset_steps: int = DEFAULT_RETRY_RESET_STEPS,
) -> RetryBudget:
    """The fewest ``max_attempts``, at least :data:`DEFAULT_MAX_ATTEMPTS`, that keep a run
    of ``steps`` steps from giving up with probability above ``max_give_up``, at
    ``retry_reset_steps``; with what it and the defaults give.

    Raises ``ValueError`` as :func:`window_losses`, or for a ``max_give_up`` outside (0, 1).
    """
    if not 0 < max_give_up < 1:
        raise ValueError(f"max_give_up={max_give_up} must be between 0 and 1")
    pmf, windows = window_losses(costs, cluster, settings, retry_reset_steps=retry_reset_steps, steps=steps)
    if retry_reset_steps == DEFAULT_RETRY_RESET_STEPS:
        default_pmf, default_windows = pmf, windows
    else:
        default_pmf, default_windows = window_losses(costs, cluster, settings,
                                                     retry_reset_steps=DEFAULT_RETRY_RESET_STEPS, steps=steps)
    chosen: int | None = None
    for attempts in range(DEFAULT_MAX_ATTEMPTS, LARGEST_MAX_ATTEMPTS + 1):
        if _run_give_up(pmf, windows, attempts) <= max_give_up:
            chosen = attempts
            break
    w = _window(costs, cluster, settings, retry_reset_steps, steps)
    return RetryBudget(
        max_attempts=chosen,
        retry_reset_steps=retry_reset_steps,
        steps=steps,
        max_give_up=max_give_up,
        give_up_probability=_run_give_up(pmf, windows, chosen) if chosen is not None else 1.0,
        default_give_up_probability=_run_give_up(default_pmf, default_windows, DEFAULT_MAX_ATTEMPTS),
        window_mean=float((np.arange(len(pmf)) * pmf).sum()),
        crash_loop_seconds=(chosen or LARGEST_MAX_ATTEMPTS) * w.recovery,
    )
