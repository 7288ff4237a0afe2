"""A plan checked on finished runs: their goodput by the model's definition, beside the prediction.

:func:`measure` reads one run directory's record: the goodput the model predicts is a
run's in its steady state, so it is measured from the end of the run's first checkpoint
save at the cadence (or, without one, its first step: the start, the first compile and
the state built from scratch are left out) to its last step line (the closing checkpoint,
which waits for its write, is the run's end), as the record's productive step time
(``account``: steps done again after a restore are not productive) over that wall time.
The run's policy and settings come from its command line (``command.json``) when it has
one, else from its record (the saves' cadence; replica-resize's floor the fewest slices a
step of the runs compared together ran on).

:func:`compare` sets the runs' mean and its standard error beside the model's prediction
for their policy and settings; :func:`check_frame` refuses runs whose slice losses came at
a rate the cluster does not have (a schedule drawn in another time frame, or from other
rates), the check being meaningless then.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import statistics
from pathlib import Path

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.plan import model, pool, validity
from elastic_dew.plan.inputs import Cluster, Costs, known
from elastic_dew.plan.policy import PolicySettings

__all__ = ["Measured", "Comparison", "measure", "by_settings", "compare", "check_frame", "expected_losses",
           "FRAME_TAIL"]

#: Runs whose count of slice losses the cluster's rates give with probability below this
#: (either tail of the Poisson count), and that differs from the expectation by more than
#: a factor of two, are from another frame.
FRAME_TAIL = 1e-6

#: ``ElasticConfig``'s cadences, for a run that neither gave one nor shows it.
_DEFAULTS = ElasticConfig()

#: The fault actions that are slice losses: ridden in process, or ending the program.
_LOSSES = ("lose", "kill", "error")


@dataclasses.dataclass(frozen=True)
class Measured:
    """One finished run's steady-state figures and the settings it ran with.

    ``losses``: the slice losses that fired in the measured stretch (``ends_process``:
    as a ``kill`` or ``error``, which the restart policy meets). ``settings_source``
    says where the settings were read.
    """

    run_dir: str
    goodput: float
    wall_seconds: float
    productive_seconds: float
    losses: int
    ends_process: bool
    slices: int
    policy: str
    snapshot_every: int | None
    checkpoint_every: int
    min_slices: int | None
    settings_source: str
    steps: int = 0
    floor_given: bool = True

    @property
    def settings(self) -> str:
        """The settings, as the check's table names them."""
        parts = [f"snapshot {self.snapshot_every or '-'}", f"checkpoint {self.checkpoint_every}"]
        if self.min_slices is not None and self.floor_given:
            parts.append(f"min_slices {self.min_slices}")
        return f"{self.slices} slices, " + ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Runs of one policy and settings: their mean goodput, its standard error (``None``
    for one run) and the model's prediction; ``outside_checked_range``: why the runs' rates
    are outside the range the model was checked over (:func:`~elastic_dew.plan.validity.outside`),
    empty inside it."""

    policy: str
    runs: int
    measured: float
    standard_error: float | None
    predicted: float
    outside_checked_range: tuple[str, ...] = ()


def _flag(argv: list[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _cadence(steps: list[int]) -> int | None:
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    return collections.Counter(gaps).most_common(1)[0][0] if gaps else None


def measure(run_dir: str | os.PathLike[str]) -> Measured:
    """The steady-state goodput of the finished run in ``run_dir`` and its settings.

    Raises ``ValueError`` when the directory holds no record, the run did not finish
    (its last stop is not ``done``) or it has no step after the stretch's start.
    """
    from elastic_dew import record
    from elastic_dew.elastic import events as ev
    from elastic_dew.plan.inputs import _closing_saves, _run_events

    run_dir = Path(run_dir)
    events = _run_events(run_dir)
    stops = [e for e in events if isinstance(e, ev.Stop)]
    if not stops or stops[-1].reason != "done":
        last = stops[-1].reason if stops else "none"
        raise ValueError(f"{run_dir} did not finish (its last stop: {last}); --check measures finished runs")
    closing = _closing_saves(events)
    saves = {i: e for i, e in enumerate(events) if isinstance(e, ev.Save) and e.taken and not closing[i]}
    checkpoints = [i for i, e in saves.items() if e.tier == "checkpoint"]
    step_indices = [i for i, e in enumerate(events) if isinstance(e, ev.Step)]
    if not step_indices:
        raise ValueError(f"{run_dir} has no step")
    start = checkpoints[0] if checkpoints else step_indices[0]
    end = step_indices[-1]
    if end <= start:
        raise ValueError(f"{run_dir} has no step after its first checkpoint; give a longer run")
    # Nothing before the start is undone later (every restore point is at or after it).
    productive = record.account(events).productive_seconds - record.account(events[:start + 1]).productive_seconds
    wall = events[end].wall - events[start].wall
    faults = [e for e in events[start + 1:end] if isinstance(e, ev.Fault) and e.action in _LOSSES]
    ends_process = any(e.action in ("kill", "error") for e in faults)
    steps = [e for e in events if isinstance(e, ev.Step)]
    slices = max(e.slices for e in steps)
    fewest = min(e.slices for e in steps)
    snapshots = [e.step for e in saves.values() if e.tier == "snapshot"]
    checkpoint_steps = [saves[i].step for i in checkpoints]
    argv: list[str] | None = None
    command = run_dir / "command.json"
    if command.is_file():
        try:
            argv = json.loads(command.read_text()).get("argv")
        except (json.JSONDecodeError, OSError):
            argv = None
    given = {name: _flag(argv, flag) for name, flag in (
        ("snapshot_every", "--snapshot-every"), ("checkpoint_every", "--checkpoint-every"),
        ("min_slices", "--min-slices"))} if argv else {}
    # A setting the command line gave, else the cadence the record shows, else the default.
    snapshot_every = int(text) if (text := given.get("snapshot_every")) else (
        _cadence(snapshots) or _DEFAULTS.snapshot_every)
    checkpoint_every = int(text) if (text := given.get("checkpoint_every")) else (
        _cadence(checkpoint_steps) or _DEFAULTS.checkpoint_every)
    if argv:
        min_slices = int(text) if (text := given.get("min_slices")) else None
        source = "settings from its command line, else its record"
    else:
        min_slices = fewest if fewest < slices else None
        source = "settings from its record (the saves' cadence, the fewest slices a step ran on)"
    if ends_process:
        policy = "restart"
    elif min_slices is not None or fewest < slices:
        policy = "replica_resize"
        min_slices = min_slices if min_slices is not None else fewest
    else:
        policy = "pause_resume"
    return Measured(
        run_dir=str(run_dir), goodput=productive / wall if wall > 0 else 0.0, wall_seconds=wall,
        productive_seconds=productive, losses=len(faults), ends_process=ends_process, slices=slices, policy=policy,
        snapshot_every=None if policy == "restart" else snapshot_every, checkpoint_every=checkpoint_every,
        min_slices=min_slices if policy == "replica_resize" else None, settings_source=source,
        steps=max(1, steps[-1].step - getattr(events[start], "step", 0)),
        floor_given=bool(argv),
    )


def by_settings(runs: list[Measured]) -> dict[str, list[Measured]]:
    """The runs grouped by policy and settings, in the order they come."""
    out: dict[str, list[Measured]] = {}
    for run in runs:
        out.setdefault(f"{run.policy}: {run.settings}", []).append(run)
    return out


def _frame(cluster: Cluster, run: Measured) -> Cluster:
    # A program restarted after a kill or an error has every slice again: nothing to wait for.
    sized = dataclasses.replace(cluster, slices=run.slices)
    return dataclasses.replace(sized, return_minutes=0.0) if run.ends_process else sized


def compare(runs: list[Measured], costs: Costs, cluster: Cluster) -> Comparison:
    """The runs' (one policy and settings) mean goodput, its standard error and the model's
    prediction on ``cluster`` (with the runs' slice count) at their settings, for runs of
    their mean measured steps.

    Raises ``ValueError`` for no runs, runs of different policies or settings, or a cost not
    known.
    """
    if not runs:
        raise ValueError("no runs to compare")
    first = runs[0]
    if any((r.policy, r.settings) != (first.policy, first.settings) for r in runs):
        raise ValueError("the runs compared together must share their policy and settings")
    values = [r.goodput for r in runs]
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    steps = round(statistics.fmean(r.steps for r in runs))
    # A floor no command line gave is the fewest slices any of the runs stepped on.
    floor = first.min_slices if first.floor_given else min((r.min_slices for r in runs if r.min_slices), default=None)
    settings = PolicySettings(first.policy, first.snapshot_every, first.checkpoint_every, floor)
    frame = _frame(cluster, first)
    predicted = model.evaluate(known(costs), frame, settings, steps=steps).goodput
    return Comparison(first.policy, len(runs), statistics.fmean(values), se, predicted,
                      validity.outside(known(costs), frame, settings))


def expected_losses(run: Measured, cluster: Cluster) -> float:
    """The slice losses the cluster's rates give over the run's measured stretch: each of
    its slices fails at the cluster's rate while it is up (a loss that ends the program
    leaves no slice down)."""
    r = pool.rates(_frame(cluster, run))
    up = 1.0 if run.ends_process else 1.0 - r.q
    return run.slices * r.alpha * up * run.wall_seconds


def check_frame(runs: list[Measured], cluster: Cluster, factor: float = 1.0) -> None:
    """Refuse runs whose slice losses the cluster's rates (in the frame compressed
    ``factor`` times) cannot explain: a count, over all the runs, in a Poisson tail of
    probability below :data:`FRAME_TAIL` and off the expectation by more than a factor of
    two.

    Raises ``ValueError`` naming both rates and the compression the runs look like.
    """
    met = sum(r.losses for r in runs)
    expected = sum(expected_losses(r, cluster) for r in runs)
    wall = sum(r.wall_seconds for r in runs)
    far = _poisson_tail(met, expected) < FRAME_TAIL
    ratio = met / expected if expected > 0 else math.inf
    if far and not 0.5 <= ratio <= 2.0:
        frame = "the cluster" if factor == 1.0 else f"the cluster compressed {factor:g}x (--compress)"
        every = f"one every {wall / met:.3g} s" if met else "none"
        expected_every = f"one every {wall / expected:.3g} s" if expected > 0 else "none"
        looks = (f"; they look like a schedule compressed {factor * ratio:.3g}x from these rates (--compress "
                 f"{factor * ratio:.3g})") if math.isfinite(ratio) and ratio > 0 else ""
        raise ValueError(
            f"the runs met {met} slice losses in {wall:.1f} s of their measured stretch ({every}), but {frame} "
            f"loses {expected:.3g} in that time ({expected_every}): the prediction and the runs describe different "
            f"clusters. Give the rates their schedule was drawn from, and the --compress it was drawn with{looks}")



def _poisson_tail(k: int, mean: float) -> float:
    """The probability of a Poisson count of ``mean`` at least as far out as ``k`` on its
    side: ``P(N >= k)`` above the mean, ``P(N <= k)`` below it."""
    if mean <= 0:
        return 1.0 if k == 0 else 0.0
    terms = [math.exp(-mean + j * math.log(mean) - math.lgamma(j + 1.0)) for j in range(k + 1)]
    at_most = min(1.0, sum(terms))
    return max(0.0, 1.0 - at_most + terms[-1]) if k > mean else at_most
