"""Whether this process's storage traffic is moving: the clock the storage deadline reads.

The storage timeout (``ElasticConfig.storage_timeout``, ``--storage-timeout``) is the longest
time the storage may go **without activity** before an operation counts as stalled; a commit
that keeps moving is never given up on, however long it takes. Activity is measured where
the storage clients already count it, never by polling the bucket:

- **TensorStore** (a checkpoint's arrays, on ``gs://`` and on local disks) keeps process-wide
  metrics (``tensorstore.experimental_collect_matching_metrics``): HTTP requests that got an
  answer (``/tensorstore/http/request_completed``, any status: a 503 answered is the bucket
  answering, and the client's retry budget bounds those), the bytes its key-value stores
  read and wrote (``/tensorstore/kvstore/{gcs,file,...}/bytes_read`` and ``bytes_written``,
  counted when an operation completes) and its retries (``.../retries``). A request held
  without an answer moves none of them (measured: a stalled upload, and the transfer curl
  drops at ``TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS``, leave them all unchanged).
- **gcsfs** (directories, metadata, ``commit_success.txt``) runs on an ``aiohttp`` session
  whose ``trace_configs`` hooks :func:`trace_config` feeds here (installed by
  :func:`~elastic_dew.elastic.state.storage_clients.configure_clients` through fsspec's
  configuration): each answer (its status; 429 and 5xx are the answers gcsfs retries) and
  each chunk of a body read. The bytes of an upload count once it is answered: a body sent
  again after a timeout is not activity.

Orbax's own hooks (its ``jax.monitoring`` durations, ``AsyncOptions`` callbacks) fire only
when a phase ends, so they cannot tell a forty-second commit that is moving from one that
is stuck; they are not used here. Activity is per process, not per request: one request
held while others move is ended by its client's own per-request timeout, which
:func:`~elastic_dew.elastic.state.storage_clients.configure_clients` sets to the same timeout, and
retried by the client. Writes through plain Python file calls (Orbax's metadata on a local
disk) are seen by nobody: on such storage the deadline measures the operation's time since
the last activity TensorStore saw, at worst its whole duration.

The granularity is one request: bytes of a request still in flight are counted when it
completes, so the deadline must exceed the transfer time of the largest single object
(the automatic timeout does: :func:`~elastic_dew.elastic.state.storage.automatic_timeout`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, NamedTuple

__all__ = ["Counters", "Meter", "METER", "trace_config"]

logger = logging.getLogger(__name__)

#: The least seconds between two reads of TensorStore's metrics (each read walks them all).
POLL_SECONDS = 0.1


class Counters(NamedTuple):
    """What this process's storage clients have done so far (monotonic counts).

    Attributes:
        answered: requests that got an answer (any status) and local reads and writes done.
        nbytes: payload bytes read or written, counted as each operation completed.
        retries: retries the clients made or were asked for (429 and 5xx answers, dropped
            connections).
    """

    answered: int
    nbytes: int
    retries: int

    def __sub__(self, other: tuple) -> Counters:
        return Counters(*(a - b for a, b in zip(self, other)))


def _tensorstore() -> Counters:
    """TensorStore's counts, or zeros where it is not imported (it counts nothing then)."""
    import sys

    ts = sys.modules.get("tensorstore")
    if ts is None:
        return Counters(0, 0, 0)
    answered = nbytes = retries = 0
    try:
        metrics = ts.experimental_collect_matching_metrics("/tensorstore/")
    except Exception:  # noqa: BLE001 - a build without metrics: nothing measured
        return Counters(0, 0, 0)
    for metric in metrics:
        name = metric.get("name", "")
        values = metric.get("values") or []
        if not name.startswith(("/tensorstore/http/", "/tensorstore/kvstore/")):
            continue
        total = sum(v.get("value", 0) for v in values if isinstance(v.get("value", 0), (int, float)))
        if name == "/tensorstore/http/request_completed":
            answered += int(total)
        elif name.startswith("/tensorstore/kvstore/") and name.endswith(("/bytes_read", "/bytes_written")):
            nbytes += int(total)
        elif name.startswith("/tensorstore/kvstore/") and name.endswith("/retries"):
            retries += int(total)
        elif name.startswith("/tensorstore/kvstore/file/") and name.endswith(("/read", "/write")):
            answered += int(total)  # a local disk's operations done (no HTTP requests there)
    return Counters(answered, nbytes, retries)


