"""What each fault cost a program under the simulator, and the mistakes it made, each named with its fix.

:func:`diagnose` reads two things only: the faults that fired (the fault log's records,
each ``scheduled``, ``action``, ``slice``, ``phase``, ``step``, ``pid``, ``wall``) and what
the program's processes did (:class:`elastic_dew.simulate.watch.Watch`'s records, in the
order they happened). It never reads the program's source, and it imports no JAX, so
``elastic-dew simulate`` diagnoses after the program's processes have ended, and any
boundary that records the same observations gets the same diagnosis.

**Costs.** One :class:`Cost` per fired fault. For a fault that stops work (``lose``,
``hang``, ``suspend``, ``error``, ``preempt``, ``kill``): how the program learnt of it
(``detected``: at a ``read`` or a ``dispatch`` of work on the slice, by the ``clock`` that
declared a hung slice dead, by the program's own ``deadline`` on a hung slice's read, by the
``signal`` itself) and how long after it fired; where the
attempt or process after it resumed (``resumed_from``: ``snapshot``, ``checkpoint``,
``live`` for a state carried over, ``nothing`` for a fresh one; ``None`` when nothing
resumed), the program's step number of what it resumed from (``resumed_step``), the steps
it trained again (``redone_steps``: the position the stopped work had reached less the
position it resumed at) and the seconds from the fault to the first step it dispatched after resuming
(``recovery_seconds``). Faults that stop the same work before it resumes (a hang and the
loss that declares it dead) share that recovery: the first carries it, the others name it
(``part_of``). For a returned slice (``restore``, ``wake``): the steps and seconds after
which the program's attempts included it (``taken_up_after_steps``, ``None`` for never, with
``steps_short``: the steps trained without it). :class:`Totals` adds them up.

**Problems.** Each kind in :data:`PROBLEMS` is a defect: a mistake that costs hours on a
cluster, with the rule that finds it (one function each, below), its cost and its fix.
A cost the program chose (resuming from a checkpoint rather than a snapshot, a
pause-resume program waiting for every slice) is a cost, never a problem.
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
from pathlib import Path
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["PROBLEMS", "ProblemKind", "Problem", "Cost", "Totals", "Diagnosis", "diagnose", "diagnose_run",
           "check_allowed", "fault_record", "with_output_causes"]

#: Faults that stop the program's work; faults that give a slice back.
_STOPS = ("lose", "hang", "suspend", "error", "preempt", "kill")
_RETURNS = ("restore", "wake")


@dataclasses.dataclass(frozen=True)
class ProblemKind:
    """One kind of mistake: its name, the rule that finds it, what it costs on a cluster, its fix.

    Args:
        name: the kind's name (``--allow NAME``).
        rule: what the simulator sees that makes it this problem.
        cost: what it costs on a cluster.
        fix: what to change.
    """

    name: str
    rule: str
    cost: str
    fix: str


#: Every problem kind, by name, in the order the verdict lists them.
PROBLEMS: Mapping[str, ProblemKind] = {
    kind.name: kind
    for kind in (
        ProblemKind(
            "restored_nothing",
            rule="an attempt after a slice loss, or the first of a restarted process, ran its first step on a "
                 "freshly initialised state although a snapshot (in this process) or a checkpoint had landed "
                 "(its copy to host memory finished, its commit finished)",
            cost="every step since the start is trained again after each fault",
            fix="at the start of every attempt load the newest snapshot (if snapshotter.latest is not None: "
                "state = snapshotter.load(abstract_state)) or restore the newest checkpoint "
                "(manager.restore(manager.latest_step(), ...)) and continue from its step",
        ),
        ProblemKind(
            "recreated_per_attempt",
            rule="a pathwaysutils Manager or an Orbax Snapshotter was made inside the function given to "
                 "elastic_retry, again in a later attempt (a CheckpointManager made per attempt over the same "
                 "directory finds every committed step, and is not this mistake)",
            cost="its slice tracking or its in-memory snapshots do not survive the attempt: the next attempt "
                 "starts with none of them",
            fix="make the Manager and the Snapshotter once, before the function elastic_retry wraps, and use "
                "them inside it",
        ),
        ProblemKind(
            "held_across_attempts",
            rule="device arrays made by an earlier attempt's steps are still referenced (by something the program "
                 "can still reach) when the next attempt runs its first step",
            cost="on a TPU their HBM, on the lost mesh too, stays allocated for the rest of the process "
                 "(pathwaysutils does not delete live arrays at an elastic event)",
            fix="keep no reference to an attempt's device arrays outside the retried function (no module-level or "
                "outer list of states, no closure keeping the last state); keep host values (float(loss), "
                "jax.device_get) or let the Snapshotter hold the state",
        ),
        ProblemKind(
            "mesh_on_lost_slice",
            rule="inside an elastic_retry attempt, the program put a computation or a transfer on devices of a "
                 "slice that was down at that moment and not among the active slices it had (the attempt's, or "
                 "the set it gave manager.active_slice_indices)",
            cost="on Pathways the work fails on the lost slice (or, once it is back, runs outside what the Manager "
                 "tracks): the attempt fails again and again",
            fix="build the mesh from the Manager's active slices, [d for i in sorted(manager.active_slice_indices) "
                "for d in manager.slice_to_devices[i]], not from jax.devices(), which on Pathways lists every "
                "slice of the allocation, lost ones included",
        ),
        ProblemKind(
            "snapshot_skipped",
            rule="a Snapshotter.save was dropped because the previous snapshot had not finished copying to host "
                 "memory (Orbax queues one save and only logs a warning)",
            cost="the newest snapshot is older than the program believes: a loss redoes the steps since the last "
                 "one that landed",
            fix="snapshot less often than a copy takes, or snapshotter.join() before a save that must not be "
                "skipped",
        ),
        ProblemKind(
            "no_save_at_preemption",
            rule="a preemption (SIGTERM) ended a process of a program that writes checkpoints with no checkpoint "
                 "saved after the signal, so the restarted process redid the steps after its newest checkpoint",
            cost="the steps since the newest checkpoint are trained again after every preemption",
            fix="on SIGTERM, save a checkpoint of the current step at the next step boundary and wait for it "
                "before exiting (a signal handler that sets a flag the loop reads, or JAX's "
                "multihost_utils.reached_preemption_sync_point(step))",
        ),
        ProblemKind(
            "data_not_rewound",
            rule="an attempt resumed from a snapshot or checkpoint of an earlier step (steps to redo) and took "
                 "batches from the Grain ElasticIterator it used before without setting its position "
                 "(set_state) or making a new one first",
            cost="the redone steps train on the batches after the lost ones: the examples of the lost steps are "
                 "never trained on, and the data no longer matches the step",
            fix="save the iterator's state with each snapshot or checkpoint (iterator.get_state()) and, after "
                "restoring, put it back (iterator.set_state(saved)) before the first batch",
        ),
        ProblemKind(
            "returned_slice_ignored",
            rule="a slice came back (it was in the Manager's available_inactive_slices) and the program never read "
                 "available_inactive_slices while it was there, and trained on without it",
            cost="the rest of the run trains on fewer slices than the allocation holds",
            fix="at each step boundary, after that step's snapshot: if manager.available_inactive_slices: raise "
                "pathwaysutils.elastic.manager.ScaleUpSignalError(), so elastic_retry starts an attempt with it",
        ),
        ProblemKind(
            "batch_not_divisible",
            rule="an attempt ended with JAX's IndivisibleError: an array (the global batch) does not divide among the "
                 "devices of the attempt's mesh, fewer after a slice loss",
            cost="the program cannot train on the slices left after a loss: it dies instead of resuming",
            fix="a global batch divisible by the data-parallel width of every slice count from "
                "minimum_slice_count up (replicas x devices per slice), or a per-replica batch (global batch = "
                "per-replica batch x manager.active_slice_count)",
        ),
        ProblemKind(
            "not_initialized",
            rule="the program died with JAX's \"Backend 'proxy' is not in the list of known backends\": it made "
                 "its first JAX call before pathwaysutils.initialize() registered the Pathways (IFRT proxy) backend",
            cost="on Pathways the program fails the same way at its first JAX call: it never starts",
            fix="call pathwaysutils.initialize() at the start of the program, before its first JAX call "
                "(import jax may come first; jax.devices(), an array or a jit call may not)",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class Problem:
    """One mistake found: its kind, the process and attempt it was seen in, what was seen.

    Args:
        kind: a name in :data:`PROBLEMS`.
        process: the process (1 for the first) it was seen in.
        attempt: the ``elastic_retry`` attempt of that process (0: outside any).
        detail: what the simulator saw.
        allowed: accepted by ``--allow`` (it does not fail the run).
    """

    kind: str
    process: int
    attempt: int
    detail: str
    allowed: bool = False

    @property
    def fix(self) -> str:
        return PROBLEMS[self.kind].fix

    def to_json(self) -> dict[str, Any]:
        """The report's object for it.

        Returns:
            ``kind``, ``process``, ``attempt``, ``detail``, ``cost``, ``fix``, ``allowed``.
        """
        return {"kind": self.kind, "process": self.process, "attempt": self.attempt, "detail": self.detail,
                "cost": PROBLEMS[self.kind].cost, "fix": self.fix, "allowed": self.allowed}


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one fired fault cost (the module docstring says what each field means).

    Args:
        fault: the scheduled token (``lose:2@9/step``).
        action: its action.
        slice: its slice, or ``None``.
        process: the process it fired in (1 for the first).
        step: the simulator's step count where it fired.
        detected: how the program learnt of it (``read``, ``dispatch``, ``clock``, ``signal``,
            ``raised``, ``attempt``), or ``None``.
        detected_after_seconds: how long after it fired.
        resumed_from: ``snapshot``, ``checkpoint``, ``live``, ``nothing``, or ``None``.
        resumed_step: the program's step number of what it resumed from.
        redone_steps: the steps trained again.
        recovery_seconds: seconds from the fault to the first step after resuming.
        part_of: the fault whose recovery this one shares, or ``None``.
        taken_up_after_steps: for a return, the steps until an attempt included the slice
            (``None``: never).
        taken_up_after_seconds: and the seconds.
        steps_short: for a return never taken up, the steps trained without it.
    """

    fault: str
    action: str
    slice: int | None
    process: int
    step: int
    detected: str | None = None
    detected_after_seconds: float | None = None
    resumed_from: str | None = None
    resumed_step: int | None = None
    redone_steps: int | None = None
    recovery_seconds: float | None = None
    part_of: str | None = None
    taken_up_after_steps: int | None = None
    taken_up_after_seconds: float | None = None
    steps_short: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The report's object for it.

        Returns:
            Every field by name.
        """
        return dataclasses.asdict(self)

    def line(self) -> str:
        """The verdict's line for it.

        Returns:
            One line of text.
        """
        if self.action in _RETURNS:
            if self.taken_up_after_steps is None:
                return (f"{self.fault}: slice {self.slice} back, NEVER taken up ({self.steps_short} steps trained "
                        "without it)")
            redone = f", {self.redone_steps} steps redone" if self.redone_steps else ""
            return (f"{self.fault}: slice {self.slice} back, taken up after {self.taken_up_after_steps} steps "
                    f"({self.taken_up_after_seconds:.1f} s){redone}")
        if self.part_of is not None:
            return f"{self.fault}: part of {self.part_of}'s recovery"
        seen = (f"detected {_how(self.detected)} {self.detected_after_seconds:.1f} s after it fired"
                if self.detected is not None else "not detected by the program")
        if self.resumed_from is None:
            return f"{self.fault}: {seen}; never resumed"
        what = {"snapshot": "the snapshot of step", "checkpoint": "the checkpoint of step",
                "live": "its live state at position", "nothing": "nothing (a fresh state)"}[self.resumed_from]
        where = what if self.resumed_from == "nothing" else f"{what} {self.resumed_step}"
        return (f"{self.fault}: {seen}; resumed from {where}, {self.redone_steps} steps redone, "
                f"{self.recovery_seconds:.1f} s to the next step")


def _how(detected: str | None) -> str:
    return {"read": "at a read", "dispatch": "at a dispatch", "clock": "by the clock (declared dead)",
            "deadline": "by the program's own deadline",
            "signal": "by its signal", "raised": "where it was raised", "attempt": "when the attempt failed"}.get(
        detected or "", str(detected))


@dataclasses.dataclass(frozen=True)
class Totals:
    """The costs added up: steps dispatched and redone, seconds lost, the useful-work
    fraction (steps not redone over steps dispatched), steps trained short of a returned slice.

    Args:
        steps: the steps dispatched, every process.
        redone_steps: those trained again after a fault.
        seconds_lost: the recovery seconds plus the redone steps at the median step time.
        useful_fraction: steps not redone over steps dispatched (``None``: no step).
        steps_short: steps trained while a returned slice was never taken up.
    """

    steps: int
    redone_steps: int
    seconds_lost: float
    useful_fraction: float | None
    steps_short: int

    def to_json(self) -> dict[str, Any]:
        """The report's object for them.

        Returns:
            Every field by name.
        """
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Costs, totals and problems of one simulated run.

    Args:
        costs: one per fired fault, in the order they fired.
        totals: the costs added up.
        problems: the mistakes found, by process, attempt and kind.
    """

    costs: tuple[Cost, ...]
    totals: Totals
    problems: tuple[Problem, ...]

    @property
    def defects(self) -> tuple[Problem, ...]:
        """The problems ``--allow`` did not accept: each fails the run."""
        return tuple(p for p in self.problems if not p.allowed)

    def lines(self) -> list[str]:
        """The verdict's lines: each cost, the totals, each problem with its fix.

        Returns:
            The lines, indented as the verdict's.
        """
        out = [f"  cost    {c.line()}" for c in self.costs]
        t = self.totals
        if self.costs:
            fraction = f"{t.useful_fraction:.0%}" if t.useful_fraction is not None else "n/a"
            out.append(f"  total   {t.redone_steps} of {t.steps} steps redone, {t.seconds_lost:.1f} s lost, "
                       f"useful work {fraction}" + (f", {t.steps_short} steps short of a returned slice"
                                                    if t.steps_short else ""))
        for p in self.problems:
            mark = "allowed" if p.allowed else "PROBLEM"
            out.append(f"  {mark} {p.kind} (process {p.process}, attempt {p.attempt}): {p.detail}")
            out.append(f"          fix: {p.fix}")
        return out


