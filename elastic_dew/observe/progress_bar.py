"""The terminal progress display of a run: fits the terminal, shows an ETA, keeps logs above it.

Built on tqdm: it measures the terminal on every redraw (``dynamic_ncols``), so a resized
window or an 80-column terminal gets a line that fits and never wraps (erasing a wrapped
line clears only its last row); it computes the ETA from the step rate; and its
``logging_redirect_tqdm`` routes console log records through ``tqdm.write``, which clears
the bar, writes the record on its own line and redraws the bar below it. tqdm is
maintained, small, pure Python, and has that logging redirection built in.

:class:`ProgressBar` is for terminals only; where the output is a file or a pipe,
:class:`~elastic_dew.observe.progress.Progress` writes plain log lines instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

from elastic_dew.elastic.events import Eval, Event, Fault, Resume, Step, Stop, describe
from elastic_dew.observe.progress import StepDisplay

__all__ = ["ProgressBar"]

log = logging.getLogger(__name__)

#: Columns from which the bar also shows the last stop, resume or fault.
_ROOM_FOR_LAST_EVENT = 110


class ProgressBar(StepDisplay):
    """A tqdm bar fed by a run's events: steps done of ``total_steps``, ETA, loss, slices.

    Args:
      total_steps, total_slices: as :class:`~elastic_dew.observe.progress.StepDisplay`'s.
      stream: where to draw (standard error).
      width: a fixed width in columns; by default the terminal's, measured on every redraw.
      mininterval: least seconds between redraws (tqdm's throttle; 0 redraws every step).

    Raises:
      ValueError: ``total_steps`` is below 1, or ``width`` below 20 columns.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        total_slices: int | None = None,
        stream: TextIO | None = None,
        width: int | None = None,
        mininterval: float = 0.1,
    ) -> None:
        super().__init__(total_steps, total_slices=total_slices, stream=stream if stream is not None else sys.stderr)
        if width is not None and width < 20:
            raise ValueError(f"width={width} is too narrow for a progress bar; use 20 or more")
        from tqdm import tqdm

        self._tqdm = tqdm
        self._bar = tqdm(
            total=total_steps,
            file=self.stream,
            unit="step",
            ncols=width,
            dynamic_ncols=width is None,
            mininterval=mininterval,
            miniters=1,
            smoothing=0.1,
            leave=True,
        )

    def _postfix(self) -> str:
        parts = self.figures()
        # The last event only where it leaves the bar itself some room.
        if self.last_event and (self._bar.ncols or 0) >= _ROOM_FOR_LAST_EVENT:
            parts.append(self.last_event)
        return " ".join(parts)

    def __call__(self, event: Event) -> None:
        """Advance or annotate the bar with one event."""
        bar = self._bar
        if isinstance(event, Step):
            self.note_step(event)
            bar.set_postfix_str(self._postfix(), refresh=False)
            bar.update(max(0, min(event.step, self.total_steps) - bar.n))
        elif isinstance(event, Resume | Eval | Stop | Fault):
            self.last_event = describe(event)
            if isinstance(event, Resume):  # a new attempt: its rate (and so the ETA) starts afresh
                bar.reset()
                bar.initial = bar.n = min(event.step - 1, self.total_steps)
            bar.set_postfix_str(self._postfix(), refresh=True)

    @contextlib.contextmanager
    def redirect_logging(self, loggers: list[logging.Logger] | None = None) -> Iterator[None]:
        """While open, console log records (to stderr/stdout) are written above the bar.

        Args:
            loggers: the loggers whose console handlers write above the bar; ``None``: the root
                logger's.
        """
        from tqdm.contrib.logging import logging_redirect_tqdm

        root = logging.getLogger()
        console = [h for h in root.handlers if type(h) is logging.StreamHandler]
        with logging_redirect_tqdm(loggers=loggers, tqdm_class=self._tqdm):
            # tqdm's handler takes the console handler's formatter, not its level or filters
            # (a terminal shows warnings and the run's story, elastic_dew.observe.logs).
            for handler in root.handlers:
                if console and handler not in console and type(handler).__name__ == "_TqdmLoggingHandler":
                    handler.setLevel(console[0].level)
                    handler.filters = list(console[0].filters)
            yield

    def close(self, summary: object = None) -> None:
        """Draw the bar a last time and leave it on its own line (``summary``: as every
        sink's ``close`` takes it).

        Args:
            summary: ignored.
        """
        self._bar.close()
