"""A progress display fed by the run's events: a live bar on a terminal, log lines elsewhere.

:class:`Progress` is a sink of the run's event stream (one of a
:class:`~elastic_dew.trainer.Trainer`'s ``sinks``): it receives every typed event and
shows the step, the loss, the active slices, the step rate and the last stop, resume or
fault. On a terminal it redraws one line in place; when the output is a file or a pipe
(a pod's log, CI) it writes a plain line every ``log_every`` steps and one per stop and
resume, so logs stay readable and greppable. Through the logger (no ``stream``), a step line
carries the step's ``loss`` and ``metrics`` and an evaluation line its ``eval`` (``step``
and ``metrics``) as fields of their own, which JSON logs write as keys of the line
(:class:`~elastic_dew.observe.logs.JsonFormatter`), so Cloud Logging can filter on them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import TextIO

from elastic_dew.elastic import events as ev

__all__ = ["Progress", "ProgressLogHandler", "figures"]

logger = logging.getLogger(__name__)


def figures(loss: float | None, metrics: Mapping[str, float], slices: int | None,
            total_slices: int | None) -> list[str]:
    """What both displays (this one and :class:`~elastic_dew.observe.progress_bar.ProgressBar`)
    show of the newest step: its loss, its metrics and the active slices of the allocation."""
    parts = [f"loss {loss:.4f}"] if loss is not None else []
    parts.extend(f"{name} {value:.4g}" for name, value in metrics.items())
    if slices is not None:
        total = f"/{total_slices}" if total_slices else ""
        parts.append(f"slices {slices}{total}")
    return parts


class Progress:
    """Show a run's progress from its events; call it with each event (a sink).

    Arguments:
      total_steps: the step the run trains to (for ``step/total`` and the bar).
      total_slices: the slices of the allocation (for ``slices active/total``).
      stream: where to write. By default the bar goes to standard error, and log lines go
        through this module's logger (so they carry the log format and level).
      tty: force the terminal (``True``) or log-line (``False``) style; by default, the
        terminal style when the stream is a terminal.
      log_every: steps between log lines in the log-line style.
      clock: seconds for the step rate (a test can pass its own).
    """

    name = "progress display"

    def __init__(
        self,
        total_steps: int,
        *,
        total_slices: int | None = None,
        stream: TextIO | None = None,
        tty: bool | None = None,
        log_every: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps={total_steps} must be >= 1")
        if log_every < 1:
            raise ValueError(f"log_every={log_every} must be >= 1 step")
        self.total_steps = total_steps
        self.total_slices = total_slices
        self._log_to_logger = stream is None
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.log_every = log_every
        self._clock = clock
        self._recent: deque[tuple[float, int]] = deque(maxlen=20)
        self.step: int | None = None
        self.loss: float | None = None
        self.metrics: dict[str, float] = {}
        self.slices: int | None = None
        self.last_event: str = ""
        self._drawn = False

    # -- what is shown -----------------------------------------------------------------
    def steps_per_second(self) -> float | None:
        """The step rate over the last (up to 20) steps of this attempt."""
        if len(self._recent) < 2:
            return None
        (t0, s0), (t1, s1) = self._recent[0], self._recent[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def line(self) -> str:
        """The status line: step, loss, slices, rate and last event."""
        parts = [f"step {self.step if self.step is not None else '-'}/{self.total_steps}"]
        parts.extend(figures(self.loss, self.metrics, self.slices, self.total_slices))
        rate = self.steps_per_second()
        parts.append(f"{rate:.2f} steps/s" if rate is not None else "- steps/s")
        if self.last_event:
            parts.append(f"last: {self.last_event}")
        return "  ".join(parts)

    def _bar(self) -> str:
        done = min(max(self.step or 0, 0), self.total_steps)
        width = 24
        filled = round(width * done / self.total_steps)
        return "[" + "#" * filled + "." * (width - filled) + "] " + self.line()

    # -- events --------------------------------------------------------------------------
    def __call__(self, typed: ev.Event) -> None:
        if isinstance(typed, ev.Step):
            self.step = int(typed.step)
            self.loss = float(typed.loss) if typed.loss is not None else None
            self.metrics = dict(typed.metrics)
            # A step runs on at least one slice: 0 is a line that left the count out.
            self.slices = typed.slices or self.slices
            self._recent.append((self._clock(), self.step))
            if self.tty:
                self._draw()
            elif self.step % self.log_every == 0 or self.step == self.total_steps:
                fields = {"loss": self.loss, "metrics": self.metrics} if self.metrics else {"loss": self.loss}
                self._write_line(self.line(), fields)
            return
        if isinstance(typed, ev.Eval):
            text = ev.describe(typed)
            self.clear()
            self._write_line(text, {"eval": {"step": typed.step, "metrics": dict(typed.metrics)}})
            if self.tty:
                self._draw()
            return
        if isinstance(typed, (ev.Stop, ev.Resume, ev.Fault)) or (
            isinstance(typed, ev.Save) and typed.tier == "checkpoint"
        ):
            self.last_event = ev.describe(typed)
            if isinstance(typed, ev.Resume):
                self._recent.clear()  # the rate of a new attempt starts afresh
            if isinstance(typed, ev.Stop) and typed.reason == "done":
                self.step = int(typed.step)
            if self.tty:
                self._draw()
            else:
                self._write_line(self.last_event)

    def _write_line(self, text: str, fields: dict[str, object] | None = None) -> None:
        if self._log_to_logger:
            logger.info("%s", text, extra={"json_fields": fields} if fields else None)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def _draw(self) -> None:
        self.stream.write("\r\x1b[2K" + self._bar())
        self.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the bar (before other output is written to the terminal)."""
        if self.tty and self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def redraw(self) -> None:
        if self.tty and self._drawn:
            self._draw()

    def close(self, summary: object = None) -> None:
        """Leave the last bar on its own line (``summary``: as every sink's ``close`` takes it)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


class ProgressLogHandler(logging.Handler):
    """A logging handler that writes records above a terminal progress bar.

    It clears the bar, writes the formatted record on its own line, and redraws the bar, so
    warnings (a lost slice, a preemption) never land in the middle of it.
    """

    def __init__(self, progress: Progress, stream: TextIO | None = None) -> None:
        super().__init__()
        self.progress = progress
        self.stream = stream if stream is not None else progress.stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            self.progress.clear()
            self.stream.write(text + "\n")
            self.stream.flush()
            self.progress.redraw()
        except Exception:  # logging must never break training
            self.handleError(record)
