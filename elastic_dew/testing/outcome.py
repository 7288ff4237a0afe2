"""What a chaos scenario's run left behind: its :class:`ScenarioOutcome` and its committed checkpoints.

The runner (:mod:`~elastic_dew.testing.runner`) fills an outcome as the run goes; the
invariants (:mod:`~elastic_dew.testing.invariants`) read one. Both import this module, never
each other's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from elastic_dew import rundir
from elastic_dew.elastic.state import orbax_step
from elastic_dew.testing.scenarios import Scenario

__all__ = ["ScenarioOutcome", "committed_checkpoints"]


@dataclasses.dataclass
class ScenarioOutcome:
    """What a scenario's run left behind.

    Args:
        scenario: the scenario that ran.
        run_dir: its run directory.
        processes: how many processes it took (one more after each preemption).
        preempted_at: the step of each preemption.
        error: the error that ended the run, ``None`` when it finished.
        checkpoints_seen: each committed checkpoint's step and hash, as first seen.
        problems: what went wrong while it ran (a committed checkpoint changed or vanished).
    """

    scenario: Scenario
    run_dir: Path
    processes: int = 0
    preempted_at: list[int] = dataclasses.field(default_factory=list)
    error: BaseException | None = None
    checkpoints_seen: dict[int, str] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / rundir.CHECKPOINTS_DIR

    @property
    def fault_log(self) -> rundir.FaultLog:
        return rundir.FaultLog(self.run_dir / rundir.FAULTS_FILE)


def _hash_dir(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def committed_checkpoints(directory: str | os.PathLike[str]) -> dict[int, str]:
    """``{step: sha256 of every file}`` of the committed checkpoints in ``directory``
    (committed by :func:`elastic_dew.elastic.state.orbax_step.committed`)."""
    directory = Path(directory)
    if not directory.is_dir():
        return {}
    found = {}
    for step in orbax_step.committed_checkpoint_steps(directory):
        try:
            found[step] = _hash_dir(directory / str(step))
        except OSError:  # vanished while being read: the next look reports it
            continue
    return found
