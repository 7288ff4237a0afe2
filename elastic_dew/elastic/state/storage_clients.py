"""What the storage libraries are told: their own per-request timeouts, and where their error logs go.

- :func:`configure_clients` gives the Cloud Storage clients' per-request timeouts the storage
  timeout (:data:`CLIENT_SETTINGS` says what it sets), so that a request a bounded call
  (:func:`~elastic_dew.elastic.state.storage.bounded`) gave up on ends as well;
- :func:`divert_library_errors`: Orbax's asynchronous writers log each failed write with
  its traceback (and asyncio its never-retrieved task errors); during a run those go to a
  log file in the run directory, and the terminal gets elastic_dew's one line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from elastic_dew.elastic.state.activity import trace_config as activity_trace_config
from elastic_dew.elastic.state.storage import FLOOR_SECONDS

__all__ = ["CLIENT_SETTINGS", "configure_clients", "divert_library_errors"]


#: What :func:`configure_clients` sets, per client (each kept when the user set it already).
CLIENT_SETTINGS = {
    "TensorStore (the arrays)": "TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS=<timeout> and "
    "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES=1: a transfer that moves nothing for that long is "
    "dropped and retried by TensorStore's own gcs_request_retries (32 tries, 1 s to 32 s backoff)",
    "gcsfs (directories, metadata, commit_success.txt)": "requests_timeout=<timeout> in fsspec's "
    "configuration for gs://: each request ends after that long and gcsfs retries it (6 tries, "
    "backoff up to 32 s); and an aiohttp trace config in its session_kwargs that tells the "
    "activity meter (elastic_dew.elastic.state.activity) of every answer and body chunk",
    "google-cloud-storage (Orbax's bucket-layout question)": "nothing: its DEFAULT_RETRY already "
    "gives up after 120 s",
}


def configure_clients(timeout: float | None) -> dict[str, str]:
    """Give the Cloud Storage clients' own per-request timeouts the storage timeout (``None``:
    :data:`FLOOR_SECONDS`), so that a request a bounded call gave up on ends as well instead
    of holding its connection for ever; their retries of 429 and 5xx answers stay theirs
    (:data:`CLIENT_SETTINGS`). Call it before the first Cloud Storage request (TensorStore
    reads its variables when it opens its HTTP transport). Returns what it set."""
    seconds = str(max(1, int(math.ceil(timeout or FLOOR_SECONDS))))
    wanted = {"TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS": seconds, "TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES": "1"}
    applied = {name: value for name, value in wanted.items() if name not in os.environ}
    os.environ.update(applied)
    try:
        from fsspec.config import conf
    except ImportError:  # pragma: no cover - fsspec comes with the base install
        return applied
    trace = activity_trace_config()
    for protocol in ("gs", "gcs"):
        if "requests_timeout" not in conf.setdefault(protocol, {}):
            conf[protocol]["requests_timeout"] = float(seconds)
            applied[f"fsspec {protocol} requests_timeout"] = seconds
        traces = conf[protocol].setdefault("session_kwargs", {}).setdefault("trace_configs", [])
        if trace is not None and trace not in traces:
            traces.append(trace)
            applied[f"fsspec {protocol} session_kwargs trace_configs"] = "the storage activity meter"
    return applied


#: Loggers whose errors carry a library's traceback of a failed write.
_LIBRARY_LOGGERS = ("absl", "asyncio", "orbax", "tensorstore", "gcsfs", "google")


class _ToFile(logging.Filter):
    """Sends a library's error records to a file handler instead of the terminal."""

    def __init__(self, handler: logging.FileHandler) -> None:
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR and not record.exc_info:
            return True
        if record.name.split(".")[0] not in _LIBRARY_LOGGERS:
            return True
        if not Path(self.handler.baseFilename).parent.is_dir():
            return True  # no run directory yet: the terminal keeps it
        self.handler.handle(record)
        return False


@contextlib.contextmanager
def divert_library_errors(path: str | os.PathLike[str]) -> Iterator[Path]:
    """While inside, the Cloud Storage and Orbax libraries' error records (each with its
    traceback) go to ``path`` instead of the terminal; their other records pass. The file is
    created on the first record. Yields ``path``."""
    path = Path(path)
    handler = logging.FileHandler(path, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(threadName)s: %(message)s"))
    diverted = _ToFile(handler)
    # On the libraries' own loggers, and on the root's handlers for their child loggers'
    # records (a logger's filters do not see what its children propagate).
    loggers = [logging.getLogger(name) for name in _LIBRARY_LOGGERS] + list(logging.getLogger().handlers)
    for each in loggers:
        each.addFilter(diverted)
    # TensorStore's completion callbacks into an event loop Orbax already closed raise
    # "Event loop is closed" outside any logger: printed by the interpreter's hooks.
    previous_except, previous_unraisable = sys.excepthook, sys.unraisablehook

    def to_file(kind: Any, error: BaseException | None, tb: Any) -> bool:
        if error is None or not _from_libraries(tb) or not path.parent.is_dir():
            return False
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as out:
            out.write("".join(traceback.format_exception(kind, error, tb)))
        return True

    def excepthook(kind: Any, error: BaseException, tb: Any) -> None:
        if not to_file(kind, error, tb):
            previous_except(kind, error, tb)

    def unraisablehook(unraisable: Any) -> None:
        if not to_file(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback):
            previous_unraisable(unraisable)

    sys.excepthook, sys.unraisablehook = excepthook, unraisablehook
    try:
        yield path
    finally:
        if sys.excepthook is excepthook:
            sys.excepthook = previous_except
        if sys.unraisablehook is unraisablehook:
            sys.unraisablehook = previous_unraisable
        for each in loggers:
            each.removeFilter(diverted)
        handler.close()


def _from_libraries(tb: Any) -> bool:
    """Whether a traceback runs through asyncio, Orbax or TensorStore code."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if any(part in name for part in ("/asyncio/", "/orbax/", "/tensorstore/")):
            return True
        tb = tb.tb_next
    return False
