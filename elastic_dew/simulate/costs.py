"""What each fired fault cost a program under the simulator (:class:`Cost`) and the costs added up (:class:`Totals`).

One :class:`Cost` per fired fault. For a fault that stops work (``lose``, ``hang``,
``suspend``, ``error``, ``preempt``, ``kill``): how the program learnt of it (``detected``: at a
``read`` or a ``dispatch`` of work on the slice, by the ``clock`` that declared a hung slice
dead, by the program's own ``deadline`` on a hung slice's read, by the ``signal`` itself) and
how long after it fired; where the attempt or process after it resumed (``resumed_from``:
``snapshot``, ``checkpoint``, ``live`` for a state carried over, ``nothing`` for a fresh one;
``None`` when nothing resumed), the program's step number of what it resumed from
(``resumed_step``), the steps it trained again (``redone_steps``: the position the stopped
work had reached less the position it resumed at) and the seconds from the fault to the
first step it dispatched after resuming (``recovery_seconds``). Faults that stop the same
work before it resumes (a hang and the loss that declares it dead) share that recovery: the
first carries it, the others name it (``part_of``). For a returned slice (``restore``,
``wake``): the steps and seconds after which the program's attempts, or the active slices it
set itself (an in-place scale-up), included it (``taken_up_after_steps``, ``None`` for never,
with ``steps_short``: the steps trained without it); steps a stop's recovery redid are
counted there only.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from elastic_dew.simulate.run_records import Records

__all__ = ["RETURNS", "STOPS", "Cost", "Totals", "costs_of", "totals_of"]

#: Faults that stop the program's work; faults that give a slice back.
STOPS = ("lose", "hang", "suspend", "error", "preempt", "kill")
RETURNS = ("restore", "wake")


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
        if self.action in RETURNS:
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
        if self.resumed_from in ("snapshot", "checkpoint") and self.resumed_step is None:  # the proxy boundary's
            where = f"a {self.resumed_from} (its step number is the program's, not seen through the proxy)"
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


def _stopped(run: Records, fault: Mapping[str, Any], resume: Mapping[str, Any] | None) -> bool:
    """Whether ``fault`` ended the attempt or process it hit before ``resume``."""
    if resume is None:
        return True
    if resume["pid"] != fault["pid"]:
        return True
    return resume["n"] > run.attempt_at(fault["wall"], fault["pid"])


def _detection(run: Records, fault: Mapping[str, Any], until: float | None,
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


def costs_of(run: Records) -> list[Cost]:
    """One :class:`Cost` per fired fault, in the order they fired (see the module docstring)."""
    costs: list[Cost] = []
    claimed: dict[int, str] = {}  # a resume's index -> the fault whose recovery it is
    returned: list[tuple[int, Mapping[str, Any]]] = []
    for fault in run.faults:
        base = {"fault": fault["scheduled"], "action": fault["action"], "slice": fault.get("slice"),
                "process": run.process(fault["pid"]), "step": fault["step"]}
        if fault["action"] in RETURNS:
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


def _take_up(run: Records, fault: Mapping[str, Any], claimed: Mapping[int, str]) -> dict[str, Any]:
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
    up = run.up_until(back, wall) if back is not None else None
    until = up if up is not None else wall  # lost again at once: no step trained short of it
    return {"taken_up_after_steps": None, "steps_short": sum(1 for s in run.steps if wall < s["w"] < until)}


def _ended_after(run: Records, attempt: Mapping[str, Any], wall: float) -> bool:
    """Whether ``attempt`` failed (a slice-down error, its process ended) before ``wall``."""
    return any(e["pid"] == attempt["pid"] and e["n"] == attempt["n"] and attempt["w"] <= e["w"] <= wall
               for e in run.of("attempt_end"))


def totals_of(run: Records, costs: Sequence[Cost]) -> Totals:
    """``costs`` added up over the run's steps."""
    redone = sum(c.redone_steps or 0 for c in costs)
    walls = [s["w"] for s in run.steps]
    gaps = [b - a for a, b in zip(walls, walls[1:]) if b > a]
    step_seconds = statistics.median(gaps) if gaps else 0.0
    lost = sum(c.recovery_seconds or 0.0 for c in costs if c.action in STOPS) + redone * step_seconds
    steps = len(run.steps)
    return Totals(steps=steps, redone_steps=redone, seconds_lost=round(lost, 3),
                  useful_fraction=round((steps - redone) / steps, 4) if steps else None,
                  steps_short=sum(c.steps_short or 0 for c in costs))
