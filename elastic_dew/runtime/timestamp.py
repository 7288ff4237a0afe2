"""The one wall clock every process of a pool agrees on.

A default run name carries a timestamp, and the name is the checkpoint directory every
process writes into: a process that read its own clock a second later would write into a
different directory. :func:`run_timestamp` gives process 0's clock on every process.
"""

from __future__ import annotations

import time

from elastic_dew._compat import jax as jax_private

__all__ = ["run_timestamp"]

_TIMESTAMP_FORMAT = "%Y-%m-%d_%H:%M:%S"
_timestamp_calls = 0


def run_timestamp() -> str:
    """Return process 0's wall clock as ``%Y-%m-%d_%H:%M:%S``, on every process.

    A default run name carries it, and the name is the checkpoint directory every process
    writes into, so a process that read its own clock a second later would write into a
    different directory. In a pool, process 0 publishes its clock in the coordination
    service's key-value store and the others wait for it; alone, it is the local clock.
    The n-th call on each process reads the n-th published value, so every process must
    call it the same number of times.

    Returns:
        Process 0's wall clock, formatted ``%Y-%m-%d_%H:%M:%S``.
    """
    global _timestamp_calls
    client = jax_private.pool_client()
    if client is None:
        return time.strftime(_TIMESTAMP_FORMAT)
    key = f"elastic_dew/run_timestamp/{_timestamp_calls}"
    _timestamp_calls += 1
    if jax_private.pool_process_id() == 0:
        stamp = time.strftime(_TIMESTAMP_FORMAT)
        client.key_value_set(key, stamp)
        return stamp
    return client.blocking_key_value_get(key, 10 * 60 * 1000)