def check_allowed(allow: Iterable[str]) -> tuple[str, ...]:
    """``allow``'s names, each a problem kind; raises ``ValueError`` naming the kinds otherwise."""
    names = tuple(allow)
    unknown = [n for n in names if n not in PROBLEMS]
    if unknown:
        raise ValueError(f"unknown problem kind {', '.join(unknown)}; the kinds are {', '.join(PROBLEMS)}")
    return names


# --------------------------------------------------------------------------- reading


class _Run:
    """The records of a run, indexed for the rules."""

    def __init__(self, faults: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> None:
        self.faults = sorted(faults, key=lambda f: f["wall"])
        self.events = list(events)
        self.pids: list[int] = []
        for record in [*self.events, *self.faults]:
            pid = record.get("pid")
            if pid is not None and pid not in self.pids:
                self.pids.append(pid)
        self.steps = self.of("step")
        self.resumes = self.of("resume")
        self.attempts = self.of("attempt")
        self.saves = [e for e in self.of("save") if not e.get("skipped")]

    def of(self, kind: str) -> list[Mapping[str, Any]]:
        return [e for e in self.events if e["e"] == kind]

    def process(self, pid: int | None) -> int:
        return self.pids.index(pid) + 1 if pid in self.pids else 0

    def position_at(self, wall: float, pid: int | None = None) -> int:
        before = [s for s in self.steps if s["w"] <= wall and (pid is None or s["pid"] == pid)]
        return before[-1]["p"] if before else 0

    def attempt_at(self, wall: float, pid: int) -> int:
        before = [a for a in self.attempts if a["w"] <= wall and a["pid"] == pid]
        return before[-1]["n"] if before else 0

    def next_resume(self, wall: float) -> Mapping[str, Any] | None:
        return next((r for r in self.resumes if r["w"] > wall), None)


# --------------------------------------------------------------------------- costs


def _stopped(run: _Run, fault: Mapping[str, Any], resume: Mapping[str, Any] | None) -> bool:
    """Whether ``fault`` ended the attempt or process it hit before ``resume``."""
    if resume is None:
        return True
    if resume["pid"] != fault["pid"]:
        return True
    return resume["n"] > run.attempt_at(fault["wall"], fault["pid"])


def _detection(run: _Run, fault: Mapping[str, Any], until: float | None,
               group: Sequence[Mapping[str, Any]]) -> tuple[str | None, float | None]:
    action = fault["action"]
    if action in ("preempt", "kill"):
        return "signal", 0.0
    if action == "error":
        return "raised", 0.0
    if action == "hang":
        dead = next((g for g in group if g["action"] == "lose" and g["slice"] == fault["slice"]), None)
        if dead is not None and dead["phase"] == "wait":
            return "clock", round(dead["wall"] - fault["wall"], 3)
    seen = next((e for e in run.of("detected") if e["pid"] == fault["pid"] and e["w"] >= fault["wall"]
                 and (until is None or e["w"] <= until)), None)
    if seen is not None:
        return seen["how"], round(seen["w"] - fault["wall"], 3)
    ended = next((e for e in run.of("attempt_end") if e["pid"] == fault["pid"] and e["w"] >= fault["wall"]
                  and e.get("error") == "slice_down" and (until is None or e["w"] <= until)), None)
    if ended is not None:
        # a hung slice's reads never fail by themselves: the program's own bound ended the wait
        return ("deadline" if action in ("hang", "suspend") else "attempt"), round(ended["w"] - fault["wall"], 3)
    return None, None


def _costs(run: _Run) -> list[Cost]:
    costs: list[Cost] = []
    claimed: dict[int, str] = {}  # a resume's index -> the fault whose recovery it is
    returned: list[tuple[int, Mapping[str, Any]]] = []
    for fault in run.faults:
        base = {"fault": fault["scheduled"], "action": fault["action"], "slice": fault.get("slice"),
                "process": run.process(fault["pid"]), "step": fault["step"]}
        if fault["action"] in _RETURNS:
            returned.append((len(costs), fault))
            costs.append(Cost(**base))
            continue
        resume = run.next_resume(fault["wall"])
        key = run.resumes.index(resume) if resume is not None else -1
        if not _stopped(run, fault, resume):
            following = [s for s in run.steps if s["pid"] == fault["pid"] and s["w"] > fault["wall"]]
            at = run.position_at(fault["wall"], fault["pid"])
            costs.append(Cost(**base, resumed_from="live", resumed_step=at, redone_steps=0,
                              recovery_seconds=round(following[0]["w"] - fault["wall"], 3) if following else None))
            continue
        if key in claimed:
            costs.append(Cost(**base, part_of=claimed[key]))
            continue
        claimed[key] = fault["scheduled"]
        until = resume["w"] if resume is not None else None
        group = [g for g in run.faults if g["wall"] >= fault["wall"] and (until is None or g["wall"] < until)]
        detected, after = _detection(run, fault, until, group)
        if resume is None:
            costs.append(Cost(**base, detected=detected, detected_after_seconds=after))
            continue
        at = run.position_at(resume["w"], fault["pid"])  # what the work the fault stopped had reached
        costs.append(Cost(**base, detected=detected, detected_after_seconds=after, resumed_from=resume["origin"],
                          resumed_step=resume["step"] if resume["origin"] != "nothing" else None,
                          redone_steps=max(0, at - resume["p"]),
                          recovery_seconds=round(resume["w"] - fault["wall"], 3)))
    for index, fault in returned:  # after the stops: a resume a stop's recovery holds counts its steps there
        costs[index] = dataclasses.replace(costs[index], **_take_up(run, fault, claimed))
    return costs


def _take_up(run: _Run, fault: Mapping[str, Any], claimed: Mapping[int, str]) -> dict[str, Any]:
    back, wall = fault.get("slice"), fault["wall"]
    current = [a for a in run.attempts if a["w"] <= wall]
    if current and back in current[-1]["active"] and not _ended_after(run, current[-1], wall):
        return {"taken_up_after_steps": 0, "taken_up_after_seconds": 0.0}
    in_place = next((e for e in run.events if e["w"] > wall and (  # taken up in place, no new attempt
        e["e"] == "scaled_up" or (e["e"] == "active" and back in e.get("added", ())))), None)
    for attempt in run.attempts:
        if in_place is not None and in_place["w"] < attempt["w"]:
            break
        if attempt["w"] > wall and back in attempt["active"]:
            first = next((r for r in run.resumes if r["pid"] == attempt["pid"] and r["n"] == attempt["n"]), None)
            if first is None:
                continue
            steps = sum(1 for s in run.steps if wall < s["w"] < first["w"])
            at = run.position_at(first["w"], first["pid"])
            redone = 0 if run.resumes.index(first) in claimed else max(0, at - first["p"])
            return {"taken_up_after_steps": steps, "taken_up_after_seconds": round(first["w"] - wall, 3),
                    "resumed_from": first["origin"], "redone_steps": redone,
                    "resumed_step": first["step"] if first["origin"] != "nothing" else None}
    if in_place is not None:
        steps = sum(1 for s in run.steps if wall < s["w"] < in_place["w"])
        return {"taken_up_after_steps": steps, "taken_up_after_seconds": round(in_place["w"] - wall, 3),
                "resumed_from": "live", "redone_steps": 0}
    return {"taken_up_after_steps": None, "steps_short": sum(1 for s in run.steps if s["w"] > wall)}


def _ended_after(run: _Run, attempt: Mapping[str, Any], wall: float) -> bool:
    """Whether ``attempt`` failed (a slice-down error, its process ended) before ``wall``."""
    return any(e["pid"] == attempt["pid"] and e["n"] == attempt["n"] and attempt["w"] <= e["w"] <= wall
               for e in run.of("attempt_end"))


def _totals(run: _Run, costs: Sequence[Cost]) -> Totals:
    redone = sum(c.redone_steps or 0 for c in costs)
    walls = [s["w"] for s in run.steps]
    gaps = [b - a for a, b in zip(walls, walls[1:]) if b > a]
    step_seconds = statistics.median(gaps) if gaps else 0.0
    lost = sum(c.recovery_seconds or 0.0 for c in costs if c.action in _STOPS) + redone * step_seconds
    steps = len(run.steps)
    return Totals(steps=steps, redone_steps=redone, seconds_lost=round(lost, 3),
                  useful_fraction=round((steps - redone) / steps, 4) if steps else None,
                  steps_short=sum(c.steps_short or 0 for c in costs))


# --------------------------------------------------------------------------- the rules


def _recreated_per_attempt(run: _Run) -> list[Problem]:
    out = []
    seen: set[tuple[int, str]] = set()
    for made in run.of("created"):
        if (not made.get("in_retry") or made["n"] < 2 or (made["pid"], made["what"]) in seen
                or made["what"] not in ("Manager", "Snapshotter")):
            continue
        seen.add((made["pid"], made["what"]))
        again = sorted({m["n"] for m in run.of("created") if m["pid"] == made["pid"] and m["what"] == made["what"]
                        and m.get("in_retry")})
        out.append(Problem("recreated_per_attempt", run.process(made["pid"]), made["n"],
                           f"a {made['what']} was made inside the retried function in attempts "
                           f"{', '.join(map(str, again))}: each attempt started with a new one"))
    return out


def _recreated(run: _Run, pid: int, attempt: int) -> bool:
    return any(m["pid"] == pid and m["n"] == attempt and m.get("in_retry") and m["n"] >= 2
               and m["what"] == "Snapshotter" for m in run.of("created"))


def _landed(run: _Run, save: Mapping[str, Any], resume: Mapping[str, Any]) -> bool:
    """Whether ``save`` had landed by ``resume``, as the ``landed`` record before it says (the
    newest snapshot of the resume's process, the newest committed checkpoint); a save whose
    tier that record does not cover cannot be told, and is not counted."""
    landed = next((e for e in reversed(run.of("landed")) if e["pid"] == resume["pid"] and e["w"] <= resume["w"]),
                  None)
    if landed is None or save["kind"] not in landed:
        return False
    newest = landed[save["kind"]]
    return newest is not None and save["step"] <= newest


def _restored_nothing(run: _Run) -> list[Problem]:
    out = []
    first_pid = run.pids[0] if run.pids else None
    for resume in run.resumes:
        if resume["origin"] != "nothing" or (resume["n"] < 2 and resume["pid"] == first_pid):
            continue
        kept = [s for s in run.saves if s["w"] < resume["w"] and s["p"] > 0
                and (s["kind"] == "checkpoint" or s["pid"] == resume["pid"]) and _landed(run, s, resume)]
        if not kept or _recreated(run, resume["pid"], resume["n"]):
            continue  # nothing to restore, or the cause is named: the Snapshotter was made again
        newest = max(kept, key=lambda s: s["p"])
        at = run.position_at(resume["w"])
        out.append(Problem("restored_nothing", run.process(resume["pid"]), resume["n"],
                           f"attempt {resume['n']} ran its first step on a fresh state although the {newest['kind']} "
                           f"of step {newest['step']} had been saved; {at} steps trained again"))
    return out


def _held_across_attempts(run: _Run) -> list[Problem]:
    out = []
    for held in run.of("held"):
        holders = "; held by " + ", ".join(held["holders"]) if held.get("holders") else ""
        earlier = ", ".join(map(str, held.get("attempts", [])))
        out.append(Problem("held_across_attempts", run.process(held["pid"]), held["n"],
                           f"{held['arrays']} device arrays ({_bytes(held['bytes'])}) made by attempt {earlier} "
                           f"still referenced at attempt {held['n']}'s first step{holders}"))
    return out


def _mesh_on_lost_slice(run: _Run) -> list[Problem]:
    out = []
    for placed in run.of("placed"):
        slices = ", ".join(map(str, placed["slices"]))
        active = ",".join(map(str, placed["active"]))
        out.append(Problem("mesh_on_lost_slice", run.process(placed["pid"]), placed["n"],
                           f"{placed['api']} placed work on slice {slices}, not active in this attempt "
                           f"(active slices [{active}], manager.active_slice_indices), at {placed['where']}"))
    return out


def _snapshot_skipped(run: _Run) -> list[Problem]:
    out = []
    for pid in run.pids:
        skipped = [s for s in run.of("save") if s.get("skipped") and s["pid"] == pid and s["kind"] == "snapshot"]
        if skipped:
            steps = ", ".join(str(s["step"]) for s in skipped)
            out.append(Problem("snapshot_skipped", run.process(pid), skipped[0]["n"],
                               f"{len(skipped)} snapshot saves dropped (steps {steps}): the previous snapshot was "
                               "still copying"))
    return out


def _no_save_at_preemption(run: _Run) -> list[Problem]:
    checkpoints = any(s["kind"] == "checkpoint" for s in run.saves) or any(
        m["what"] == "CheckpointManager" for m in run.of("created"))
    if not checkpoints:
        return []  # a program that writes no checkpoints has chosen to start over
    out = []
    for fault in run.faults:
        if fault["action"] != "preempt":
            continue
        resume = next((r for r in run.resumes if r["w"] > fault["wall"] and r["pid"] != fault["pid"]), None)
        if any(s["kind"] == "checkpoint" and s["pid"] == fault["pid"] and s["w"] >= fault["wall"]
               and (resume is None or _landed(run, s, resume)) for s in run.saves):
            continue
        at = run.position_at(fault["wall"], fault["pid"])
        if resume is None or resume["p"] >= at:
            continue
        out.append(Problem("no_save_at_preemption", run.process(fault["pid"]), run.attempt_at(fault["wall"],
                                                                                               fault["pid"]),
                           f"{fault['scheduled']} ended process {run.process(fault['pid'])} with no checkpoint "
                           f"saved after the signal; the restart resumed at position {resume['p']} and redid "
                           f"{at - resume['p']} steps"))
    return out


def _returned_slice_ignored(run: _Run) -> list[Problem]:
    out = []
    for back in run.of("available"):
        pid, slices, wall = back["pid"], set(back["slices"]), back["w"]
        if any(e["pid"] == pid and e["w"] >= wall and slices & set(e["slices"]) for e in run.of("looked")):
            continue
        if any(a["pid"] == pid and a["w"] >= wall and slices & set(a["active"])
               for a in [*run.attempts, *run.of("active")]):
            continue
        after = sum(1 for s in run.steps if s["pid"] == pid and s["w"] > wall)
        if after == 0:
            continue
        names = ", ".join(map(str, sorted(slices)))
        out.append(Problem("returned_slice_ignored", run.process(pid), back["n"],
                           f"slice {names} came back and available_inactive_slices was never read while it held "
                           f"it: {after} steps trained without it"))
    return out


def _data_not_rewound(run: _Run) -> list[Problem]:
    out = []
    for resume in run.resumes:
        if resume["origin"] not in ("snapshot", "checkpoint"):
            continue
        pid, attempt = resume["pid"], resume["n"]
        reached = run.position_at(resume["w"], pid)
        if reached <= resume["p"]:
            continue  # nothing to redo: the data goes on from where it was
        data = [e for e in run.of("data") if e["pid"] == pid]
        used_before = any(e["w"] < resume["w"] and e["what"] == "next" and e["n"] < attempt for e in data)
        positioned = any(e["n"] == attempt and e["what"] in ("set_state", "made") for e in data)
        taken = any(e["n"] == attempt and e["what"] == "next" for e in data)
        if used_before and taken and not positioned:
            out.append(Problem("data_not_rewound", run.process(pid), attempt,
                               f"attempt {attempt} resumed from the {resume['origin']} of step {resume['step']} with "
                               f"{reached - resume['p']} steps to redo, and took batches from the ElasticIterator "
                               "without setting its position: those steps train on other examples"))
    return out


def _batch_not_divisible(run: _Run) -> list[Problem]:
    out = []
    for ended in run.of("attempt_end"):
        if ended.get("error") != "other" or not str(ended.get("error_type", "")).endswith(".IndivisibleError"):
            continue
        attempt = next((a for a in run.attempts if a["pid"] == ended["pid"] and a["n"] == ended["n"]), None)
        slices = f" on slices [{','.join(map(str, attempt['active']))}]" if attempt is not None else ""
        out.append(Problem("batch_not_divisible", run.process(ended["pid"]), ended["n"],
                           f"attempt {ended['n']}{slices} ended with IndivisibleError: "
                           f"{str(ended.get('message', ''))[:200]}"))
    return out


_RULES = (_restored_nothing, _recreated_per_attempt, _held_across_attempts, _mesh_on_lost_slice, _snapshot_skipped,
          _no_save_at_preemption, _data_not_rewound, _returned_slice_ignored, _batch_not_divisible)


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def diagnose(faults: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]],
             allow: Iterable[str] = ()) -> Diagnosis:
    """The costs and problems of a run (see the module docstring).

    Args:
        faults: the fired faults' records (``scheduled``, ``action``, ``slice``, ``phase``,
            ``step``, ``pid``, ``wall``).
        events: the watch's records of every process, in order.
        allow: problem kinds accepted (reported, marked allowed, failing nothing).

    Returns:
        The :class:`Diagnosis`.

    Raises:
        ValueError: ``allow`` names a kind that is not in :data:`PROBLEMS`.
    """
    allowed = set(check_allowed(allow))
    run = _Run(faults, events)
    costs = _costs(run)
    problems = [p for rule in _RULES for p in rule(run)]
    order = list(PROBLEMS)
    problems.sort(key=lambda p: (p.process, p.attempt, order.index(p.kind)))
    problems = [dataclasses.replace(p, allowed=p.kind in allowed) for p in problems]
    return Diagnosis(tuple(costs), _totals(run, costs), tuple(problems))