class Meter:
    """The time of the last activity of this process's storage clients, and their counts.

    :meth:`note` takes what a client's hook reports (pushed); TensorStore's metrics are read
    (pulled) when :meth:`counters` is asked, and at most every :data:`POLL_SECONDS` when
    :meth:`last_activity` is. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pushed = Counters(0, 0, 0)
        self._pulled = Counters(0, 0, 0)
        self._polled = float("-inf")
        self._last = time.monotonic()

    def note(self, answered: int = 0, nbytes: int = 0, retries: int = 0) -> None:
        """A client answered ``answered`` requests and moved ``nbytes``; ``retries`` retries seen.

        Args:
            answered: requests answered.
            nbytes: payload bytes moved.
            retries: retriable answers or dropped connections seen.
        """
        with self._lock:
            self._pushed = Counters(self._pushed.answered + answered, self._pushed.nbytes + nbytes,
                                    self._pushed.retries + retries)
            if answered or nbytes:
                self._last = time.monotonic()

    def _pull(self, fresh: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            if not fresh and now - self._polled < POLL_SECONDS:
                return
            self._polled = now
        pulled = _tensorstore()
        with self._lock:
            if pulled.answered != self._pulled.answered or pulled.nbytes != self._pulled.nbytes:
                self._last = max(self._last, now)
            self._pulled = pulled

    def last_activity(self) -> float:
        """The ``time.monotonic()`` of the last request answered or byte moved seen so far."""
        self._pull()
        with self._lock:
            return self._last

    def idle(self, since: float) -> float:
        """Seconds without activity, counted from ``since`` (a ``time.monotonic()``) at the earliest.

        Args:
            since: when the operation began (activity before it does not count).

        Returns:
            The seconds since the later of ``since`` and the last activity.
        """
        return time.monotonic() - max(since, self.last_activity())

    def counters(self) -> Counters:
        """The clients' counts so far (take two and subtract for one operation's)."""
        self._pull(fresh=True)
        with self._lock:
            return Counters(*(a + b for a, b in zip(self._pushed, self._pulled)))


#: The process's meter: the one the storage calls read.
METER = Meter()

_trace: Any = None


def trace_config() -> Any:
    """An ``aiohttp.TraceConfig`` that reports every answer and body chunk to :data:`METER`
    (one per process; ``None`` without aiohttp). gcsfs passes it to its session through its
    ``session_kwargs``."""
    global _trace
    if _trace is not None:
        return _trace
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - gcsfs brings it
        return None

    async def on_request_end(session: Any, context: Any, params: Any) -> None:
        status = getattr(params.response, "status", 0)
        sent = 0
        if status < 300:
            try:
                sent = int(params.headers.get("Content-Length") or 0)
            except (TypeError, ValueError):
                sent = 0
        if status == 429 or status >= 500:
            logger.debug("storage request %s %s answered %d", params.method, params.url, status)
        METER.note(answered=1, nbytes=sent, retries=int(status == 429 or status >= 500))

    async def on_response_chunk_received(session: Any, context: Any, params: Any) -> None:
        METER.note(nbytes=len(params.chunk))

    async def on_request_exception(session: Any, context: Any, params: Any) -> None:
        # A dropped connection or a timeout is what gcsfs retries; a request gcsfs cancelled
        # itself (racing lookups) is not.
        if isinstance(params.exception, (aiohttp.ClientError, OSError, TimeoutError)):
            logger.debug("storage request %s %s raised %r", params.method, params.url, params.exception)
            METER.note(retries=1)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_request_end)
    trace.on_response_chunk_received.append(on_response_chunk_received)
    trace.on_request_exception.append(on_request_exception)
    _trace = trace
    return trace
