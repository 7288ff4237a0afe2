"""The run's one event stream, and the observability options that choose its sinks.

:class:`Sinks` is the one fan-out: the protocol emits each typed event to it and it hands
the event, in order, to each sink of one list (the run record, the progress display,
TensorBoard, the goodput export, a user's own callable). A program's entry point reads
:class:`ObserveOptions` (which the command line offers as flags, :mod:`elastic_dew.console`), calls :func:`~elastic_dew.observe.logs.setup_logging` with the
log format, and gives the trainer :func:`chosen`'s sinks beside its display:

- ``log_format`` ``auto``, ``text`` or ``json`` (default ``auto``: text on a terminal, JSON
  lines otherwise);
- ``tensorboard``: TensorBoard event files under ``RUN_DIR/tensorboard/``. By default
  (``None``) on when tensorboardX is installed (the ``observe`` extra) and off, with one
  INFO line saying so, when it is not: the files cost little and are what MaxText users
  look at first, but a missing optional library must not stop a run. ``True`` without
  tensorboardX is refused before the run starts;
- ``goodput_export``: record the run through ml-goodput-measurement's recorder to Cloud
  Logging (the ``gke`` extra); off by default because it writes outside the run directory.

A sink that fails while the run goes on is logged once and dropped: observing a run must
never stop it. A *required* sink (the run record) is not: its failure is the run's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from elastic_dew.elastic.events import Event, Sink, Step
from elastic_dew.observe.extras import available, missing
from elastic_dew.observe.logs import LOG_FORMATS, log_context
from elastic_dew.settings import SettingError, check_fields, mention, setting

__all__ = [
    "ObserveOptions",
    "Sinks",
    "chosen",
    "close",
    "name_of",
    "tensorboard_available",
]

log = logging.getLogger(__name__)


def tensorboard_available() -> bool:
    """Whether tensorboardX (the ``observe`` extra) is installed."""
    return available("tensorboardX")


@dataclasses.dataclass(frozen=True)
class ObserveOptions:
    """How a run is observed (see the module for each option and its default), each field
    declared once with :func:`~elastic_dew.settings.setting`.

    Args:
        log_format: log lines as text or as JSON lines with a Cloud Logging severity;
            ``auto`` is text on a terminal and JSON lines otherwise. One of
            :data:`~elastic_dew.observe.logs.LOG_FORMATS` (``auto``, ``text``, ``json``).
        tensorboard: write TensorBoard event files under ``RUN_DIR/tensorboard/``. ``None``:
            when tensorboardX (the ``observe`` extra) is installed.
        goodput_export: record the run through ml-goodput-measurement's recorder to Cloud
            Logging, for its goodput dashboards; it needs the ``gke`` extra.

    Raises:
        SettingError: (:class:`~elastic_dew.settings.SettingError`) a log format that is not one of those, or an option whose library is
            not installed (worded with the field, ``tensorboard=True needs tensorboardX; ...``).
    """

    log_format: str = setting("auto", choices=LOG_FORMATS)
    tensorboard: bool | None = None
    goodput_export: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if self.tensorboard and not tensorboard_available():
            raise SettingError(type(self), "tensorboard", True, problem=missing(
                mention("tensorboard", True), "tensorboardX") + f", or pass {mention('tensorboard', False)}")
        if self.goodput_export and not available("ml_goodput_measurement"):
            raise SettingError(type(self), "goodput_export", True, problem=missing(
                mention("goodput_export", True), "ml_goodput_measurement"))

    @property
    def writes_tensorboard(self) -> bool:
        """Whether TensorBoard files are written (the default resolved)."""
        return tensorboard_available() if self.tensorboard is None else self.tensorboard


def name_of(sink: Sink) -> str:
    """How logs name a sink: its ``name`` attribute, else its type's or function's name."""
    return getattr(sink, "name", None) or getattr(sink, "__name__", None) or type(sink).__name__


class Sinks:
    """The run's one event stream: each typed event, in order, to every sink of one list.

    ``sinks`` are fed in order; ``required`` ones (the run record) first, and their failure
    propagates. A failing optional sink is logged and dropped. Events may come from more
    than one thread (a fault fired while the run waits for slices); each is handed to every
    sink before the next one is.
    """

    def __init__(self, sinks: Iterable[Sink] = (), *, required: Iterable[Sink] = ()) -> None:
        self._required = list(required)
        self._optional = list(sinks)
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        """The sinks being fed, in order."""
        return [name_of(sink) for sink in self._required + self._optional]

    def __call__(self, event: Event) -> None:
        if not isinstance(event, Event):
            raise TypeError(f"the event stream takes typed events (elastic_dew.elastic.events), not {type(event).__name__}")
        with self._lock:
            if isinstance(event, Step):
                log_context.update(step=event.step, slices=event.slices)
            for sink in self._required:
                sink(event)
            for sink in list(self._optional):
                try:
                    sink(event)
                except Exception:
                    log.exception("the %s failed; the run goes on without it", name_of(sink))
                    self._optional.remove(sink)

    def end(self) -> None:
        """The run is over (returned or raised): later log lines carry none of its step and
        slice count, which each :class:`~elastic_dew.elastic.events.Step` put in
        :data:`~elastic_dew.observe.logs.log_context` (a process may run many trainings)."""
        log_context.update(step=None, slices=None)


def chosen(
    options: ObserveOptions,
    run_dir: str | os.PathLike[str],
    *,
    job_name: str | None = None,
    total_slices: int | None = None,
    cloud_logger: Any = None,
) -> list[Sink]:
    """The sinks ``options`` ask for: TensorBoard files under ``run_dir``, the goodput export
    (as ``job_name``, default the run directory's name; ``cloud_logger`` ``None`` is Cloud
    Logging; ``total_slices`` for its slice counts). Their owner closes them with
    :func:`close`."""
    out: list[Sink] = []
    if options.writes_tensorboard:
        from elastic_dew.observe.tensorboard import TensorBoardSink

        out.append(TensorBoardSink(run_dir))
    elif options.tensorboard is None:
        log.info("no TensorBoard files: tensorboardX is not installed (the observe extra)")
    if options.goodput_export:
        from elastic_dew.observe.goodput_export import GoodputExport

        out.append(GoodputExport(
            job_name or Path(run_dir).resolve().name, cloud_logger=cloud_logger, total_slices=total_slices,
        ))
    return out


def close(sinks: Iterable[Sink], summary: Mapping[str, Any] | None = None) -> None:
    """Close each sink that can be closed, with the run's summary (``summary.json``'s
    content, or ``None`` when the run did not finish); a failure is logged, never raised."""
    for sink in sinks:
        closer = getattr(sink, "close", None)
        if closer is None:
            continue
        try:
            closer(summary)
        except Exception:
            log.exception("closing the %s failed", name_of(sink))
