"""What each fault cost a program under the simulator, and the mistakes it made, each named with its fix.

:func:`diagnose` reads two things only: the faults that fired and what the program's
processes did (:mod:`elastic_dew.simulate.run_records`). It never reads the program's source,
and it imports no JAX, so ``elastic-dew simulate`` diagnoses after the program's processes
have ended, and any boundary that records the same observations gets the same diagnosis.
The costs are :mod:`elastic_dew.simulate.costs`; the problems and their rules
:mod:`elastic_dew.simulate.problems`; this module puts them together as the verdict's
:class:`Diagnosis` (its lines and its JSON).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastic_dew.simulate.costs import Cost, Totals, costs_of, totals_of
from elastic_dew.simulate.problems import PROBLEMS, Problem, ProblemKind, check_allowed, output_problems, problems_in
from elastic_dew.simulate.run_records import Records, fault_record

__all__ = ["PROBLEMS", "ProblemKind", "Problem", "Cost", "Totals", "Diagnosis", "diagnose",
           "check_allowed", "fault_record", "with_output_causes"]


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
    run = Records(faults, events)
    costs = costs_of(run)
    problems = problems_in(run)
    order = list(PROBLEMS)
    problems.sort(key=lambda p: (p.process, p.attempt, order.index(p.kind)))
    problems = [dataclasses.replace(p, allowed=p.kind in allowed) for p in problems]
    return Diagnosis(tuple(costs), totals_of(run, costs), tuple(problems))


def with_output_causes(diagnosis: Diagnosis | None, output: str, process: int,
                       allow: Iterable[str] = ()) -> Diagnosis | None:
    """``diagnosis`` with the causes the program's error output names
    (:func:`elastic_dew.simulate.problems.output_problems`) that its records did not already
    name, each as a problem of ``process``.

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
    found = [dataclasses.replace(p, allowed=p.kind in allowed) for p in output_problems(output, process, named)]
    if not found:
        return diagnosis
    if diagnosis is None:
        return Diagnosis((), Totals(0, 0, 0.0, None, 0), tuple(found))
    return dataclasses.replace(diagnosis, problems=diagnosis.problems + tuple(found))
