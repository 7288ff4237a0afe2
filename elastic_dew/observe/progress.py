"""A run's progress as log lines, fed by the run's events: the display where the output is
not a terminal.

:class:`Progress` is a sink of the run's event stream (one of a
:class:`~elastic_dew.trainer.Trainer`'s ``sinks``): it receives every typed event and
writes a plain line every ``log_every`` steps (the step, the loss, the active slices, the
step rate) and one per stop, resume, fault and committed checkpoint, so a pod's log or a CI
log stays readable and greppable. On a terminal the display is the progress bar instead
(:class:`~elastic_dew.observe.progress_bar.ProgressBar`); both are a :class:`StepDisplay`,
which words a step. Through the logger (no ``stream``), a step line
carries the step's ``loss`` and ``metrics`` and an evaluation line its ``eval`` (``step``
and ``metrics``) as fields of their own, which JSON logs write as keys of the line
(:class:`~elastic_dew.observe.logs.JsonFormatter`), so Cloud Logging can filter on them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

from elastic_dew.elastic import events as ev

__all__ = ["StepDisplay", "Progress"]

logger = logging.getLogger(__name__)


class StepDisplay:
    """What both progress displays share (this module's :class:`Progress` and
    :class:`~elastic_dew.observe.progress_bar.ProgressBar`): the run's length and allocation,
    the newest step's figures, the last event worth showing. Each is a sink: call it with
    every event of the run.

    Args:
      total_steps: the step the run trains to (for ``step/total``).
      total_slices: the slices of the allocation (for ``slices active/total``).
      stream: where to write.

    Raises:
      ValueError: ``total_steps`` is below 1.
    """

    name = "progress display"

    def __init__(self, total_steps: int, *, total_slices: int | None = None, stream: TextIO | None = None) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps={total_steps} must be >= 1")
        self.total_steps = total_steps
        self.total_slices = total_slices
        self.stream = stream
        self.loss: float | None = None
        self.metrics: dict[str, float] = {}
        self.slices: int | None = None
        self.last_event = ""

    def note_step(self, step: ev.Step) -> None:
        """Keep the figures of a step, the newest."""
        self.loss = float(step.loss) if step.loss is not None else None
        self.metrics = dict(step.metrics)
        self.slices = step.slices or self.slices  # a step runs on at least one slice: 0 left the count out

    def figures(self) -> list[str]:
        """What both displays show of the newest step: its loss, its metrics and the active
        slices of the allocation.

        Returns:
            The figures, each a short text.
        """
        parts = [f"loss {self.loss:.4f}"] if self.loss is not None else []
        parts.extend(f"{name} {value:.4g}" for name, value in self.metrics.items())
        if self.slices is not None:
            total = f"/{self.total_slices}" if self.total_slices else ""
            parts.append(f"slices {self.slices}{total}")
        return parts


class Progress(StepDisplay):
    """Write a run's progress as log lines from its events; call it with each event (a sink).

    Args:
      total_steps, total_slices: as :class:`StepDisplay`'s.
      stream: where to write the lines; by default they go through this module's logger
        (so they carry the log format and level).
      log_every: steps between step lines.
      clock: seconds for the step rate (a test can pass its own).

    Raises:
      ValueError: ``total_steps`` or ``log_every`` is below 1.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        total_slices: int | None = None,
        stream: TextIO | None = None,
        log_every: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(total_steps, total_slices=total_slices, stream=stream)
        if log_every < 1:
            raise ValueError(f"log_every={log_every} must be >= 1 step")
        self.log_every = log_every
        self._clock = clock
        self._recent: deque[tuple[float, int]] = deque(maxlen=20)
        self.step: int | None = None

    # -- what is shown -----------------------------------------------------------------
    def steps_per_second(self) -> float | None:
        """The step rate over the last (up to 20) steps of this attempt (``None`` before two).

        Returns:
            Steps per second, or ``None``.
        """
        if len(self._recent) < 2:
            return None
        (t0, s0), (t1, s1) = self._recent[0], self._recent[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def line(self) -> str:
        """The status line: step, loss, metrics, slices, rate and last event.

        Returns:
            The line.
        """
        parts = [f"step {self.step if self.step is not None else '-'}/{self.total_steps}"]
        parts.extend(self.figures())
        rate = self.steps_per_second()
        parts.append(f"{rate:.2f} steps/s" if rate is not None else "- steps/s")
        if self.last_event:
            parts.append(f"last: {self.last_event}")
        return "  ".join(parts)

    # -- events --------------------------------------------------------------------------
    def __call__(self, typed: ev.Event) -> None:
        if isinstance(typed, ev.Step):
            self.step = int(typed.step)
            self.note_step(typed)
            self._recent.append((self._clock(), self.step))
            if self.step % self.log_every == 0 or self.step == self.total_steps:
                fields: dict[str, object] = {"loss": self.loss, "metrics": self.metrics} if self.metrics else {"loss": self.loss}
                self._write_line(self.line(), fields)
            return
        if isinstance(typed, ev.Eval):
            self._write_line(ev.describe(typed), {"eval": {"step": typed.step, "metrics": dict(typed.metrics)}})
            return
        if isinstance(typed, (ev.Stop, ev.Resume, ev.Fault)) or (
            isinstance(typed, ev.Save) and typed.tier == "checkpoint"
        ):
            self.last_event = ev.describe(typed)
            if isinstance(typed, ev.Resume):
                self._recent.clear()  # the rate of a new attempt starts afresh
            if isinstance(typed, ev.Stop) and typed.reason == "done":
                self.step = int(typed.step)
            self._write_line(self.last_event)

    def _write_line(self, text: str, fields: dict[str, object] | None = None) -> None:
        if self.stream is None:
            logger.info("%s", text, extra={"json_fields": fields} if fields else None)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, summary: object = None) -> None:
        """Nothing to finish: every line is written as its event arrives (``summary``: as
        every sink's ``close`` takes it).

        Args:
            summary: ignored.
        """
