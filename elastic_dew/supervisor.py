"""Run a program again after a preemption or a kill, the way a JobSet restarts its pod.

A process that ends with exit status 143 or -15 (preempted: it honoured SIGTERM, or SIGTERM
ended it), 137 or -9 (it was SIGKILLed) is started again with the same command, up to a number of processes; any
other status ends the supervision. :func:`supervise` does it for a subprocess and returns
every process's status; :func:`supervise_in_process` does it for a function run in this
process, where a preemption is an exception (``elastic_dew.runtime.Preempted``).

The demo, the chaos harness and the goodput benchmark use these, so "run again after 143"
means the same everywhere.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RESTART_STATUSES", "supervise", "supervise_in_process"]

logger = logging.getLogger(__name__)

#: Exit statuses after which a process is started again: 143 and -15 (preempted: SIGTERM
#: honoured, or SIGTERM's default action, as a shell and as ``subprocess`` report it; a
#: program that installs no handler dies of it), 137 and -9 (SIGKILL, likewise).
RESTART_STATUSES: tuple[int, ...] = (143, -15, 137, -9)


def _check_max(max_processes: int) -> None:
    if not isinstance(max_processes, int) or isinstance(max_processes, bool) or max_processes < 1:
        raise ValueError(f"max_processes={max_processes!r} must be a whole number >= 1")


def supervise(
    command: Sequence[str],
    *,
    max_processes: int,
    restart_statuses: Sequence[int] = RESTART_STATUSES,
    on_restart: Callable[[int, int], None] | None = None,
    **run_kwargs: Any,
) -> list[int]:
    """Run ``command`` until it exits 0, with another status, or ``max_processes`` ran.

    ``on_restart(status, restarts)`` is called before each restart (``restarts`` counts
    from 1). ``run_kwargs`` go to :func:`subprocess.run` (``cwd``, ``env``, ``stderr``,
    ``timeout``...). Returns each process's exit status, in order: the last one says how
    the supervision ended.
    """
    _check_max(max_processes)
    statuses: list[int] = []
    while True:
        status = subprocess.run(list(command), check=False, **run_kwargs).returncode
        statuses.append(status)
        if status == 0 or status not in restart_statuses or len(statuses) >= max_processes:
            return statuses
        logger.info("process exited with %d; starting it again (restart %d)", status, len(statuses))
        if on_restart is not None:
            on_restart(status, len(statuses))


def supervise_in_process(
    process: Callable[[int], None],
    *,
    max_processes: int,
    restart_on: tuple[type[BaseException], ...],
) -> list[BaseException | None]:
    """Call ``process(number)`` (1, 2, ...) again after it raises one of ``restart_on``.

    It stops when a call returns or ``max_processes`` calls ran; any other exception
    propagates. Returns each call's outcome in order: the exception it was restarted after,
    or ``None`` for the call that returned.
    """
    _check_max(max_processes)
    outcomes: list[BaseException | None] = []
    while len(outcomes) < max_processes:
        try:
            process(len(outcomes) + 1)
        except restart_on as stop:
            outcomes.append(stop)
            logger.info("process %d stopped (%s); starting it again", len(outcomes), type(stop).__name__)
            continue
        outcomes.append(None)
        break
    return outcomes