#: Causes read in the program's own output (its error output's tail), for a boundary that
#: sees no record of them: a pattern, and the kind it names.
_OUTPUT_CAUSES = (
    (re.compile(r"Backend 'proxy' is not in the list of known backends"), "not_initialized"),
    (re.compile(r"IndivisibleError: (.*)"), "batch_not_divisible"),
)


def with_output_causes(diagnosis: Diagnosis | None, output: str, process: int,
                       allow: Iterable[str] = ()) -> Diagnosis | None:
    """``diagnosis`` with the causes the program's error output names (:data:`_OUTPUT_CAUSES`)
    that its records did not already name, each as a problem of ``process``.

    Args:
        diagnosis: the diagnosis from the records, or ``None`` (no records).
        output: the tail of the program's error output.
        process: the process the output's failure is charged to (the last one).
        allow: problem kinds accepted.

    Returns:
        The diagnosis with those problems added (``None`` when there was none and the output
        names nothing).
    """
    allowed = set(check_allowed(allow))
    named = {p.kind for p in diagnosis.problems} if diagnosis is not None else set()
    found: list[Problem] = []
    for pattern, kind in _OUTPUT_CAUSES:
        match = pattern.search(output)
        if match is None or kind in named:
            continue
        detail = match.group(1)[:200] if match.groups() else match.group(0)
        found.append(Problem(kind, process, 0, f"the program's error output: {detail}", allowed=kind in allowed))
    if not found:
        return diagnosis
    if diagnosis is None:
        return Diagnosis((), Totals(0, 0, 0.0, None, 0), tuple(found))
    return dataclasses.replace(diagnosis, problems=diagnosis.problems + tuple(found))


