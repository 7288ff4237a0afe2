"""The quickstart's commands, run as the page writes them, in real processes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from elastic_dew import record, rundir

pytestmark = pytest.mark.slow


def _commands() -> list[str]:
    """The "Your own runs" section's bash block, one command a line (continuations joined)."""
    page = (REPO / "docs" / "quickstart.md").read_text()
    section = page.split("## Your own runs", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_quickstarts_commands_run_as_written_and_the_same_command_resumes(tmp_path):
    commands = _commands()
    assert commands[0] == "source .venv/bin/activate"
    bin_dir = Path(sys.executable).parent  # the repository's .venv/bin, which activate puts first
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(bin_dir.parent)}
    env.pop("XLA_FLAGS", None)  # a fresh shell: the command sets its own device count
    run = tmp_path / "runs" / "my-run"
    statuses = []
    for command in commands[1:]:
        result = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=240)
        statuses.append(result.returncode)
        assert result.returncode in (0, 143), f"{command}\n{result.stdout}\n{result.stderr}"
        if len(statuses) == 1:  # the preempted process: it says what to do and leaves no summary
            assert "run the same command again to resume" in result.stderr
            assert not (run / "summary.json").exists()
            assert rundir.read_identity(run)["schedule"] == "lose:1@8,restore:1@16,preempt@24"  # its identity
    assert statuses == [143, 0, 0]  # preempted, resumed to the end, reported
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 30 and summary["processes"] == 2
    assert summary["stops"] == {"slice_lost": 1, "scale_up": 1, "preempted": 1, "done": 1}
    assert summary["faults"] == {"lose": 1, "restore": 1, "preempt": 1}  # none fired again in the rerun
    resumes = [(e["source"], e["step"]) for e in record.read_events(run) if e["event"] == "resume"]
    assert resumes[-1] == ("checkpoint", 25)  # from the preempted step's checkpoint
    assert summary["eval"]["step"] == 30 and (run / "timeline.png").exists()
