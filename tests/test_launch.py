"""``elastic-dew launch`` on plain Python ranks (no JAX): environment, prefixes, stopping."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import pytest

pytestmark = pytest.mark.slow

HANG_GUARD = 60  # seconds; a guard against a hung launcher, not a speed assertion


def _launch(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "elastic_dew", "launch", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )


def test_each_rank_gets_the_coordinator_its_rank_and_the_count_and_its_lines_are_prefixed():
    code = (
        "import os, sys;"
        "print('env', os.environ['JAX_COORDINATOR_ADDRESS'], os.environ['DEW_PROCESS_COUNT'],"
        " os.environ['DEW_PROCESS_ID'], os.environ['COLOUR']);"
        "print('to stderr', file=sys.stderr)"
    )
    proc = _launch("-n", "3", "--env", "COLOUR=blue", "--", sys.executable, "-c", code)
    out, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 0, err
    envs = re.findall(r"^\[rank (\d)\] env (127\.0\.0\.1:\d+) (\d) (\d) (\w+)$", out, re.M)
    assert sorted(e[0] for e in envs) == ["0", "1", "2"]
    assert {e[1] for e in envs} == {envs[0][1]}, "every rank must see one coordinator"
    assert all(e[0] == e[3] and e[2] == "3" and e[4] == "blue" for e in envs)
    assert sorted(re.findall(r"^\[rank (\d)\] to stderr$", err, re.M)) == ["0", "1", "2"]


def test_the_first_rank_that_fails_stops_the_others_and_its_status_is_the_pools():
    code = (
        "import os, sys, time;"
        "r = int(os.environ['DEW_PROCESS_ID']);"
        "sys.exit(5) if r == 1 else time.sleep(HANG)".replace("HANG", str(HANG_GUARD * 2))
    )
    proc = _launch("-n", "3", "--", sys.executable, "-c", code)
    out, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 5, err


def test_sigterm_is_forwarded_and_a_rank_that_ignores_it_is_killed_after_the_grace_period():
    code = (
        "import signal, time;"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('ready', flush=True);"
        f"time.sleep({HANG_GUARD * 2})"
    )
    proc = _launch("-n", "2", "--grace", "0.5", "--", sys.executable, "-c", code)
    assert proc.stdout.readline().endswith("ready\n")
    assert proc.stdout.readline().endswith("ready\n")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "SIGKILL" in err


def test_a_sigterm_that_ends_every_rank_makes_the_pool_exit_143():
    code = f"import time; print('ready', flush=True); time.sleep({HANG_GUARD * 2})"
    proc = _launch("-n", "2", "--", sys.executable, "-c", code)
    proc.stdout.readline(), proc.stdout.readline()
    os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 143


def test_bad_arguments_are_refused_with_a_message_naming_them():
    for args, needle in (
        (["-n", "2", "--env", "NOEQUALS", "--", "true"], "KEY=VALUE"),
        (["-n", "0", "--", "true"], "--nprocs 0 must be >= 1"),
        (["-n", "2", "--grace", "soon", "--", "true"], "--grace"),
        (["-n", "2"], "after --"),
    ):
        proc = _launch(*args)
        out, err = proc.communicate(timeout=HANG_GUARD)
        assert proc.returncode != 0, args
        assert needle in err, (args, err)


def test_the_launcher_does_not_import_jax():
    probe = (
        "import sys; from elastic_dew import cli; import elastic_dew.launch;"
        "assert 'jax' not in sys.modules, 'jax imported'; print('clean')"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=HANG_GUARD)
    assert out.stdout.strip() == "clean", out.stderr