#: A fired fault's fields the rules read (of its ``fault`` event, as the fault log holds it).
_FAULT_FIELDS = ("scheduled", "action", "slice", "phase", "step", "pid", "wall")


def fault_record(event: Any) -> dict[str, Any]:
    """A fired fault's ``fault`` event (:class:`elastic_dew.elastic.events.Fault`) as the
    rules read it.

    Args:
        event: the event.

    Returns:
        Its ``scheduled``, ``action``, ``slice``, ``phase``, ``step``, ``pid`` and ``wall``.
    """
    raw = event.to_json()
    return {key: raw[key] for key in _FAULT_FIELDS}


def diagnose_run(run_dir: str | os.PathLike[str], allow: Iterable[str] = ()) -> Diagnosis:
    """The diagnosis of a run directory a simulated run left: its fault log and the watch's
    records of every process (``faults.jsonl``, ``watch.jsonl``).

    Args:
        run_dir: the run directory.
        allow: problem kinds accepted.

    Returns:
        The :class:`Diagnosis` (no costs nor problems without a watch file).

    Raises:
        ValueError: ``allow`` names an unknown kind, or the fault log holds a bad line.
    """
    from elastic_dew import rundir

    base = Path(run_dir)
    faults = [fault_record(f) for f in rundir.FaultLog(base / rundir.FAULTS_FILE).entries()]
    return diagnose(faults, rundir.read_records(base / rundir.WATCH_FILE), allow)
