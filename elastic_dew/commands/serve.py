"""The serve loop of the commands that run a local server (``gcs-server``, ``proxy``)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["serve"]


def serve(prog: str, server: Any, announce: Callable[[], None]) -> int:
    """Start ``server``, ``announce`` it (what to export in the shell that uses it), then serve
    until Ctrl-C or SIGTERM, and stop it.

    Args:
        prog: the command, for its error line (``elastic-dew proxy``).
        server: what serves: its ``start()`` raises ``RuntimeError`` when it cannot start.
        announce: called once it has started.

    Returns:
        0, or 1 when the server did not start (its error on standard error).
    """
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        server.start()
    except RuntimeError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    try:
        announce()
        stop.wait()
    finally:
        server.stop()
    return 0
