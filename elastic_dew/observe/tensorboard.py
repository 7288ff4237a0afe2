"""TensorBoard event files of a run, under ``RUN_DIR/tensorboard/``, from its typed events.

:class:`TensorBoardSink` is called with each event as the trainer emits it and writes, with
tensorboardX's ``SummaryWriter`` (the ``observe`` extra), these scalars against the step,
each stamped with the event's own ``wall`` time so TensorBoard's relative and wall-time axes
show the run as it happened:

- ``train/loss``, ``train/<metric>`` for each of the loss function's metrics,
  ``train/step_seconds``, ``train/steps_per_second`` (from the wall time
  between consecutive steps of one attempt; ``1 / seconds`` for an attempt's first step),
  ``elastic/active_slices`` and ``data/examples_consumed``;
- ``eval/loss`` and ``eval/<metric>`` at each evaluation pass's step, and
  ``eval/seconds``;
- ``events/stop``, ``events/resume`` and ``events/fault``: a marker of value 1 at the step
  of each stop, resume and fault, with a text entry (``events``) saying what it was;
- at :meth:`~TensorBoardSink.close`: ``goodput/goodput`` (a fraction) and
  ``badput/<category>`` (seconds) for every category of the summary it is given.

Every process of a run writes its own event file in the same directory; TensorBoard reads
them as one run.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastic_dew.elastic.events import Eval, Event, Fault, Resume, Start, Step, Stop, describe
from elastic_dew.observe.extras import require
from elastic_dew.rundir import TENSORBOARD_DIR

__all__ = ["TENSORBOARD_DIR", "TensorBoardSink"]

log = logging.getLogger(__name__)


class TensorBoardSink:
    """Write a run's events as TensorBoard scalars under ``run_dir/tensorboard/``.

    The directory and its event file are made at the first event, so a run refused before
    it starts leaves its run directory untouched.

    Args:
        run_dir: the run directory.

    Raises:
        ImportError: tensorboardX is missing (naming the extra that installs it).
    """

    name = "TensorBoard"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self._writer_class = require("TensorBoard output", "tensorboardX").SummaryWriter
        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self._opened: Any = None
        self._last_step_wall: float | None = None
        self._step = 0
        self._wall = 0.0
        self._closed = False

    @property
    def _writer(self) -> Any:
        if self._opened is None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            # The default file name has one-second resolution: a process that resumes within
            # the second would write over its predecessor's file. Readers take files in name
            # order, so the suffix sorts by time too.
            self._opened = self._writer_class(
                logdir=str(self.log_dir), filename_suffix=f".{time.time_ns():020d}.{os.getpid()}"
            )
        return self._opened

    def __call__(self, event: Event) -> None:
        """Write one event."""
        if self._closed:
            raise ValueError(f"the TensorBoard sink of {self.log_dir} is closed")
        w = self._writer
        self._wall = max(self._wall, event.wall)
        if isinstance(event, Step):
            self._step = event.step
            if self._last_step_wall is not None and event.wall > self._last_step_wall:
                rate = 1.0 / (event.wall - self._last_step_wall)
            else:
                rate = 1.0 / event.seconds if event.seconds > 0 else 0.0
            self._last_step_wall = event.wall
            for tag, value in (
                ("train/loss", event.loss),
                ("train/step_seconds", event.seconds),
                ("train/steps_per_second", rate),
                ("elastic/active_slices", event.slices),
                ("data/examples_consumed", event.examples[1]),
                *((f"train/{name}", value) for name, value in event.metrics.items()),
            ):
                w.add_scalar(tag, float(value), event.step, walltime=event.wall)
        elif isinstance(event, Eval):
            for name, value in (*event.metrics.items(), ("seconds", event.seconds)):
                w.add_scalar(f"eval/{name}", float(value), event.step, walltime=event.wall)
        elif isinstance(event, Stop | Resume | Fault):
            if isinstance(event, Resume):
                self._last_step_wall = None  # a new attempt's rate starts afresh
            w.add_scalar(f"events/{event.kind}", 1.0, event.step, walltime=event.wall)
            w.add_text("events", describe(event), event.step, walltime=event.wall)
        elif isinstance(event, Start):
            self._last_step_wall = None

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Write the summary's goodput and badput (when given) and close the event file.

        ``summary`` is ``summary.json``'s content (``goodput``, ``badput``, ``final_step``).

        Args:
            summary: the run's summary, whose figures are written as the last scalars, or ``None``.
        """
        if self._closed:
            return
        if self._opened is None:  # never written: nothing to close
            self._closed = True
            return
        if summary is not None:
            step = summary.get("final_step")
            step = self._step if step is None else int(step)
            wall = self._wall or None
            self._writer.add_scalar(
                "goodput/goodput", float(summary.get("goodput") or 0.0), step, walltime=wall
            )
            for name, seconds in (summary.get("badput") or {}).items():
                self._writer.add_scalar(f"badput/{name}", float(seconds), step, walltime=wall)
        self._writer.flush()
        self._writer.close()
        self._closed = True
