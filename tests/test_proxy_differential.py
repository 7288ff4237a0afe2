"""Both boundaries agree on every program: the corpus of correct programs and the mistakes gallery.

Each program of ``tests/programs/corpus/`` (under each schedule its docstring's
``Schedules:`` line names; ``lose:1@6,restore:1@12`` when it names none) and each program of
the mistakes gallery (``tests/programs/guide_loop.py`` with each ``--mistake``) runs through
``elastic-dew simulate`` twice, as a user runs it: in-process, and through the local Pathways
backend (``--boundary proxy``, jaxlib's own IFRT proxy client in the program's process). Both
must fire the same faults at the same steps (a fault keyed to time: the same faults), start
the same ``elastic_retry`` attempts on the same slices in each process, and end each process
the same way. A program that does not call ``pathwaysutils.initialize()`` itself is started
by ``tests/programs/as_pathways_program.py``, as a Pathways program starts (through the
proxy it could reach no device otherwise; in-process it changes nothing).

Both must also report the same costs (where each recovery resumed from, the steps redone,
after how many steps a returned slice was taken up, the steps trained short of one; the
totals' steps) and the same problems among the rules both boundaries see: the proxy boundary
runs no code in the program's process and writes the records it can tell from what crosses
it (:mod:`elastic_dew.proxy.records`), so the rules of :data:`elastic_dew.proxy.records.UNSEEN`
are not compared (``docs/pathways-boundary.md``, "What each boundary can see"), nor what only
the program knows (the step number it gives a save) nor how long anything took.

Each run of both boundaries costs about 15 s on two cores, so the suite compares each corpus
program under its first schedule (but those of :data:`COMPARED_ELSEWHERE`) and every mistake
(the in-process corpus test runs every schedule); ``ELASTIC_DEW_DIFFERENTIAL=all`` compares
every schedule of every program (about ten minutes). CI's other environments (the
``libraries`` tier, where jaxlib's proxy client differs by version) compare the programs of
:data:`ACROSS_VERSIONS`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from boundarylib import assert_boundaries_agree
from conftest import REPO

PROGRAMS = REPO / "tests" / "programs"
CORPUS = PROGRAMS / "corpus"
DEFAULT_SCHEDULE = "lose:1@6,restore:1@12"
#: The gallery's mistakes that a run under a loss and a return shows (a preemption's needs a
#: checkpoint directory and a restart; ``case1`` is three of these at once).
MISTAKES = ("restored_nothing", "recreated_per_attempt", "held_across_attempts", "mesh_on_lost_slice",
            "data_not_rewound", "returned_slice_ignored")
#: The mistakes whose attempts the backend cannot see, and why: an attempt is seen there by
#: the slices its steps span, and these attempts run no step on the Manager's active slices.
ATTEMPTS_UNSEEN = {
    "mesh_on_lost_slice": "its mesh spans every slice, the lost one too: each retry dies before its first step",
}

#: The programs on elastic_dew's own loop (``ElasticRun``), whose steps in-process are its
#: announcements and through the proxy its dispatches: after an in-place scale-up it
#: dispatches its step in flight again on the new mesh, one more step through the proxy (the
#: totals' steps are not compared; every cost is).
OWN_LOOP = ("own_loop_page",)

#: Every schedule of every corpus program, not only each program's first.
EVERY_SCHEDULE = os.environ.get("ELASTIC_DEW_DIFFERENTIAL") == "all"
#: The programs compared in every CI environment: real processes through each jaxlib's proxy
#: client and pathwaysutils (a loop carrying two scalars, and the guide's own example).
ACROSS_VERSIONS = ("boundary_two_scalars", "guide_example")


def schedules(path: Path) -> list[str]:
    """The schedules a program's docstring names (``Schedules: A; B``), or the default."""
    for line in path.read_text().splitlines():
        if line.startswith("Schedules:"):
            return [s.strip() for s in line.removeprefix("Schedules:").split(";") if s.strip()]
    return [DEFAULT_SCHEDULE]


