"""Shared helpers of the fault-matrix, chaos, waits and bad-input tests.

Scenarios run through :mod:`elastic_dew.testing` (the same runner and invariant checker the
seeded chaos mode uses), so a fixed scenario here and a random one there are checked alike.
"""

from __future__ import annotations

from pathlib import Path

from elastic_dew import record, rundir
from elastic_dew import testing as chaos


def events(outcome: chaos.ScenarioOutcome) -> list[dict]:
    return record.read_events(outcome.run_dir)


def turns(run_dir: Path) -> list[tuple]:
    """The stops and resumes of a run directory's record, in order: ``("stop", reason, step)``
    and ``("resume", source, step)``; none while its record does not exist yet."""
    if not (Path(run_dir) / rundir.EVENTS_FILE).exists():
        return []
    out = []
    for e in record.read_events(run_dir):
        if e["event"] == "stop":
            out.append(("stop", e["reason"], e["step"]))
        elif e["event"] == "resume":
            out.append(("resume", e["source"], e["step"]))
    return out


def kinds(outcome: chaos.ScenarioOutcome) -> list[tuple]:
    """The stops and resumes of a scenario's run record, in order (:func:`turns`)."""
    return turns(outcome.run_dir)


def fired(outcome: chaos.ScenarioOutcome) -> list[str]:
    """The schedule tokens the simulator fired, in order."""
    return [entry.scheduled for entry in rundir.FaultLog(outcome.run_dir / rundir.FAULTS_FILE).entries()]


def assert_all_fired(outcome: chaos.ScenarioOutcome) -> None:
    """Every fault of the schedule fired (a scenario whose fault never fired proves nothing)."""
    scheduled = [str(f) for f in _schedule(outcome.scenario.schedule)]
    assert sorted(fired(outcome)) == sorted(scheduled), (fired(outcome), scheduled)


def _schedule(text: str):
    from elastic_dew.simulate import parse_schedule

    return parse_schedule(text)


def assert_invariants(outcome: chaos.ScenarioOutcome, expected_params, **kwargs) -> None:
    problems = chaos.check(outcome, expected_params, **kwargs)
    assert not problems, "\n".join(problems) + f"\nrecord: {kinds(outcome)}"


def tree_digest(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes (to prove a directory was left untouched)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def train_killed_at_commit(run_dir: str, steps: int, kill_step: int) -> None:
    """Train the chaos scenario in this process; SIGKILL it as Orbax commits ``kill_step``.

    Orbax writes a step into a temporary directory and renames it into place to commit it;
    the kill lands at that rename, once per run (a marker file in the run directory, written
    durably before the kill, stops a re-run from killing again), so the step's files are all
    written and none is committed. Meant for a fresh process (``python -c``).
    """
    import os
    import signal

    from private_names import ORBAX_RENAME

    marker = Path(run_dir) / "killed-at-commit"
    rename = ORBAX_RENAME.get()

    async def rename_or_die(src, dst):
        if str(dst).endswith(f"/{kill_step}") and not marker.exists():
            with open(marker, "w") as f:
                f.write(str(src))
                f.flush()
                os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        return await rename(src, dst)

    ORBAX_RENAME.set(rename_or_die)
    outcome = chaos.run(chaos.Scenario(steps=steps), run_dir)
    if outcome.error is not None:
        raise outcome.error
