"""The quickstart's commands, run as the page writes them, in real processes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import REPO
import pytest

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
    statuses = []
    for command in commands[1:]:
        result = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=240)
        statuses.append(result.returncode)
        assert result.returncode in (0, 143), f"{command}\n{result.stdout}\n{result.stderr}"
    assert statuses == [143, 0, 0]  # preempted, resumed to the end, reported
    run = tmp_path / "runs" / "my-run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 30 and summary["processes"] == 2
    assert summary["stops"] == {"slice_lost": 1, "scale_up": 1, "preempted": 1, "done": 1}
    assert summary["eval"]["step"] == 30 and (run / "timeline.png").exists()
