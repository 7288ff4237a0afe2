"""The mistakes the simulator names (:data:`PROBLEMS`), each with the rule that finds it, its cost and its fix.

Each kind is a defect: a mistake that costs hours on a cluster, found by one function below
from a run's records (:class:`~elastic_dew.simulate.run_records.Records`) alone, or by the
program's error output (:func:`output_problems`) for a cause no record shows. A cost the
program chose (resuming from a checkpoint rather than a snapshot, a pause-resume program
waiting for every slice) is a cost, never a problem. A rule that cannot tell from the
records (a save no ``landed`` record covers, a placement with no slice down) stays silent.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from elastic_dew.simulate.run_records import Records

__all__ = ["PROBLEMS", "Problem", "ProblemKind", "check_allowed", "output_problems", "problems_in"]


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
                 "elastic_retry, again in a later attempt (a CheckpointManager or a v1 Checkpointer made per "
                 "attempt over the same directory finds every committed step, and is not this mistake)",
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


def check_allowed(allow: Iterable[str]) -> tuple[str, ...]:
    """``allow``'s names, each a problem kind; raises ``ValueError`` naming the kinds otherwise."""
    names = tuple(allow)
    unknown = [n for n in names if n not in PROBLEMS]
    if unknown:
        raise ValueError(f"unknown problem kind {', '.join(unknown)}; the kinds are {', '.join(PROBLEMS)}")
    return names


def _recreated_per_attempt(run: Records) -> list[Problem]:
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


def _recreated(run: Records, pid: int, attempt: int) -> bool:
    return any(m["pid"] == pid and m["n"] == attempt and m.get("in_retry") and m["n"] >= 2
               and m["what"] == "Snapshotter" for m in run.of("created"))


def _landed(run: Records, save: Mapping[str, Any], resume: Mapping[str, Any]) -> bool | None:
    """Whether ``save`` had landed by ``resume``, as the ``landed`` record before it says (the
    newest snapshot of the resume's process, the newest committed checkpoint); ``None`` when
    that record does not cover the save's tier: it cannot be told, and each rule stays silent."""
    landed = next((e for e in reversed(run.of("landed")) if e["pid"] == resume["pid"] and e["w"] <= resume["w"]),
                  None)
    if landed is None or save["kind"] not in landed:
        return None
    newest = landed[save["kind"]]
    return newest is not None and save["step"] <= newest


def _restored_nothing(run: Records) -> list[Problem]:
    out = []
    first_pid = run.pids[0] if run.pids else None
    for resume in run.resumes:
        if resume["origin"] != "nothing" or (resume["n"] < 2 and resume["pid"] == first_pid):
            continue
        kept = [s for s in run.saves if s["w"] < resume["w"] and s["p"] > 0
                and (s["kind"] == "checkpoint" or s["pid"] == resume["pid"]) and _landed(run, s, resume) is True]
        if not kept or _recreated(run, resume["pid"], resume["n"]):
            continue  # nothing to restore, or the cause is named: the Snapshotter was made again
        newest = max(kept, key=lambda s: s["p"])
        at = run.position_at(resume["w"])
        out.append(Problem("restored_nothing", run.process(resume["pid"]), resume["n"],
                           f"attempt {resume['n']} ran its first step on a fresh state although the {newest['kind']} "
                           f"of step {newest['step']} had been saved; {at} steps trained again"))
    return out


def _held_across_attempts(run: Records) -> list[Problem]:
    out = []
    for held in run.of("held"):
        holders = "; held by " + ", ".join(held["holders"]) if held.get("holders") else ""
        earlier = ", ".join(map(str, held.get("attempts", [])))
        out.append(Problem("held_across_attempts", run.process(held["pid"]), held["n"],
                           f"{held['arrays']} device arrays ({_bytes(held['bytes'])}) made by attempt {earlier} "
                           f"still referenced at attempt {held['n']}'s first step{holders}"))
    return out


def _mesh_on_lost_slice(run: Records) -> list[Problem]:
    out = []
    for placed in run.of("placed"):
        slices = ", ".join(map(str, placed["slices"]))
        active = (f"the program's active slices [{','.join(map(str, placed['active']))}], "
                  "manager.active_slice_indices" if placed["active"] is not None  # None: the proxy boundary's
                  else "after the program met the loss and probed the slices")
        out.append(Problem("mesh_on_lost_slice", run.process(placed["pid"]), placed["n"],
                           f"{placed['api']} placed work on slice {slices}, down at that moment ({active}), "
                           f"at {placed['where']}"))
    return out


def _snapshot_skipped(run: Records) -> list[Problem]:
    out = []
    for pid in run.pids:
        skipped = [s for s in run.of("save") if s.get("skipped") and s["pid"] == pid and s["kind"] == "snapshot"]
        if skipped:
            steps = ", ".join(str(s["step"]) for s in skipped)
            out.append(Problem("snapshot_skipped", run.process(pid), skipped[0]["n"],
                               f"{len(skipped)} snapshot saves dropped (steps {steps}): the previous snapshot was "
                               "still copying"))
    return out


