"""Log records as Cloud Logging reads them: JSON lines with a severity, or plain text.

GKE's logging agent files every unstructured line a container writes to standard error as
severity ERROR, so a controller's INFO lines would all show up as errors. A JSON line with a
``severity`` key is filed under that severity instead, and its other keys become fields of
the entry. :class:`JsonFormatter` writes one such line per record:

``severity``      Cloud Logging's name (``DEBUG``, ``INFO``, ``WARNING``, ``ERROR``,
                  ``CRITICAL``)
``message``       the formatted message, with the traceback of an exception appended (Error
                  Reporting reads it from there)
``logger``        the logger's name
``time``          RFC 3339, UTC
``step``,         the training step and active slice count, when known: the trainer keeps
``slices``        them in :data:`log_context`
(a record's own)  the keys of the record's ``json_fields`` mapping, the convention of Google
                  Cloud Logging's Python library (``log.info(..., extra={"json_fields":
                  {...}})``): the progress display's step lines carry ``loss`` and
                  ``metrics`` (the loss function's), its evaluation lines ``eval``
``logging.googleapis.com/sourceLocation``  file, line and function of the call

:func:`setup_logging` installs one handler on the root logger, text on a terminal and JSON
lines elsewhere (``"auto"``), or either on request. Library code keeps logging through
:mod:`logging`; only the program's entry point calls :func:`setup_logging`.

Two policies live here too, so every entry point applies them alike. ``-v`` asks for
elastic_dew's own debug lines (:func:`set_verbose`), not every library's: turning the root
logger to DEBUG drowns a run in matplotlib's font lines and JAX's compilation traces.
And pathwaysutils logs every slice loss it handles at ERROR with a traceback
(``pathwaysutils.elastic.manager``: ``"Elastic event detected"``), which Cloud Logging and
Error Reporting would show as an error although the retry recovers from it;
:class:`~elastic_dew.elastic.slices.loss_log.HandledSliceLossFilter` (installed by the elastic layer
when it creates the manager, so a library user who never calls :func:`setup_logging` gets it
too) files exactly those records as one WARNING line without the traceback. When the retry
policy then gives up, the run's own ERROR line says so.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import threading
from collections import deque
from typing import Any, Literal, TextIO

from elastic_dew.elastic.slices.loss_log import install_slice_loss_filter
from elastic_dew.rundir import RUN_LOG_FILE

__all__ = [
    "LOG_FORMATS",
    "TEXT_FORMAT",
    "VERBOSE_LOGGERS",
    "JsonFormatter",
    "RunLog",
    "STORY_LOGGERS",
    "TerminalFilter",
    "attach_run_log",
    "LogContext",
    "is_terminal",
    "is_verbose",
    "log_context",
    "set_verbose",
    "severity",
    "setup_logging",
]

#: The values ``setup_logging`` (and ``--log-format``) accept.
LOG_FORMATS = ("auto", "text", "json")
#: The plain-text line.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The loggers ``-v`` turns to DEBUG: elastic_dew's own. Third-party loggers stay at INFO.
VERBOSE_LOGGERS = ("elastic_dew",)

#: On a terminal, the loggers whose INFO lines are the run's story and stay on it: the
#: progress display's step, fault, stop and resume lines.
STORY_LOGGERS = ("elastic_dew.observe.progress",)

_SEVERITIES = ((logging.CRITICAL, "CRITICAL"), (logging.ERROR, "ERROR"),
               (logging.WARNING, "WARNING"), (logging.INFO, "INFO"))


def severity(levelno: int) -> str:
    """Cloud Logging's severity name for a :mod:`logging` level number."""
    for floor, name in _SEVERITIES:
        if levelno >= floor:
            return name
    return "DEBUG"


class LogContext:
    """Fields every JSON line carries while they are known (the step, the active slices).

    The trainer updates it as steps complete; a value of ``None`` removes a field. Safe to
    update from any thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fields: dict[str, Any] = {}

    def update(self, **fields: Any) -> None:
        with self._lock:
            for key, value in fields.items():
                if value is None:
                    self._fields.pop(key, None)
                else:
                    self._fields[key] = value

    def clear(self) -> None:
        with self._lock:
            self._fields.clear()

    def fields(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._fields)


#: The process's log context, read by every :class:`JsonFormatter`.
log_context = LogContext()


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the keys Cloud Logging reads (see the module).

    Args:
        context: the run's context fields (run, process, ...), or ``None`` for the process's own.
    """

    def __init__(self, context: LogContext | None = None) -> None:
        super().__init__()
        self.context = context if context is not None else log_context

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON line (its message, severity, time, source and context).

        Args:
            record: the log record.

        Returns:
            The JSON line.
        """
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        elif record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        entry: dict[str, Any] = {
            "severity": severity(record.levelno),
            "message": message,
            "logger": record.name,
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
        }
        entry.update(self.context.fields())
        entry.update(getattr(record, "json_fields", None) or {})
        entry["logging.googleapis.com/sourceLocation"] = {
            "file": record.pathname,
            "line": str(record.lineno),
            "function": record.funcName,
        }
        return json.dumps(entry, default=str, ensure_ascii=False)


def set_verbose(verbose: bool) -> None:
    """DEBUG for :data:`VERBOSE_LOGGERS` when ``verbose``, else their level from the root."""
    for name in VERBOSE_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.NOTSET)


def is_verbose() -> bool:
    """Whether elastic_dew's debug lines are on (``-v``, or a root logger at DEBUG)."""
    return logging.getLogger(VERBOSE_LOGGERS[0]).isEnabledFor(logging.DEBUG)


