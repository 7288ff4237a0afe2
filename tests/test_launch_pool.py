"""Real JAX pools of CPU processes on 127.0.0.1, started through ``elastic-dew launch``.

Each rank is tests/pool_worker.py: it joins the pool with ``prepare_process``, prints the
run timestamp, and steps until its ``PreemptionNotice`` is reached. SIGTERM is sent for
real, to the launcher or to one rank.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.libraries]  # JAX's distributed service across real processes

WORKER = Path(__file__).with_name("pool_worker.py")
HANG_GUARD = 120  # seconds; a guard against a hung pool, not a speed assertion


class Pool:
    """An ``elastic-dew launch`` process whose merged output is collected line by line."""

    def __init__(self, n: int, *extra: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "DEW_"))}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "elastic_dew", "launch", "-n", str(n), "--grace", "60",
             *extra, "--", sys.executable, str(WORKER)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, count: int) -> list[re.Match]:
        deadline = time.monotonic() + HANG_GUARD
        while time.monotonic() < deadline:
            found = [m for line in list(self.lines) if (m := re.search(pattern, line))]
            if len(found) >= count:
                return found
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        self.proc.kill()
        pytest.fail(f"never saw {count} x {pattern!r}; output:\n" + "\n".join(self.lines))

    def finish(self) -> int:
        try:
            code = self.proc.wait(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail("the pool did not stop; output:\n" + "\n".join(self.lines))
        self._reader.join(timeout=10)
        return code

    def per_rank(self, pattern: str) -> dict[int, str]:
        out = {}
        for line in self.lines:
            if m := re.match(rf"\[rank (\d+)\] {pattern}", line):
                out[int(m.group(1))] = m.group(1 + 1)
        return out


def _stops_together(pool: Pool, n: int) -> None:
    code = pool.finish()
    output = "\n".join(pool.lines)
    stopped = pool.per_rank(r"stopped at (\d+) interrupts False")
    assert sorted(stopped) == list(range(n)), output
    assert len(set(stopped.values())) == 1, f"ranks stopped at different steps: {stopped}"
    assert code == 143, output
    assert "Traceback" not in output


def test_sigterm_to_the_launcher_stops_a_pool_of_two_at_one_step_and_exits_143():
    pool = Pool(2)
    pool.wait_for(r"\[rank \d\] running", 2)
    pool.proc.send_signal(signal.SIGTERM)
    _stops_together(pool, 2)
    stamps = pool.per_rank(r"timestamp (\S+)")
    assert sorted(stamps) == [0, 1]
    assert len(set(stamps.values())) == 1, f"run_timestamp differs across ranks: {stamps}"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d", stamps[0])


def test_sigterm_to_one_rank_stops_a_pool_of_four_at_one_step_and_exits_143():
    pool = Pool(4)
    pool.wait_for(r"\[rank \d\] running", 4)
    pids = {int(r): int(p) for r, p in re.findall(r"\[rank (\d)\] pid (\d+)", "\n".join(pool.lines))}
    os.kill(pids[2], signal.SIGTERM)
    _stops_together(pool, 4)
    stamps = pool.per_rank(r"timestamp (\S+)")
    assert sorted(stamps) == [0, 1, 2, 3]
    assert len(set(stamps.values())) == 1, f"run_timestamp differs across ranks: {stamps}"


def test_a_pool_whose_preemption_service_is_off_never_reports_a_notice_and_sigterm_ends_it():
    pool = Pool(2, "--env", "JAX_ENABLE_PREEMPTION_SERVICE=false")
    pool.wait_for(r"\[rank \d\] running", 2)
    pids = {int(r): int(p) for r, p in re.findall(r"\[rank (\d)\] pid (\d+)", "\n".join(pool.lines))}
    os.kill(pids[1], signal.SIGTERM)
    code = pool.finish()
    output = "\n".join(pool.lines)
    assert "stopped at" not in output
    assert "preemption notice reached" not in output
    assert code == 143, output  # rank 1 killed by SIGTERM: 128 + 15
