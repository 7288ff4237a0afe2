"""Chaos mode (:mod:`elastic_dew.testing`, the ``chaos`` command): seeded random schedules keep
every invariant, and a failure names its replay command.

CI runs :data:`SEEDS` seeds in this process (each a 10-14 step run on 4 simulated slices of
2 CPU devices with 1-5 random faults: slice losses and returns, preemptions as real SIGTERMs,
at random steps and phases). A failing seed's assertion message holds the seed and the one
command that replays it. More seeds: ``python -m elastic_dew.chaos --seeds 0:200``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from elastic_dew import testing as chaos
from elastic_dew.commands import chaos as chaos_command

from conftest import REPO
from faultlib import assert_all_fired, assert_invariants, events, kinds

#: Seeds CI runs (about 5 s each on two cores): the first few; 21 and 26, which found a
#: slice lost while a finished run's state was restored crashing the caller (fixed); 1012, a
#: slice lost as the first snapshot's save began, so no snapshot landed and starting over
#: is the loop's right answer, not a restored_nothing; 1882, a slice back and lost again at
#: the same step, which the Manager still named available: not a returned slice ignored;
#: 2830, a process preempted during its first compile, before it resumed: the next process
#: is the one the next preemption's resume check pairs with.
SEEDS = (0, 1, 2, 3, 21, 26, 1012, 1882, 2830)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("chaos")


def test_the_generator_draws_the_dispatch_phase():
    assert any("/dispatch" in chaos.draw(seed).schedule for seed in range(200))


def test_a_slice_lost_at_a_dispatch_resumes_with_exactly_once_data(tmp_path):
    """``lose:2@10/dispatch``: step 10's dispatch itself fails (the simulator refuses a
    compiled program whose input is on the lost slice, as Pathways fails work sent to a
    slice it knows is down); the run resumes on 3 slices and every example is used once."""
    expected = chaos.reference(12, tmp_path / "reference")
    outcome = chaos.run(chaos.Scenario(schedule="lose:2@10/dispatch"), tmp_path / "run")
    assert_all_fired(outcome)
    assert_invariants(outcome, expected)
    turns = kinds(outcome)
    # Step 10 is dispatched before step 9's result is read (steps run one ahead), so the
    # loss comes after step 8, with step 9 in flight and dropped.
    assert [t for t in turns if t[1] == "slice_lost"] == [("stop", "slice_lost", 8)]
    resumed = [t for t in turns if t[0] == "resume"][1:]
    assert resumed and resumed[0][2] <= 9, turns
    assert turns[-1] == ("stop", "done", 12)
    assert [e["slices"] for e in events(outcome) if e["event"] == "step"][-1] == chaos.TOTAL_SLICES - 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.slow
def test_a_random_schedule_keeps_every_invariant(seed, workdir):
    scenario, problems = chaos.run_seed(seed, workdir)
    assert not problems, (
        f"chaos seed {seed} ({scenario.schedule}) broke:\n  "
        + "\n  ".join(problems)
        + f"\nreplay it with: {chaos.replay_command(seed)}"
    )


def test_a_seed_always_draws_the_same_schedule_and_seeds_differ():
    assert chaos.draw(11) == chaos.draw(11)
    assert len({chaos.draw(seed).schedule for seed in range(20)}) == 20


def test_every_drawn_schedule_parses_and_keeps_one_slice_that_is_never_lost():
    from elastic_dew.simulate import parse_schedule

    for seed in range(200):
        faults = list(parse_schedule(chaos.draw(seed).schedule))
        assert 1 <= len(faults) <= 10
        lost = {f.slice for f in faults if f.action == "lose"}
        assert len(lost) < chaos.TOTAL_SLICES, (seed, chaos.draw(seed).schedule)
        assert sum(f.action == "preempt" for f in faults) <= 2


def test_a_failing_seed_prints_the_seed_and_the_one_replay_command(monkeypatch, capsys, tmp_path):
    """The reporting path, with the run replaced by a fake failure (only the output is under test)."""
    monkeypatch.setattr(chaos_command, "run_seed", lambda seed, workdir: (chaos.draw(seed), ["committed checkpoint 4 was deleted"]))
    assert chaos_command.main(["--seed", "5", "--workdir", str(tmp_path / "w")]) == 1
    out = capsys.readouterr().out
    assert "seed 5 FAILED" in out and "committed checkpoint 4 was deleted" in out
    assert "replay: python -m elastic_dew.chaos --seed 5" in out


@pytest.mark.slow
def test_the_replay_command_runs_a_seed_from_the_shell(tmp_path):
    """``python -m elastic_dew.chaos --seed N`` in a fresh process sets up its own CPU devices."""
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew.chaos", "--seed", "2", "--workdir", str(tmp_path / "w")],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert f"seed 2 ok: {chaos.draw(2).schedule}" in proc.stdout
    assert "1 of 1 seeds kept every invariant" in proc.stdout


def test_bad_chaos_arguments_are_refused(capsys, tmp_path):
    for argv, message in (
        (["--seeds", "5:2"], "--seeds '5:2' must be A:B with whole numbers A < B"),
        (["--seed", "-1"], "--seed -1 must be >= 0"),
        ([], "one of the arguments --seed --seeds is required"),
    ):
        with pytest.raises(SystemExit) as exited:
            chaos_command.main(argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(SystemExit):
        chaos_command.main(["--seed", "1", "--workdir", str(tmp_path / "used")])
    assert "is not empty; give a new or empty directory" in capsys.readouterr().err
