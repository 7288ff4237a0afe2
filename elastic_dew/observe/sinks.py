"""The observability options of a run, and the one callable that feeds every chosen sink.

A program's entry point adds the options with :func:`add_options`, reads them back with
:func:`options_of`, calls :func:`~elastic_dew.observe.logs.setup_logging` with the log
format, and hands a :class:`Sinks` the trainer's events (it is a ``progress`` callable).

- ``--log-format {auto,text,json}`` (default ``auto``: text on a terminal, JSON lines
  otherwise);
- ``--tensorboard`` / ``--no-tensorboard``: TensorBoard event files under
  ``RUN_DIR/tensorboard/``. By default on when tensorboardX is installed (the ``observe``
  extra) and off, with one INFO line saying so, when it is not: the files cost little and
  are what MaxText users look at first, but a missing optional library must not stop a
  run. ``--tensorboard`` without tensorboardX is refused before the run starts;
- ``--goodput-export``: record the run through ml-goodput-measurement's recorder to Cloud
  Logging (the ``gke`` extra); off by default because it writes outside the run directory.

A sink that fails while the run goes on is logged once and dropped: observing a run must
never stop it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from elastic_dew.elastic.events import Event, Step, from_json
from elastic_dew.observe.logs import LOG_FORMATS, log_context

__all__ = [
    "ObserveOptions",
    "Sinks",
    "add_log_format",
    "add_options",
    "options_of",
    "progress_bar_available",
    "tensorboard_available",
]

log = logging.getLogger(__name__)


def tensorboard_available() -> bool:
    """Whether tensorboardX (the ``observe`` extra) is installed."""
    return importlib.util.find_spec("tensorboardX") is not None


def progress_bar_available() -> bool:
    """Whether tqdm (the ``observe`` extra, for the terminal progress bar) is installed."""
    return importlib.util.find_spec("tqdm") is not None


@dataclasses.dataclass(frozen=True)
class ObserveOptions:
    """How a run is observed (see the module for each option and its default)."""

    log_format: str = "auto"
    tensorboard: bool | None = None
    goodput_export: bool = False

    def __post_init__(self) -> None:
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log format {self.log_format!r} is not one of {LOG_FORMATS}")
        if self.tensorboard and not tensorboard_available():
            raise ValueError(
                "--tensorboard needs tensorboardX: pip install 'elastic-dew[observe]', or "
                "pass --no-tensorboard"
            )
        if self.goodput_export and importlib.util.find_spec("ml_goodput_measurement") is None:
            raise ValueError(
                "--goodput-export needs ml-goodput-measurement: pip install 'elastic-dew[gke]'"
            )

    @property
    def writes_tensorboard(self) -> bool:
        """Whether TensorBoard files are written (the default resolved)."""
        return tensorboard_available() if self.tensorboard is None else self.tensorboard


def add_log_format(parser: argparse.ArgumentParser) -> None:
    """``--log-format``, declared once for every command that takes it (``train``, ``demo``)."""
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default="auto",
        help="log lines as text or as JSON lines with a Cloud Logging severity; auto is text "
        "on a terminal and JSON lines otherwise (default: %(default)s)",
    )


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--log-format``, ``--tensorboard/--no-tensorboard`` and ``--goodput-export``."""
    add_log_format(parser)
    parser.add_argument(
        "--tensorboard", action=argparse.BooleanOptionalAction, default=None,
        help="write TensorBoard event files under RUN_DIR/tensorboard/ (default: on when "
        "tensorboardX, the observe extra, is installed)",
    )
    parser.add_argument(
        "--goodput-export", action="store_true",
        help="record the run through ml-goodput-measurement's recorder to Cloud Logging, for "
        "its goodput dashboards (the gke extra; default: off)",
    )


def options_of(args: argparse.Namespace) -> ObserveOptions:
    """The :class:`ObserveOptions` that parsed options ask for (raises ``ValueError``)."""
    return ObserveOptions(
        log_format=getattr(args, "log_format", "auto") or "auto",
        tensorboard=getattr(args, "tensorboard", None),
        goodput_export=bool(getattr(args, "goodput_export", False)),
    )


class Sinks:
    """Every chosen sink behind one callable: call it with each event, close it at the end.

    Arguments:
      options: what to write.
      run_dir: the run directory (TensorBoard files go under it).
      job_name: the run's name for the goodput export (default: the run directory's name).
      total_slices: the allocation's slices, for the export's slice counts.
      display: a further callable to feed first (the progress display), or ``None``.
      cloud_logger: the goodput export's logger object (``None``: Cloud Logging).
    """

    def __init__(
        self,
        options: ObserveOptions,
        run_dir: str | os.PathLike[str],
        *,
        job_name: str | None = None,
        total_slices: int | None = None,
        display: Callable[[Any], None] | None = None,
        cloud_logger: Any = None,
    ) -> None:
        self.options = options
        self._sinks: list[tuple[str, Any]] = []
        if display is not None:
            self._sinks.append(("progress display", display))
        if options.writes_tensorboard:
            from elastic_dew.observe.tensorboard import TensorBoardSink

            self._sinks.append(("TensorBoard", TensorBoardSink(run_dir)))
        elif options.tensorboard is None:
            log.info("no TensorBoard files: tensorboardX is not installed (the observe extra)")
        if options.goodput_export:
            from elastic_dew.observe.goodput_export import GoodputExport

            self._sinks.append(("goodput export", GoodputExport(
                job_name or Path(run_dir).resolve().name,
                cloud_logger=cloud_logger,
                total_slices=total_slices,
            )))

    @property
    def names(self) -> list[str]:
        """The sinks being fed, in order."""
        return [name for name, _ in self._sinks]

    def __call__(self, event: Event | Mapping[str, Any]) -> None:
        typed = event if isinstance(event, Event) else from_json(event)
        if isinstance(typed, Step):
            log_context.update(step=typed.step, slices=typed.slices)
        for name, sink in list(self._sinks):
            try:
                # The progress display predates typed events and takes either.
                sink(event if name == "progress display" else typed)
            except Exception:
                log.exception("the %s failed; the run goes on without it", name)
                self._sinks.remove((name, sink))

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Close every sink but the display, whose owner closes it (TensorBoard gets the
        summary's goodput and badput)."""
        for name, sink in self._sinks:
            close = getattr(sink, "close", None)
            if close is None or name == "progress display":
                continue
            try:
                close(summary) if name == "TensorBoard" else close()
            except Exception:
                log.exception("closing the %s failed", name)
        self._sinks = []
