"""A loopback fault proxy in front of a Cloud Storage server, in the spirit of toxiproxy.

:class:`FaultProxy` listens on ``127.0.0.1`` and forwards every HTTP request to an upstream
server (the local :class:`~elastic_dew.testing.gcs_server.GCSServer`), except those a
:class:`ProxyFault` rule matches, which it answers with an error, holds, or cuts:

``error``
    an HTTP error answer (``status``: 503 and 429 are what the clients retry, 403 and 404
    what they give up on), with Cloud Storage's JSON error body; the request never reaches
    the server.
``stall``
    the request is held: until :meth:`FaultProxy.release` (``seconds=None``) or for
    ``seconds``; then it is forwarded as it was (a *late release*: an upload held past its
    writer's timeout still lands when released) and its answer written back if the client
    still listens.
``reset``
    the connection is closed with a TCP reset before any answer.

A rule matches by HTTP ``method`` and by a shell pattern over the request's object path
``BUCKET/OBJECT`` (taken from the URL, the ``name`` query of an upload, or the metadata part
of a multipart upload; a listing or bucket request's path is ``BUCKET/``), and fires on
every ``every``-th matching request, at most ``times`` times. Rules are added, removed and
released while the proxy runs (:meth:`FaultProxy.add`, :meth:`FaultProxy.remove`,
:meth:`FaultProxy.clear`); every request and what was done to it is counted in
:attr:`FaultProxy.log`.

Standard library only (a thread per connection). It binds only ``127.0.0.1``, and rewrites
the upstream's address in answers (a resumable upload's ``Location``, an object's
``mediaLink``) to its own, so a client never bypasses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import email.message
import http.client
import http.server
import json
import logging
import re
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterable

from elastic_dew.runtime.local_bucket import LoopbackServer
from elastic_dew.testing.waits import poll

__all__ = ["ProxyFault", "FaultProxy", "Request", "object_path"]

logger = logging.getLogger(__name__)

_ACTIONS = ("error", "stall", "reset")
_REASONS = {
    400: "badRequest", 401: "required", 403: "forbidden", 404: "notFound", 408: "requestTimeout",
    429: "rateLimitExceeded", 500: "backendError", 502: "badGateway", 503: "backendError", 504: "gatewayTimeout",
}
#: Headers of one hop that are not forwarded (the proxy sets its own framing).
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade", "content-length"}


@dataclasses.dataclass(frozen=True)
class Request:
    """One request as the proxy saw it: its method, object path and what was done to it
    (``forwarded``, ``error``, ``stall`` or ``reset``)."""

    method: str
    path: str
    url: str
    action: str


@dataclasses.dataclass(eq=False)
class ProxyFault:
    """A rule: ``action`` (``error``, ``stall``, ``reset``) on requests of ``method`` (any
    when ``None``) whose object path matches ``path`` (a shell pattern over
    ``BUCKET/OBJECT``; ``*`` matches ``/`` too), on every ``every``-th match, at most
    ``times`` times (``None``: no limit). ``status`` is an error's HTTP status; ``seconds``
    how long a stall holds (``None``: until :meth:`FaultProxy.release`)."""

    action: str
    method: str | None = None
    path: str = "*"
    status: int = 503
    every: int = 1
    times: int | None = None
    seconds: float | None = None
    #: Matching requests seen and faults fired so far.
    matched: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"fault action={self.action!r} must be one of {', '.join(_ACTIONS)}")
        if self.every < 1:
            raise ValueError(f"every={self.every} must be >= 1")
        if self.times is not None and self.times < 0:
            raise ValueError(f"times={self.times} must be >= 0")
        if self.method is not None:
            self.method = self.method.upper()

    def fires_on(self, method: str, path: str) -> bool:
        """Count a request; whether this rule fires on it (called under the proxy's lock)."""
        if self.method is not None and method != self.method:
            return False
        if not fnmatch.fnmatchcase(path, self.path):
            return False
        self.matched += 1
        if self.matched % self.every or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


def object_path(method: str, target: str, headers: email.message.Message | dict, body: bytes) -> str:
    """``BUCKET/OBJECT`` of a Cloud Storage JSON or upload API request (``BUCKET/`` for a
    listing or a bucket request, ``""`` for anything else)."""
    parsed = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qs(parsed.query)
    match = re.match(r"^(?:/upload|/download)?/storage/v1/b/([^/]+)(?:/o(?:/(.+))?)?", parsed.path)
    if match is None:
        # The XML API's path style: /BUCKET/OBJECT.
        parts = parsed.path.lstrip("/").split("/", 1)
        return urllib.parse.unquote(parts[0]) + "/" + urllib.parse.unquote(parts[1] if len(parts) > 1 else "")
    bucket, name = urllib.parse.unquote(match.group(1)), match.group(2)
    if name is not None:
        return f"{bucket}/{urllib.parse.unquote(name)}"
    if "name" in query:
        return f"{bucket}/{query['name'][0]}"
    content_type = headers.get("Content-Type", "") or ""
    if body and ("multipart" in content_type or "json" in content_type):
        found = re.search(rb'"name"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
        if found:
            name = json.loads(b'"' + found.group(1) + b'"')
            return f"{bucket}/{name}"
    return f"{bucket}/"


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def get_request(self) -> tuple[socket.socket, object]:
        # An answer's headers and body go out in separate writes: without TCP_NODELAY, Nagle's
        # algorithm holds the body until the client's delayed acknowledgement, tens of
        # milliseconds a request (a checkpoint save is about a hundred requests).
        connection, address = super().get_request()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001 - socketserver's signature
        logger.debug("fault proxy connection from %s ended with an error", client_address, exc_info=True)


class FaultProxy(LoopbackServer):
    """An HTTP proxy on ``127.0.0.1`` (a free port by default) in front of ``upstream``
    (``http://127.0.0.1:PORT``), applying its :class:`ProxyFault` rules; see the module.

    A context manager: ``with FaultProxy(server.url) as proxy:`` starts and stops it. Point
    a client at :attr:`url` (``STORAGE_EMULATOR_HOST`` in :attr:`env`).
    """

    def __init__(self, upstream: str, *, port: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or parsed.hostname not in ("127.0.0.1", "localhost") or parsed.port is None:
            raise ValueError(f"upstream={upstream!r} must be http://127.0.0.1:PORT (the proxy stays on loopback)")
        self.upstream = (parsed.hostname, parsed.port)
        self._lock = threading.Lock()
        self._faults: list[ProxyFault] = []
        self._released = threading.Condition(self._lock)
        self._generation = 0  # bumped by release(): a stall held before it ends
        self._held = 0
        self.log: list[Request] = []
        self._server = _Server(("127.0.0.1", port), self._handler())
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    # -- lifetime --------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        # A short poll: stop() waits for the serving loop's next look (half a second by default).
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="elastic-dew-faults", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release every stall, stop accepting and close the listening socket."""
        self.clear()
        self.release()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- rules ----------------------------------------------------------------------------
    def add(self, *faults: ProxyFault) -> ProxyFault:
        """Add rules (checked in the order added; the first that fires acts); the last one."""
        with self._lock:
            self._faults.extend(faults)
        return faults[-1]

    def remove(self, fault: ProxyFault) -> None:
        """Remove one rule (requests it holds stay held until :meth:`release`)."""
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def clear(self) -> None:
        """Remove every rule (held requests stay held until :meth:`release`)."""
        with self._lock:
            self._faults.clear()

    def release(self) -> None:
        """Forward every request a stall holds now."""
        with self._lock:
            self._generation += 1
            self._released.notify_all()

    @property
    def held(self) -> int:
        """Requests a stall holds now."""
        with self._lock:
            return self._held

    def requests(self, action: str | None = None, method: str | None = None) -> list[Request]:
        """The requests seen, of ``action`` and ``method`` where given."""
        with self._lock:
            return [r for r in self.log if (action is None or r.action == action)
                    and (method is None or r.method == method.upper())]

    def wait_for(self, action: str, count: int = 1, timeout: float = 60.0) -> bool:
        """Wait until ``count`` requests met ``action``; whether they did within ``timeout``."""
        return poll(lambda: len(self.requests(action)) >= count, timeout, interval=0.02)

    def _decide(self, method: str, path: str) -> ProxyFault | None:
        with self._lock:
            for fault in self._faults:
                if fault.fires_on(method, path):
                    return fault
        return None

    def _record(self, method: str, path: str, url: str, action: str) -> None:
        with self._lock:
            self.log.append(Request(method, path, url, action))

    def _hold(self, seconds: float | None) -> None:
        with self._lock:
            self._held += 1
            generation = self._generation
            deadline = None if seconds is None else time.monotonic() + seconds
            try:
                while self._generation == generation:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._released.wait(left)
            finally:
                self._held -= 1

    # -- the HTTP side ----------------------------------------------------------------------
    def _rewrite(self, data: bytes) -> bytes:
        return data.replace(f"127.0.0.1:{self.upstream[1]}".encode(), f"127.0.0.1:{self.port}".encode()).replace(
            f"localhost:{self.upstream[1]}".encode(), f"127.0.0.1:{self.port}".encode()
        )

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            upstream_connection: http.client.HTTPConnection | None = None

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
                logger.debug("fault proxy: " + format, *args)

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    chunks: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _answer(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                self.wfile.flush()

            def _reset(self) -> None:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def finish(self) -> None:
                with contextlib.suppress(OSError):  # the connection was reset on purpose, or the client went away
                    super().finish()

            def _forward(self, body: bytes) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Host"] = f"127.0.0.1:{proxy.upstream[1]}"
                for attempt in (0, 1):  # a kept-alive upstream connection the server closed
                    if self.upstream_connection is None:
                        self.upstream_connection = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                    try:
                        self.upstream_connection.request(self.command, self.path, body=body, headers=headers)
                        reply = self.upstream_connection.getresponse()
                        data = reply.read()
                        break
                    except (http.client.HTTPException, OSError):
                        self.upstream_connection.close()
                        self.upstream_connection = None
                        if attempt:
                            raise
                kept = [(k, proxy._rewrite(v.encode("latin-1")).decode("latin-1"))
                        for k, v in reply.getheaders() if k.lower() not in _HOP]
                self._answer(reply.status, kept, proxy._rewrite(data))

            def _handle(self) -> None:
                body = self._body()
                path = object_path(self.command, self.path, self.headers, body)
                fault = proxy._decide(self.command, path)
                action = "forwarded" if fault is None else fault.action
                proxy._record(self.command, path, self.path, action)
                if fault is not None and fault.action == "reset":
                    self._reset()
                    return
                if fault is not None and fault.action == "error":
                    reason = _REASONS.get(fault.status, "error")
                    message = f"injected by the fault proxy: {fault.status} on {self.command} {path}"
                    error = {"error": {"code": fault.status, "message": message,
                                       "errors": [{"reason": reason, "message": message}]}}
                    self._answer(fault.status, [("Content-Type", "application/json")], json.dumps(error).encode())
                    return
                if fault is not None:  # stall
                    proxy._hold(fault.seconds)
                self._forward(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        return Handler
