"""Precompile a layout's first Orbax save off the training loop, in a background thread.

Orbax saves a replicated array replica-parallel: each replica transfers its own slice, cut
by a small ``jax.lax.slice_in_dim`` program per (device, shard shape, slice). Compiling
those programs can be most of a process's first save of a layout (``docs/performance.md``,
*The first checkpoint save of a process*). :class:`SavePrecompiler` runs Orbax's own slicing
(:func:`elastic_dew._compat.orbax.slice_replicas`) on a state's arrays, one leaf at
a time, and drops the slices: the same programs are compiled and cached, and nothing
reaches the host or the disk.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import jax

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.elastic.state.packing import unwrap_keys

__all__ = ["SavePrecompiler", "precompile_replica_slices"]

logger = logging.getLogger(__name__)


def precompile_replica_slices(state: Any, stop: threading.Event | None = None, handler: Any = None) -> None:
    """Compile Orbax's replica slicing of ``state``'s arrays as ``handler`` (the array handler
    the save uses; Orbax's registered one when ``None``) would slice them; return early once
    ``stop`` is set."""
    for leaf in jax.tree.leaves(unwrap_keys(state)):
        if stop is not None and stop.is_set():
            return
        if not isinstance(leaf, jax.Array) or leaf.is_deleted():
            continue
        orbax_private.slice_replicas(leaf, handler)


class SavePrecompiler:
    """One background precompile at a time, once per layout (leaf shapes, dtypes, shardings),
    for saves through the array ``handler``.

    :meth:`stop` ends the precompile where it is (one leaf's slices at most to wait for); a
    save calls it first and compiles what was not reached. A run calls it when it ends,
    however it ends: a compile still running in XLA when the interpreter exits aborts the
    process (``FATAL: exception not rethrown``).
    """

    def __init__(self, handler: Any = None) -> None:
        self.handler = handler
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._precompiled: set = set()

    def start(self, state: Any) -> None:
        """Precompile the saves of ``state``'s layout in the background, unless done already."""
        layout = tuple((leaf.shape, leaf.dtype, getattr(leaf, "sharding", None)) for leaf in jax.tree.leaves(state))
        if layout in self._precompiled:
            return
        self.stop()
        self._precompiled.add(layout)
        self._stop.clear()
        # JAX caches a compile under the calling thread's context, and pathwaysutils runs
        # each attempt under jax.default_device: the worker compiles under the same one.
        device = jax.config.jax_default_device  # type: ignore[attr-defined]  # jax.config declares its options at run time

        def work() -> None:
            try:
                with jax.default_device(device):
                    precompile_replica_slices(state, self._stop, self.handler)
            except Exception:  # noqa: BLE001 - only a precompile: the save compiles what is missing
                logger.debug("precompiling the checkpoint's replica slices failed", exc_info=True)

        self._thread = threading.Thread(target=work, name="elastic-dew-precompile-saves", daemon=True)
        self._thread.start()

    def done(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the precompile; whether none is running."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self._thread is None or not self._thread.is_alive()

    def stop(self) -> None:
        """Stop the precompile and wait for it to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
