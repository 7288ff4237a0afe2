"""Run a Python program, unmodified, on simulated slices: the child of ``elastic-dew simulate``.

``python -m elastic_dew.simulate.launcher --module MODULE [ARGS...]`` runs ``MODULE`` as
``python -m MODULE ARGS...`` would, and ``--path FILE [ARGS...]`` runs ``FILE`` (a script,
or a console script's file) as ``python FILE ARGS...`` would, each inside
:class:`~elastic_dew.simulate.SimulatedSlices` entered before the program's first line. The
program sees the ``sys.argv``, ``__main__`` and exit status it would see when started
alone (``runpy``): its ``SystemExit`` ends this process with the same status, an uncaught
exception prints its traceback and exits 1, a signal it does not handle ends the process
as it would end the program. ``jax.distributed.initialize`` is a no-op: the program is
one Pathways controller, one process.

The simulator's settings come from the environment variable :data:`ENVIRONMENT`, a JSON
object (:class:`LaunchSettings`): ``elastic-dew simulate`` writes it, with the CPU device
count already in ``XLA_FLAGS`` (it must be set before JAX starts). Each ``elastic_retry``
attempt's active slices are appended, as they start, to ``attempts`` (JSON lines, one
``{"pid", "active", "wall"}`` each, and one ``{"pid", "start", "wall"}`` as the process
starts), so the attempts of a process that is killed are known too. What the program does
with its state goes to ``watch`` (the simulator's watch, JSON lines, as it happens), which
``elastic-dew simulate`` diagnoses once the run has ended.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import runpy
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


__all__ = ["ENVIRONMENT", "LaunchSettings", "main", "run_program"]

logger = logging.getLogger(__name__)

#: The environment variable that carries :class:`LaunchSettings` to the launcher (JSON).
ENVIRONMENT = "ELASTIC_DEW_SIMULATE"


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """The simulated slices a launched program runs on, and where its records go."""

    slices: int
    devices_per_slice: int
    schedule: str = ""
    fault_log: str | None = None
    step_function: str | None = None
    attempts: str | None = None
    watch: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LaunchSettings:
        raw = json.loads(text)
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = set(raw) - names
        if unknown:
            raise ValueError(f"{ENVIRONMENT} names unknown settings {sorted(unknown)}; known: {sorted(names)}")
        return cls(**raw)


def _append(path: str | None, record: dict[str, Any]) -> None:
    from elastic_dew.rundir import fsync_append  # after JAX starts: the run directory's formats read Orbax

    if path is not None:
        fsync_append(Path(path), json.dumps(record))


def _exit_status(code: Any) -> int:
    """The exit status ``sys.exit(code)`` gives a process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1  # a message: Python prints it and exits 1


def _one_controller() -> None:
    """``jax.distributed.initialize`` joins nothing under the simulator: the program is one
    Pathways controller, a single process, and the simulator started JAX's backend before the
    program's first line (where JAX would refuse a late initialisation)."""
    from elastic_dew._compat import jax as jax_private

    def initialize(*args: Any, **kwargs: Any) -> None:
        logger.info("jax.distributed.initialize() under elastic-dew simulate: one controller process, "
                    "nothing to join")

    jax_private.DISTRIBUTED_INITIALIZE.set(initialize)


def run_program(form: str, target: str, args: Sequence[str]) -> None:
    """Run ``target`` (a module name for ``form == "module"``, a file for ``"path"``) as
    ``__main__`` with ``sys.argv`` as its own start would give it."""
    if form == "module":
        sys.argv = [target, *args]  # runpy puts the module's file in argv[0]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif form == "path":
        path = str(Path(target))
        sys.argv = [path, *args]
        sys.path[0] = str(Path(path).resolve().parent)  # as ``python FILE`` puts its directory first
        runpy.run_path(path, run_name="__main__")
    else:
        raise ValueError(f"form {form!r} is neither 'module' nor 'path'")


def main(argv: Sequence[str] | None = None) -> int:
    """``--module MODULE ARGS...`` or ``--path FILE ARGS...`` under the simulator
    :data:`ENVIRONMENT` describes; returns (or exits with) the program's exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] not in ("--module", "--path"):
        sys.stderr.write("usage: python -m elastic_dew.simulate.launcher --module MODULE|--path FILE [ARGS...]\n")
        return 2
    form, target, args = argv[0][2:], argv[1], argv[2:]
    text = os.environ.get(ENVIRONMENT)
    if not text:
        sys.stderr.write(f"elastic_dew.simulate.launcher: {ENVIRONMENT} is not set; run the program with "
                         "elastic-dew simulate -- COMMAND\n")
        return 2
    settings = LaunchSettings.from_json(text)
    from elastic_dew.simulate.simulator import SimulatedSlices  # JAX starts here, devices already set

    _one_controller()
    _append(settings.attempts, {"pid": os.getpid(), "start": True, "wall": time.time()})
    simulator = SimulatedSlices(
        settings.slices, settings.devices_per_slice, schedule=settings.schedule or None,
        fault_log=settings.fault_log, step_function=settings.step_function, watch_log=settings.watch,
        on_attempt=lambda active: _append(
            settings.attempts, {"pid": os.getpid(), "active": list(active), "wall": time.time()}),
    )
    status = 0
    with simulator:
        try:
            run_program(form, target, args)
        except SystemExit as stop:
            status = _exit_status(stop.code)
            if stop.code not in (None, 0):
                raise  # an error's faults are left to the next process of the run
    return status


if __name__ == "__main__":
    sys.exit(main())
