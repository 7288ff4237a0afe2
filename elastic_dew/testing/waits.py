"""Bounded waits for test support: poll a condition until it holds or its time is up.

Every wait of the test support (a server's port answering, a request reaching the fault
proxy, a late write landing) is bounded, and each is this one loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["poll"]


def poll(condition: Callable[[], object], timeout: float, *, interval: float = 0.05) -> bool:
    """Call ``condition()`` every ``interval`` seconds until it returns a true value or
    ``timeout`` seconds have passed (it is called at least once, and once more at the end).

    Args:
        condition: what to wait for; an exception it raises ends the wait (raised as is).
        timeout: the most seconds to wait.
        interval: the seconds between two calls.

    Returns:
        Whether ``condition()`` held within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(interval, left))