class TerminalFilter(logging.Filter):
    """What a person reads on a terminal: warnings and errors, and the run's story
    (:data:`STORY_LOGGERS`); the routine INFO lines go to the run log (:class:`RunLog`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name in STORY_LOGGERS


class RunLog(logging.Handler):
    """Every record, written to ``RUN_DIR/run.log`` (``rundir.RUN_LOG_FILE``) once the run directory
    is known (:meth:`attach`); until then the records are held in memory (at most
    :attr:`HELD` of them, the oldest dropped first), so the lines of a process's start
    (JAX's backend, the plan) land in the file too."""

    HELD = 10_000

    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.setFormatter(logging.Formatter(TEXT_FORMAT))
        self._held: deque[logging.LogRecord] = deque(maxlen=self.HELD)  # the oldest dropped first
        self._file: logging.FileHandler | None = None
        self.path: Any = None

    def attach(self, run_dir: Any) -> None:
        """Write to ``run_dir``'s run log from now on, starting with the records held."""
        import pathlib

        path = pathlib.Path(run_dir) / RUN_LOG_FILE
        if self._file is not None and self.path == path:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self.acquire()
        try:
            if self._file is not None:
                self._file.close()
            self._file = logging.FileHandler(path, encoding="utf-8")
            self._file.setFormatter(self.formatter)
            self.path = path
            while self._held:
                self._file.emit(self._held.popleft())
        finally:
            self.release()

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is not None:
            self._file.emit(record)
            return
        self._held.append(record)

    def close(self) -> None:
        self.acquire()
        try:
            if self._file is not None:
                self._file.close()
                self._file = None
        finally:
            self.release()
        super().close()


def attach_run_log(run_dir: Any) -> Any:
    """Point the root logger's :class:`RunLog` (installed by :func:`setup_logging` on a
    terminal) at ``run_dir``; returns the log's path, or None when there is none."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, RunLog):
            handler.attach(run_dir)
            return handler.path
    return None


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (``False`` for one without ``isatty`` or closed)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def setup_logging(
    fmt: Literal["auto", "text", "json"] = "auto",
    stream: TextIO | None = None,
    *,
    level: int = logging.INFO,
) -> logging.Handler:
    """Send the root logger's records to ``stream`` (standard error) as text or JSON lines.

    ``"auto"`` is text when ``stream`` is a terminal and JSON lines otherwise (a pod's log,
    a pipe, CI). Replaces the root logger's handlers, so calling it again switches format.
    ``level`` is the root logger's, so third-party libraries' too; ``-v`` is
    :func:`set_verbose`. Installs the elastic layer's ``HandledSliceLossFilter``. Returns the handler.

    Text on a terminal is for a person: without ``-v`` (:func:`is_verbose`, set before this
    call) the terminal shows warnings, errors and the run's story (:class:`TerminalFilter`),
    and every record also goes to a :class:`RunLog`, written to the run directory once
    :func:`attach_run_log` names it. JSON lines, and text that is not on a terminal, show
    every record as before.

    Args:
        fmt: ``auto``, ``text`` or ``json``.
        stream: where records go (standard error by default).
        level: the root logger's level.

    Returns:
        The handler installed.

    Raises:
        ValueError: ``fmt`` is not one of :data:`LOG_FORMATS`.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {LOG_FORMATS}; give auto (text on a "
                         "terminal, JSON lines otherwise), text or json")
    stream = stream if stream is not None else sys.stderr
    if fmt == "auto":
        fmt = "text" if is_terminal(stream) else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    if fmt == "text" and is_terminal(stream) and not is_verbose():
        handler.addFilter(TerminalFilter())
        root.addHandler(RunLog())
    root.setLevel(level)
    install_slice_loss_filter()
    return handler
