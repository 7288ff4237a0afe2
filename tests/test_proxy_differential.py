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
program under its first schedule and every mistake (the in-process corpus test runs every
schedule); ``ELASTIC_DEW_DIFFERENTIAL=all`` compares every schedule of every program (about
ten minutes). CI's other environments (the ``libraries`` tier, where jaxlib's proxy client
differs by version) compare the programs of :data:`ACROSS_VERSIONS`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from elastic_dew.proxy.records import UNSEEN

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


def _cases() -> list:
    cases = [pytest.param([path], schedule, id=f"{path.stem}-{schedule}",
                          marks=[pytest.mark.libraries] if path.stem in ACROSS_VERSIONS else [])
             for path in sorted(CORPUS.glob("*.py"))
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


def _fired(verdict: dict) -> list:
    return [(f["scheduled"],) if "@+" in f["scheduled"] else (f["scheduled"], f["step"]) for f in verdict["fired"]]


def _costs(verdict: dict, steps: bool = True) -> list:
    """What each fault cost, as both boundaries can tell it: not the seconds, not how it was
    detected (in-process a dispatch onto a lost slice fails, through the proxy its read does),
    not the step number a program gave a save (the proxy sees the state's position only)."""
    out = []
    for c in verdict["costs"]:
        step = () if "@+" in c["fault"] else (c["step"],)
        resumed_step = c["resumed_step"] if c["resumed_from"] in ("live", "nothing") else None
        out.append((c["fault"], *step, c["process"], c["resumed_from"], resumed_step, c["redone_steps"], c["part_of"],
                    c["taken_up_after_steps"], c["steps_short"]))
    totals = verdict["totals"] or {}
    return [*out, ("totals", totals.get("steps") if steps else None, totals.get("redone_steps"),
                   totals.get("steps_short"))]


def _problems(verdict: dict) -> list:
    """The problems both boundaries evaluate, by kind and process (an attempt the proxy
    boundary does not see start shifts the attempt number). A ``Snapshotter`` made again in
    each attempt is named by its cause in-process (``recreated_per_attempt``, instead of
    ``restored_nothing``); through the proxy, which cannot see the program's objects, by what
    it did: a fresh state while the first ``Snapshotter``'s snapshot was still held."""
    named = {("restored_nothing" if p["kind"] == "recreated_per_attempt" and "Snapshotter" in p["detail"]
              else p["kind"], p["process"]) for p in verdict["problems"]}
    return sorted((kind, process) for kind, process in named if kind not in UNSEEN)


@pytest.mark.slow
@pytest.mark.parametrize(("program", "schedule"), _cases())
def test_both_boundaries_fire_the_same_faults_at_the_same_steps_start_the_same_attempts_and_cost_the_same(
        tmp_path, program, schedule):
    source = program[0].read_text()
    command = program if "pathwaysutils.initialize()" in source else [PROGRAMS / "as_pathways_program.py", *program]
    inside, proxy = _simulate_both(tmp_path, command, schedule)
    assert _fired(proxy) == _fired(inside), (proxy["fired"], inside["fired"])
    assert proxy["never_fired"] == inside["never_fired"]
    assert [p["status"] for p in proxy["processes"]] == [p["status"] for p in inside["processes"]]
    if program[0].parent == CORPUS:  # a correct program: every fault fired and met, exit 0
        assert proxy["never_fired"] == [] and proxy["unmet"] == [] and proxy["ok"]
    if program[-1] not in ATTEMPTS_UNSEEN:
        assert [p["attempts"] for p in proxy["processes"]] == [p["attempts"] for p in inside["processes"]]
    steps = program[0].stem not in OWN_LOOP
    assert _costs(proxy, steps) == _costs(inside, steps), (proxy["costs"], inside["costs"])
    assert _problems(proxy) == _problems(inside), (proxy["problems"], inside["problems"])
    assert {u["kind"] for u in proxy["unseen"]} == set(UNSEEN) and inside["unseen"] == []


def test_every_corpus_program_names_its_schedules_or_takes_the_default():
    """The schedules line reads as the differential test reads it."""
    assert schedules(CORPUS / "boundary_pause_resume.py") == ["lose:2@9,restore:2@+3"]
    assert schedules(CORPUS / "boundary_two_scalars.py") == ["lose:1@6,restore:1@12", "hang:1@5,lose:1@+2",
                                                             "suspend:1@5,wake:1@+1", "preempt@6"]
    assert schedules(PROGRAMS / "one_slice.py") == [DEFAULT_SCHEDULE]
