"""The run record of one ``fit``: its event stream, its log lines and its summary.

:class:`Recording` opens the run record (:class:`~elastic_dew.record.RunRecord`,
``events.jsonl``) and the run's one event stream (:class:`~elastic_dew.observe.sinks.Sinks`)
with the record as its required first sink, then the caller's sinks and the trainer's log
lines (:class:`LogLines`); it writes the run's ``start`` event first, and once the record is
closed, ``summary.json`` and the final parameters from what the record holds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from elastic_dew.elastic import events
from elastic_dew.observe.sinks import Sinks

__all__ = ["LogLines", "Recording"]

logger = logging.getLogger(__name__)


class LogLines:
    """The trainer's own log lines: a step every ``log_every`` steps, each stop and resume."""

    def __init__(self, log_every: int) -> None:
        self.log_every = log_every

    def __call__(self, event: events.Event) -> None:
        if isinstance(event, events.Step):
            if event.step % self.log_every == 0:
                extra = "".join(f" {name} {value:.4g}" for name, value in event.metrics.items())
                logger.info("step %d loss %.4f%s on %d slices", event.step, event.loss, extra, event.slices)
        elif isinstance(event, (events.Stop, events.Resume)):
            logger.info("%s", {k: v for k, v in event.to_json().items() if k != "wall"})


class Recording:
    """The run record of one ``fit`` in ``run_dir``.

    Built when ``fit`` begins (the ``start`` event's time is then); :meth:`open` writes
    nothing before it is called, so a run the protocol refuses leaves ``run_dir`` untouched.
    :meth:`close` ends every sink and closes the record, and is safe to call when
    :meth:`open` never was.
    """

    def __init__(self, run_dir: Path, sinks: Sequence[events.Sink], log_every: int) -> None:
        from elastic_dew.record.log import process_start_time

        self.run_dir = run_dir
        self._start = events.Start(process_start=process_start_time(), pid=os.getpid())
        self._sinks: list[events.Sink] = [*sinks, LogLines(log_every)]
        self._record: Any = None
        self._stream: Sinks | None = None

    def open(self) -> Sinks:
        """Open the record and the stream, write the ``start`` event; the stream to emit to."""
        from elastic_dew.record import RunRecord

        self._record = RunRecord(self.run_dir)
        self._stream = Sinks(self._sinks, required=[self._record])
        self._stream(self._start)
        return self._stream

    def close(self) -> None:
        """End the stream's sinks and close the record (nothing when never opened)."""
        if self._stream is not None:
            self._stream.end()
        if self._record is not None:
            self._record.close()

    def summary(self, params: Any, memory: dict) -> dict:
        """Write ``summary.json`` and the final parameters from the closed record; the summary."""
        from elastic_dew.record.summary import write_summary

        return write_summary(self.run_dir, self._record.events(), params, memory=memory)
