"""The process's resource limits, raised as far as the system permits.

A training process opens many files (checkpoint shards, data files, sockets) and a core
dump is the one record of a crash inside XLA, so the soft open-files and core-dump limits
are raised to the hard ones. A limit is never lowered.
"""

from __future__ import annotations

import logging
import resource
from pathlib import Path

__all__: list[str] = []

logger = logging.getLogger(__name__)


def _raise_limit(which: int) -> None:
    """Raise the soft limit ``which`` to its hard limit, where the system permits."""
    soft, hard = resource.getrlimit(which)
    if soft == resource.RLIM_INFINITY or (hard != resource.RLIM_INFINITY and soft >= hard):
        return
    try:
        resource.setrlimit(which, (hard, hard))
    except (ValueError, OSError):
        if which == resource.RLIMIT_NOFILE and hard == resource.RLIM_INFINITY:
            # Linux caps open files at fs.nr_open even when the hard limit says unlimited.
            try:
                nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
                if nr_open > soft:
                    resource.setrlimit(which, (nr_open, hard))
                    return
            except (OSError, ValueError):
                pass
        logger.debug("could not raise rlimit %d from %d toward %d", which, soft, hard)


def _raise_limits() -> None:
    """Raise the soft open-files and core-dump limits to the hard ones."""
    _raise_limit(resource.RLIMIT_NOFILE)
    _raise_limit(resource.RLIMIT_CORE)
