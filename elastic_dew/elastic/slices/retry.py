"""pathwaysutils' ``Manager`` and ``elastic_retry``, configured from an :class:`ElasticConfig`.

Both recovery modes of the guide come from one setting, ``minimum_slice_count``: ``None``
is pause-resume (wait for every slice), a smaller number is replica-resize (carry on with
at least that many). Two things differ from pathwaysutils' defaults. The retry policy:
pathwaysutils calls the policy after a ``ScaleUpSignalError`` too, so a plain
``ElasticRetryLimit`` would let a slice that keeps leaving and returning exhaust the
attempts meant for slice loss; and it counts over the whole call, so a run of weeks
reaches ten sparse losses long before it ends. :class:`SliceLossRetryLimit` counts slice
losses only, and starts the count again once the run has made ``retry_reset_steps`` steps
of new progress (a crash loop, which makes none, still ends after ``max_attempts``). And
the health check: :func:`make_manager` installs :mod:`elastic_dew.elastic.slices.health`, whose
checker compiles each slice's probe once instead of at every poll. And the log:
pathwaysutils logs every slice loss it handles at ERROR with a 20-line traceback;
:func:`make_manager` installs :class:`~elastic_dew.elastic.slices.loss_log.HandledSliceLossFilter`, which makes it one WARNING
line, for every program that uses the elastic layer (with or without elastic_dew's own log
set-up).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import jax
from pathwaysutils.elastic import manager as pw_manager

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.slices import health
from elastic_dew.elastic.slices.loss_log import install_slice_loss_filter
from elastic_dew.elastic.slices.manager import SliceManager

__all__ = [
    "make_manager",
    "elastic_retry",
    "SliceLossRetryLimit",
]

logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])


def make_manager(devices: Sequence[jax.Device] | None = None) -> pw_manager.Manager:
    """The process's pathwaysutils ``Manager``: create it once, outside the retry.

    ``devices=None`` takes ``jax.devices()`` grouped by ``slice_index`` (or the simulator's
    slices inside :class:`elastic_dew.simulate.SimulatedSlices`). Slice tracking lives in
    the Manager, so creating it inside the retried function would forget it every attempt.

    Its health checks (at creation, in its monitor thread and in every wait for slices) go
    through :class:`elastic_dew.elastic.slices.health.ReusableSliceHealthChecker`, installed here,
    and its handled slice losses are logged as one WARNING line (:class:`~elastic_dew.elastic.slices.loss_log.HandledSliceLossFilter`).

    Args:
        devices: the devices to track, or ``None`` for ``jax.devices()``.

    Returns:
        The ``Manager``.
    """
    health.install()
    install_slice_loss_filter()
    return pw_manager.Manager(devices=devices)


class SliceLossRetryLimit:
    """A retry policy over slice losses: at most ``max_attempts`` without progress, every
    scale-up allowed.

    pathwaysutils' ``ElasticRetryLimit(max_attempts)`` allows attempt ``n`` while
    ``n < max_attempts``, where ``n`` counts every attempt of one call, scale-ups included.
    This policy applies the same rule to its own count of slice losses, and with
    ``reset_steps`` that count starts again once the run has made progress:

    * ``reset_steps`` > 0 (``ElasticConfig.retry_reset_steps``): when a loss strikes and
      ``progress()`` (the furthest step the run has completed) is at least ``reset_steps``
      past where it was at the first loss of the current count, that count is over and
      this loss is the first of a new one. So the run gives up only after ``max_attempts``
      losses within ``reset_steps`` steps of new progress: a crash loop (a slice that dies
      again before the run gets any further, a recovery that fails each time) still ends
      after ``max_attempts`` losses, while sparse losses over a multi-week run never add
      up. Progress is counted in steps, not wall time, so a simulated run gives up at the
      same loss whatever its step time.
    * ``reset_steps`` 0 (or no ``progress``): the count runs over the call's whole life,
      which is ``ElasticRetryLimit`` applied to slice losses only.

    A new call of the decorated function (pathwaysutils' attempt number starting again)
    starts the count again. ``max_attempts=None`` retries slice loss for ever.

    Args:
        max_attempts: slice losses allowed within one count, ``None`` for no limit.
        reset_steps: steps of new progress that start a new count (0: never).
        progress: the furthest step completed, or ``None``.

    Raises:
        ValueError: ``reset_steps`` below 0.
    """

    def __init__(
        self,
        max_attempts: int | None,
        *,
        reset_steps: int = 0,
        progress: Callable[[], int] | None = None,
    ) -> None:
        if reset_steps < 0:
            raise ValueError(f"reset_steps={reset_steps} must be >= 0 (0 counts over the whole run)")
        self._limit = None if max_attempts is None else pw_manager.ElasticRetryLimit(max_attempts)
        self.reset_steps = reset_steps
        self._progress = progress if reset_steps else None
        self._lock = threading.Lock()
        self._last_attempt = 0
        #: The furthest step completed when the first loss of the current count struck.
        self._counted_from: int | None = None
        self.slice_losses = 0
        #: Slice losses over the policy's life, across the count's new starts.
        self.total_slice_losses = 0

    def _start_again_if_progressed(self) -> None:
        if self._progress is None:
            return
        furthest = self._progress()
        if self._counted_from is not None and furthest - self._counted_from >= self.reset_steps:
            logger.info(
                "%d steps of progress (to step %d) since the first of the %d slice losses counted: "
                "the count starts again",
                furthest - self._counted_from, furthest, self.slice_losses,
            )
            self.slice_losses = 0
        if self.slice_losses == 0:
            self._counted_from = furthest

    def __call__(self, attempt: int, error: Exception) -> bool:
        with self._lock:
            if attempt <= self._last_attempt:
                self.slice_losses = 0
                self._counted_from = None
            self._last_attempt = attempt
            if isinstance(error, pw_manager.ScaleUpSignalError):
                logger.info("scale-up at attempt %d: not counted against the retry policy", attempt)
                return True
            self._start_again_if_progressed()
            self.slice_losses += 1
            self.total_slice_losses += 1
            if self._limit is None:
                return True
            allowed = self._limit(self.slice_losses, error)
        if not allowed:
            logger.error("%s; giving up", self.describe())
        return allowed

    def describe(self) -> str:
        """How the count that ended (or would end) the run was taken, for its message.

        Returns:
            The description.
        """
        limit = None if self._limit is None else self._limit.max_attempts
        if self._progress is None:
            return f"slice losses reached max_attempts={limit} (counted over the whole run)"
        return (
            f"slice losses reached max_attempts={limit} ({self.slice_losses} within "
            f"retry_reset_steps={self.reset_steps} steps of progress)"
        )


def _chain(*callbacks: Callable[[], Any] | None) -> Callable[[], None] | None:
    present = [callback for callback in callbacks if callback is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    def chained() -> None:
        for callback in present:
            callback()

    return chained


def elastic_retry(
    manager: SliceManager,
    config: ElasticConfig,
    *,
    pre_callback: Callable[[], Any] | None = None,
    on_elastic_event_callback: Callable[[], Any] | None = None,
    progress: Callable[[], int] | None = None,
    policy: SliceLossRetryLimit | None = None,
) -> Callable[[_F], _F]:
    """``manager.elastic_retry`` with the config's mode, polling, timeout and retry policy.

    ``config.pre_callback`` runs before ``pre_callback`` at the start of every attempt;
    ``config.on_elastic_event_callback`` before ``on_elastic_event_callback`` after every
    elastic event. The retry policy is ``policy``, by default :class:`SliceLossRetryLimit`
    of ``config.max_attempts`` and ``config.retry_reset_steps`` over ``progress`` (the
    furthest step completed; without it the count runs over the whole call); the poll
    interval :meth:`ElasticConfig.poll_seconds`. A ``minimum_slice_count`` above the
    allocation is refused here, before anything runs. Installs :class:`~elastic_dew.elastic.slices.loss_log.HandledSliceLossFilter`.

    Args:
        manager: the process's ``Manager`` (:func:`make_manager`).
        config: the :class:`ElasticConfig`.
        pre_callback: called at the start of every attempt, after the config's.
        on_elastic_event_callback: called after every elastic event, after the config's.
        progress: the furthest step completed, or ``None``.
        policy: the retry policy, or ``None`` for the config's :class:`SliceLossRetryLimit`.

    Returns:
        The decorator of the function to retry.

    Raises:
        SettingError: ``minimum_slice_count`` is above the allocation.
    """
    config.check_slices(manager.total_slice_count)
    install_slice_loss_filter()  # also for a Manager the caller created itself
    if policy is None:
        policy = SliceLossRetryLimit(config.max_attempts, reset_steps=config.retry_reset_steps, progress=progress)
    decorate = manager.elastic_retry(
        minimum_slice_count=config.minimum_slice_count,
        # Simulated slices live on the CPU backend; real ones never do.
        poll_interval=config.poll_seconds(simulated=jax.default_backend() == "cpu"),
        timeout=config.timeout,
        pre_callback=_chain(config.pre_callback, pre_callback),
        on_elastic_event_callback=_chain(config.on_elastic_event_callback, on_elastic_event_callback),
        retry_policy=policy,
    )
    return cast("Callable[[_F], _F]", decorate)  # pathwaysutils' decorator keeps the function's type
