"""docs/your-own-loop.md's example, run as the page gives it: a user's own train_step in the
elastic protocol, on simulated slices that lose one, get it back and are preempted (a real
SIGTERM), then the same command again."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO
import pytest

pytestmark = pytest.mark.slow


def test_the_own_loop_example_survives_a_loss_a_return_and_a_preemption_and_trains_on_each_example_once(tmp_path):
    page = (REPO / "docs" / "your-own-loop.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, re.S)
    program = tmp_path / "own_loop.py"
    program.write_text(code)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the program sets its own
    runs = [subprocess.run([sys.executable, str(program), "run"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240) for _ in range(2)]
    assert runs[0].returncode == 143, runs[0].stdout + runs[0].stderr
    assert runs[1].returncode == 0, runs[1].stdout + runs[1].stderr
    assert '"reason": "preempted", "step": 22' in runs[0].stdout.replace("'", '"')
    assert '"source": "checkpoint", "step": 23' in runs[1].stdout.replace("'", '"')
    assert "done at step 30" in runs[1].stdout
    last: dict[int, tuple[int, int]] = {}
    for line in (tmp_path / "run" / "steps.txt").read_text().splitlines():
        step, begin, end, _ = line.split()
        last[int(step)] = (int(begin), int(end))  # a re-done step's later line is the one that counts
    assert sorted(last) == list(range(1, 31))
    assert [last[s] for s in range(1, 31)] == [(24 * (s - 1), 24 * s) for s in range(1, 31)]
