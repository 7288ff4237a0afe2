"""Whether every fault of a schedule can fire: the analysis a run refuses a schedule by.

:func:`unreachable` follows a schedule's faults through the slices' health (each action's
:attr:`~elastic_dew.simulate.schedule.Action.slice_healthy` in
:data:`~elastic_dew.simulate.schedule.ACTION_TABLE`) and names a fault the run can never
reach: one keyed to a step after the run paused waiting for a slice whose return is keyed to
a later step still. Planning a simulated run (:func:`elastic_dew.run.planning.plan_run`)
refuses such a schedule before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elastic_dew.simulate.schedule import ACTION_TABLE, Schedule, ScheduledFault, action_of

__all__ = ["unreachable"]


def unreachable(schedule: Schedule, slices: int, minimum_slice_count: int | None = None, *,
                name: Callable[[str, Any], str] | None = None) -> str | None:
    """Why a fault of ``schedule`` can never fire on ``slices`` slices, or ``None``.

    A run stops stepping while fewer than ``minimum_slice_count`` slices are healthy (all of
    them in pause-resume, ``None``), so a fault keyed to a later step than the one the run
    paused at can fire only after something brings the slices back, and a return keyed to
    such a step never comes. Faults are followed in the order they fire: step-keyed ones by
    step; a time-keyed one right after its predecessor when that fired while the run was
    paused (wall time passes in a wait). Where the order is not certain (a time-keyed fault
    whose predecessor fired while the run was stepping) the check stops and accepts: only
    a fault that certainly cannot fire is reported. A process-ending fault starts a new
    process, with every slice healthy again. The reason names the setting with ``name``
    (the field and its value), by default as Python does (``minimum_slice_count=3``);
    :func:`elastic_dew.settings.mention` keeps it as data for a refusal a command line words.

    Args:
        schedule: the parsed schedule.
        slices: how many slices there are.
        minimum_slice_count: the run's minimum, ``None`` for pause-resume.
        name: names ``minimum_slice_count`` in the reason, given the field and the value.

    Returns:
        Why a fault cannot fire, or ``None`` when every fault can.
    """
    name = name or (lambda field, value: f"{field}={value}")
    faults = schedule.faults
    needed = slices if minimum_slice_count is None else minimum_slice_count
    lost: set[int] = set()
    paused: list[int | None] = [None]  # the step the run paused at, or None while it steps
    cause: list[ScheduledFault | None] = [None]

    def apply(fault: ScheduledFault, step: int) -> None:
        healthy = action_of(fault).slice_healthy
        if healthy is False and fault.slice is not None:  # a health action always names its slice
            lost.add(fault.slice)
        elif healthy:
            lost.discard(fault.slice)
        elif action_of(fault).ends_process:
            lost.clear()
        if len(lost) > slices - needed:
            if paused[0] is None:
                paused[0], cause[0] = step, fault
        else:
            paused[0] = None

    def fire_chain(index: int, step: int) -> bool:
        """Apply fault ``index`` and the time-keyed faults chained after it; False when unsure."""
        apply(faults[index], step)
        following = index + 1
        while following < len(faults) and faults[following].timed:
            fault = faults[following]
            if paused[0] is None or action_of(fault).raises:
                return False  # it fires at a step nobody can name: the order is not certain
            apply(fault, paused[0])
            following += 1
        return True

    if faults and faults[0].timed:
        return None
    keyed = sorted((fault.step, index) for index, fault in enumerate(faults) if not fault.timed)
    for step, index in keyed:
        fault = faults[index]
        if paused[0] is not None and step > paused[0]:
            down = sorted(lost)
            names = ", ".join(map(str, down))
            first = down[0]
            mode = ("pause-resume waits for every slice" if minimum_slice_count is None
                    else f"{name('minimum_slice_count', minimum_slice_count)} needs {needed} healthy slices")
            back = next(name for name, action in ACTION_TABLE.items() if action.slice_healthy)
            return (
                f"fault {fault} can never fire: after {cause[0]} the run stops stepping at step "
                f"{paused[0]} and waits for slice {names} ({mode}), and nothing brings "
                f"{'it' if len(down) == 1 else 'them'} back before step {step}. Key the return "
                f"to time instead, e.g. {back}:{first}@+3 (3 s after the previous fault fired), "
                f"or let the run carry on without {'it' if len(down) == 1 else 'them'} with "
                f"{name('minimum_slice_count', max(1, slices - len(down)))}"
            )
        if not fire_chain(index, step):
            return None
    return None