def _no_save_at_preemption(run: Records) -> list[Problem]:
    checkpoints = any(s["kind"] == "checkpoint" for s in run.saves) or any(
        m["what"] in ("CheckpointManager", "Checkpointer") for m in run.of("created"))
    if not checkpoints:
        return []  # a program that writes no checkpoints has chosen to start over
    out = []
    for fault in run.faults:
        if fault["action"] != "preempt":
            continue
        resume = next((r for r in run.resumes if r["w"] > fault["wall"] and r["pid"] != fault["pid"]), None)
        if any(s["kind"] == "checkpoint" and s["pid"] == fault["pid"] and s["w"] >= fault["wall"]
               and (resume is None or _landed(run, s, resume) is not False) for s in run.saves):
            continue
        at = run.position_at(fault["wall"], fault["pid"])
        if resume is None or resume["p"] >= at:
            continue
        out.append(Problem("no_save_at_preemption", run.process(fault["pid"]), run.attempt_at(fault["wall"],
                                                                                               fault["pid"]),
                           f"{fault['scheduled']} ended process {run.process(fault['pid'])} with no checkpoint "
                           f"saved after the signal; the restart resumed from {_origin(resume)} and redid "
                           f"{at - resume['p']} steps"))
    return out


def _origin(resume: Mapping[str, Any]) -> str:
    """What ``resume`` resumed from, in the program's step numbers."""
    if resume["origin"] in ("snapshot", "checkpoint"):
        return f"the {resume['origin']} of step {resume['step']}"
    return "its live state" if resume["origin"] == "live" else "nothing (a fresh state)"


def _returned_slice_ignored(run: Records) -> list[Problem]:
    out = []
    for back in run.of("available"):
        pid, slices, wall = back["pid"], set(back["slices"]), back["w"]
        if any(e["pid"] == pid and e["w"] >= wall and slices & set(e["slices"]) for e in run.of("looked")):
            continue
        if any(a["pid"] == pid and a["w"] >= wall and slices & set(a["active"])
               for a in [*run.attempts, *run.of("active")]):
            continue
        ups = [until for i in slices if (until := run.up_until(i, wall)) is not None]
        if not ups:
            continue  # down again when the Manager's stale set named it: it never came back to take up
        up = max(ups)
        after = sum(1 for s in run.steps if s["pid"] == pid and wall < s["w"] < up)
        if after == 0:
            continue
        names = ", ".join(map(str, sorted(slices)))
        out.append(Problem("returned_slice_ignored", run.process(pid), back["n"],
                           f"slice {names} came back and available_inactive_slices was never read while it held "
                           f"it: {after} steps trained without it"))
    return out


def _data_not_rewound(run: Records) -> list[Problem]:
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


def _batch_not_divisible(run: Records) -> list[Problem]:
    out = []
    for ended in run.of("attempt_end"):
        if ended.get("error") != "other" or not str(ended.get("error_type", "")).endswith(".IndivisibleError"):
            continue
        attempt = next((a for a in run.attempts if a["pid"] == ended["pid"] and a["n"] == ended["n"]), None)
        slices = f" on slices [{','.join(map(str, attempt['active']))}]" if attempt is not None else ""
        out.append(Problem("batch_not_divisible", run.process(ended["pid"]), ended["n"],
                           f"attempt {ended['n']}{slices} ended with IndivisibleError: "
                           f"{_indivisible_gist(str(ended.get('message', '')))}"))
    return out


def _indivisible_gist(message: str) -> str:
    """What JAX's IndivisibleError says of the array (its axis, the shards, the size), without
    the sharding's repr before it, whose length differs between JAX releases."""
    found = re.search(r"array axis \d+ is partitioned \d+ times[^.]*", message)
    return found.group(0) if found else message[:200]


_RULES = (_restored_nothing, _recreated_per_attempt, _held_across_attempts, _mesh_on_lost_slice, _snapshot_skipped,
          _no_save_at_preemption, _data_not_rewound, _returned_slice_ignored, _batch_not_divisible)


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def problems_in(run: Records) -> list[Problem]:
    """Every problem the rules find in ``run``, rule by rule.

    Args:
        run: the run's records.

    Returns:
        The problems, not yet sorted nor marked allowed.
    """
    return [p for rule in _RULES for p in rule(run)]


#: Causes read in the program's own output (its error output's tail), for a boundary that
#: sees no record of them: a pattern, and the kind it names.
_OUTPUT_CAUSES = (
    (re.compile(r"Backend 'proxy' is not in the list of known backends"), "not_initialized"),
    (re.compile(r"IndivisibleError: (.*)"), "batch_not_divisible"),
)


def output_problems(output: str, process: int, named: Iterable[str] = ()) -> list[Problem]:
    """The causes the program's error output names (:data:`_OUTPUT_CAUSES`), but those in ``named``.

    Args:
        output: the tail of the program's error output.
        process: the process the output's failure is charged to.
        named: kinds already named from the records.

    Returns:
        One problem per cause found.
    """
    found: list[Problem] = []
    for pattern, kind in _OUTPUT_CAUSES:
        match = pattern.search(output)
        if match is None or kind in set(named):
            continue
        detail = _indivisible_gist(match.group(1)) if kind == "batch_not_divisible" else (
            match.group(1)[:200] if match.groups() else match.group(0))
        found.append(Problem(kind, process, 0, f"the program's error output: {detail}"))
    return found