#: The corpus programs compared here only under ``ELASTIC_DEW_DIFFERENTIAL=all``, and why:
#: pathwaysutils' own workload is compared through both boundaries by
#: ``tests/test_proxy.py`` (``pathways_initialized.py``: the same workload started the same
#: way, under a loss and a return, checked by the same
#: :func:`boundarylib.assert_boundaries_agree`).
COMPARED_ELSEWHERE = ("pathwaysutils_simple_model",)


def _cases() -> list:
    cases = [pytest.param([path], schedule, id=f"{path.stem}-{schedule}",
                          marks=[pytest.mark.libraries] if path.stem in ACROSS_VERSIONS else [])
             for path in sorted(CORPUS.glob("*.py")) if EVERY_SCHEDULE or path.stem not in COMPARED_ELSEWHERE
             for schedule in (schedules(path) if EVERY_SCHEDULE else schedules(path)[:1])]
    cases += [pytest.param([PROGRAMS / "guide_loop.py", "--mistake", mistake], DEFAULT_SCHEDULE,
                           id=f"guide_loop-{mistake}") for mistake in MISTAKES]
    # a correct program fires every fault; a mistake may end the program first, through both
    return cases


def _simulate_both(run_dir: Path, command: list, schedule: str) -> tuple[dict, dict]:
    """``elastic-dew simulate`` of ``command`` in-process and through the proxy, side by side,
    each in a working directory of its own: the two verdicts (JSON)."""
    restarts = ["--restarts", "1"] if any(a in schedule for a in ("preempt", "kill")) else []
    runs, logs = {}, []
    for boundary in ("in-process", "proxy"):
        logs.append(open(run_dir / f"{boundary}.err", "w"))
        cwd = run_dir / f"{boundary}.cwd"  # what a program writes to its working directory stays its own
        cwd.mkdir()
        runs[boundary] = subprocess.Popen(
            [sys.executable, "-m", "elastic_dew", "simulate", "--boundary", boundary, "--slices", "4",
             "--devices-per-slice", "2", "--schedule", schedule, *restarts,
             "--report", str(run_dir / f"{boundary}.json"), "--run-dir", str(run_dir / boundary), "--",
             sys.executable, *map(str, command)],
            stdout=subprocess.DEVNULL, stderr=logs[-1], text=True, cwd=cwd)
    verdicts = []
    for boundary, process in runs.items():
        process.wait(timeout=300)
        logs.pop(0).close()
        report = run_dir / f"{boundary}.json"
        assert report.exists(), (run_dir / f"{boundary}.err").read_text()[-3000:]
        verdicts.append(json.loads(report.read_text()))
    return verdicts[0], verdicts[1]


@pytest.mark.slow
@pytest.mark.parametrize(("program", "schedule"), _cases())
def test_both_boundaries_fire_the_same_faults_at_the_same_steps_start_the_same_attempts_and_cost_the_same(
        tmp_path, program, schedule):
    source = program[0].read_text()
    command = program if "pathwaysutils.initialize()" in source else [PROGRAMS / "as_pathways_program.py", *program]
    inside, proxy = _simulate_both(tmp_path, command, schedule)
    assert_boundaries_agree(proxy, inside, correct=program[0].parent == CORPUS,
                            attempts=program[-1] not in ATTEMPTS_UNSEEN, steps=program[0].stem not in OWN_LOOP)


def test_every_corpus_program_names_its_schedules_or_takes_the_default():
    """The schedules line reads as the differential test reads it."""
    assert schedules(CORPUS / "boundary_pause_resume.py") == ["lose:2@9,restore:2@+3"]
    assert schedules(CORPUS / "boundary_two_scalars.py") == ["lose:1@6,restore:1@12", "hang:1@5,lose:1@+2",
                                                             "suspend:1@5,wake:1@+1", "preempt@6"]
    assert schedules(PROGRAMS / "one_slice.py") == [DEFAULT_SCHEDULE]
