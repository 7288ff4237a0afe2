"""The one restart supervisor: re-run after 143 or a kill, stop on success or another status."""

from __future__ import annotations

import sys

import pytest

from elastic_dew.supervisor import RESTART_STATUSES, supervise, supervise_in_process


def _exits(tmp_path, *statuses: int) -> list[str]:
    """A command that exits with ``statuses[n]`` on its n-th run (a counter file holds n)."""
    counter = tmp_path / "runs"
    script = (
        "import os, pathlib, signal, sys\n"
        f"p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\n"
        f"code = {list(statuses)!r}[n]\n"
        "if code == -9: os.kill(os.getpid(), signal.SIGKILL)\n"
        "sys.exit(code)\n"
    )
    return [sys.executable, "-c", script]


@pytest.mark.slow
def test_a_preempted_or_killed_process_is_run_again_until_it_succeeds(tmp_path):
    restarts = []
    statuses = supervise(
        _exits(tmp_path, 143, -9, 137, 0), max_processes=10, on_restart=lambda s, n: restarts.append((s, n))
    )
    assert statuses == [143, -9, 137, 0]
    assert restarts == [(143, 1), (-9, 2), (137, 3)]
    assert set(RESTART_STATUSES) == {143, -15, 137, -9}


@pytest.mark.slow
def test_another_status_ends_the_supervision_without_a_restart(tmp_path):
    assert supervise(_exits(tmp_path, 143, 1, 0), max_processes=10) == [143, 1]


@pytest.mark.slow
def test_the_supervision_stops_after_max_processes(tmp_path):
    assert supervise(_exits(tmp_path, 143, 143, 143, 0), max_processes=2) == [143, 143]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
@pytest.mark.slow
def test_a_bad_process_limit_is_refused_before_anything_runs(bad, tmp_path):
    with pytest.raises(ValueError, match="max_processes=.* must be a whole number >= 1"):
        supervise(_exits(tmp_path, 0), max_processes=bad)
    assert not (tmp_path / "runs").exists()


class _Stop(Exception):
    pass


def test_in_process_a_restartable_exception_calls_again_and_others_propagate():
    calls = []

    def process(number: int) -> None:
        calls.append(number)
        if number < 3:
            raise _Stop(number)

    outcomes = supervise_in_process(process, max_processes=5, restart_on=(_Stop,))
    assert calls == [1, 2, 3]
    assert [type(o) for o in outcomes] == [_Stop, _Stop, type(None)]

    def always(number: int) -> None:
        raise _Stop(number)

    assert len(supervise_in_process(always, max_processes=2, restart_on=(_Stop,))) == 2

    def broken(number: int) -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        supervise_in_process(broken, max_processes=2, restart_on=(_Stop,))
