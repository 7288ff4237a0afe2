"""A SIGKILL while a checkpoint is being committed: the next run resumes from the previous one.

Real processes (the behaviour is about a process dying): the first trains the chaos
scenario's model and is SIGKILLed by a real signal at the instant Orbax renames step 8's
fully written temporary directory into place; the same command run again must resume from
step 4's committed checkpoint, leave it untouched, and end exactly as the failure-free run
(bitwise: every step ran on all four simulated slices).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from elastic_dew import record
from elastic_dew import testing as chaos

from conftest import REPO
from faultlib import assert_invariants
import pytest

pytestmark = pytest.mark.slow


def _command(run_dir) -> list[str]:
    script = (
        "import sys; sys.path.insert(0, 'tests'); import conftest, faultlib; "
        f"faultlib.train_killed_at_commit({str(run_dir)!r}, 12, 8)"
    )
    return [sys.executable, "-c", script]


def test_a_sigkill_during_a_checkpoint_commit_resumes_from_the_previous_committed_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    first = subprocess.run(_command(run_dir), cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert first.returncode == -signal.SIGKILL, first.stderr[-4000:]
    checkpoints = run_dir / "checkpoints"
    committed = chaos.committed_checkpoints(checkpoints)
    assert sorted(committed) == [4]
    assert any(p.name.startswith("8.orbax-checkpoint-tmp") for p in checkpoints.iterdir()), list(checkpoints.iterdir())

    second = subprocess.run(_command(run_dir), cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-4000:]

    events = record.read_events(run_dir)
    resumes = [e for e in events if e["event"] == "resume"]
    assert [(e["source"], e["step"]) for e in resumes] == [("fresh", 1), ("checkpoint", 5)]
    outcome = chaos.ScenarioOutcome(chaos.Scenario(steps=12), run_dir, processes=2, checkpoints_seen=committed)
    assert_invariants(outcome, chaos.reference(12, tmp_path))
    after = chaos.committed_checkpoints(checkpoints)
    assert after[4] == committed[4] and 8 in after and 12 in after
    assert not any("orbax-checkpoint-tmp" in p.name for p in checkpoints.iterdir())
