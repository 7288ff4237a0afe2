"""``elastic-dew plan``: expected goodput and the elastic settings to pick at N slices.

``elastic-dew plan [--from RUN_DIR] --slices N [--slice-mtbf-hours H] [--preemptions-per-day P]
[--return-minutes R] [--spares K] [--reschedule-minutes M] [--json FILE] [--plot FILE]``, with a
flag for each of the run's costs (``--step-seconds``, ``--data-wait-seconds``,
``--loop-overhead-seconds``, ``--snapshot-seconds``,
``--checkpoint-seconds``, ``--snapshot-restore-seconds``, ``--restore-seconds``,
``--recovery-seconds``, ``--restart-seconds``, ``--scale-up-seconds``, ``--new-mesh-seconds``) that a run directory
would measure, or overrides. Prints every input with where it came from, a table of the
policies at their recommended settings, the retry budget of the in-process policies for a
run of ``--steps S`` steps (a day's by default) that gives up in at most
``--max-give-up`` of runs, the recommendation with the ``elastic-dew train`` flags that
follow it, and how goodput grows with N; ``--json`` writes the plan for tools and
``--plot`` the picture of goodput against N.

``--compress X`` plans the cluster in its own time frame and in the frame of a schedule
drawn with ``--compress X`` (every time of the cluster divided by X): both predictions
side by side, and the compressed frame's settings, which a run under that schedule
follows.

``--draw-schedule SEED --steps S`` prints instead a fault schedule drawn from the rates
(:func:`elastic_dew.plan.draw_schedule`) for a run of S steps, time compressed by the
factor it states (``--compress``; by default so that the run meets about 20 faults),
counted from step ``--start-step`` when given; ``--loss`` writes a slice loss as the
restart policy meets it (``kill`` or ``error``).

``--check RUN_DIR...`` measures finished runs' goodput by the model's definition
(:func:`elastic_dew.plan.check.measure`) and prints it beside the model's prediction for
their policy and settings, with its standard error; runs whose slice losses came at a rate
the cluster (in the frame ``--compress`` gives) does not have are refused, naming both.

Every refusal (an input out of range, a cost neither given nor measured, a run directory
without a record, a file that cannot be written, the plot without matplotlib) says which
input and why, and comes before anything is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from elastic_dew.run import USAGE_EXIT
from elastic_dew.flags import Flag, Flags, add_flags, command_line_text, flag_name, given
from elastic_dew.settings import SettingError

__all__ = ["configure", "run", "train_flags"]

#: Where a cluster default comes from, as the report names it.
_DEFAULT_SOURCES = {
    "slice_mtbf_hours": "default: Llama 3's published interruption rate per accelerator, for a 64-chip slice",
    "preemptions_per_day": "default: none",
    "return_minutes": "default: assumed (give your cluster's repair or replacement time)",
    "spares": "default: none",
    "reschedule_minutes": "default: assumed (GKE rescheduling a JobSet's pods)",
}


def _flags() -> dict[str, tuple[type, Flags]]:
    """The plan's settings on the command line: each part, its configuration and its flags."""
    from elastic_dew.plan.inputs import Cluster, Costs

    given = "default: {default:g}"
    return {
        "cluster": (Cluster, {
            "slices": Flag(metavar="N", required=True), "slice_mtbf_hours": Flag(metavar="H", default=given),
            "preemptions_per_day": Flag(metavar="P", default=given), "return_minutes": Flag(metavar="R", default=given),
            "spares": Flag(metavar="K", default=given), "reschedule_minutes": Flag(metavar="M", default=given),
        }),
        "costs": (Costs, {field: Flag(metavar="S") for field in (
            "step_seconds", "data_wait_seconds", "loop_overhead_seconds", "snapshot_seconds", "checkpoint_seconds",
            "snapshot_restore_seconds", "checkpoint_restore_seconds", "recovery_seconds", "restart_seconds",
            "scale_up_seconds", "new_mesh_seconds")} | {
            "data_wait_seconds": Flag(metavar="S", default=given),
            "loop_overhead_seconds": Flag(metavar="S", default=given),
            "new_mesh_seconds": Flag(metavar="S", default=given),
            "checkpoint_restore_seconds": Flag(metavar="S", name="--restore-seconds"),
        }),
    }


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="from_dir", metavar="RUN_DIR",
                        help="a run directory whose record measures the costs (flags override it)")
    titles = {"cluster": "the cluster", "costs": "the run's costs (measured by --from, or given)"}
    for part, (owner, flags) in _flags().items():
        add_flags(parser.add_argument_group(titles[part]), owner, flags, part=part)
    budget = parser.add_argument_group("the retry budget")
    budget.add_argument("--max-give-up", metavar="P", type=float, default=None,
                        help="the share of runs of --steps steps that may give up (default 0.001)")
    budget.add_argument("--retry-reset-steps", metavar="STEPS", type=int, default=None,
                        help="steps of progress after which the count of slice losses starts again (default 50)")
    parser.add_argument("--check", metavar="RUN_DIR", nargs="+",
                        help="measure these finished runs' goodput and print it beside the prediction")
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the plan as JSON")
    out.add_argument("--plot", metavar="FILE", help="draw goodput against slices, 1 to 10,000 (PNG; matplotlib)")
    draw = parser.add_argument_group("a fault schedule drawn from the rates")
    draw.add_argument("--draw-schedule", metavar="SEED", type=int,
                      help="print a fault schedule drawn with SEED for --steps steps, and nothing else")
    draw.add_argument("--steps", metavar="S", type=int,
                      help="steps of the run: the one the retry budget is for (default: a day's), or the schedule's")
    draw.add_argument("--compress", metavar="X", type=float,
                      help="compress the cluster's time X times: the schedule's frame (default: so the run meets "
                           "about 20 faults); without --draw-schedule, plan that frame beside the cluster's own")
    draw.add_argument("--start-step", metavar="K", type=int,
                      help="count the faults from step K of the run instead of its start")
    draw.add_argument("--loss", choices=("lose", "kill", "error"), default="lose",
                      help="a slice loss as lose (ridden in process), or as the restart policy meets it: kill "
                           "(the process ends) or error (the training raises)")


class _Refused(Exception):
    """An input the plan cannot use: the message says which and why."""


def _build(part: str, values: dict[str, Any]):
    owner, flags = _flags()[part]
    try:
        return owner(**values)
    except SettingError as error:
        raise _Refused(command_line_text(error, [(owner, flags)])) from None


def _writable(flag: str, path: str | None) -> None:
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise _Refused(f"{flag} {path} is a directory; give a file name")
    if not target.parent.is_dir():
        raise _Refused(f"{flag} {path}: the directory {target.parent} does not exist; create it or give another path")


def _inputs(args: argparse.Namespace):
    from elastic_dew.plan import inputs

    parts = _flags()
    cluster_given = given(args, *parts["cluster"], part="cluster")
    cluster = _build("cluster", cluster_given)
    measured: dict[str, inputs.Input] = {}
    if args.from_dir is not None:
        try:
            measured = inputs.measured_costs(args.from_dir)
        except (ValueError, OSError) as error:
            raise _Refused(f"--from {args.from_dir}: {error}") from None
    costs_given = given(args, *parts["costs"], part="costs")
    figures = inputs.resolve(costs_given, measured)
    costs = _build("costs", {name: figure.value for name, figure in figures.items()})
    for field in dataclasses.fields(costs):
        if field.name not in figures and getattr(costs, field.name) is not None:
            figures[field.name] = inputs.Input(getattr(costs, field.name), "default: none")
    missing = inputs.unknown(costs)
    if missing and args.draw_schedule is None:
        flags = ", ".join(flag_name(name, parts["costs"][1][name]) for name in missing)
        where = f"{args.from_dir} does not measure them" if args.from_dir else "no --from RUN_DIR measures them"
        raise _Refused(f"the plan needs {flags} ({where}); give them, or a run directory that measures them")
    for field in dataclasses.fields(cluster):
        value = getattr(cluster, field.name)
        figures[field.name] = inputs.Input(value, "given" if field.name in cluster_given
                                           else _DEFAULT_SOURCES.get(field.name, "default"))
    return costs, cluster, figures


def _schedule(args: argparse.Namespace, costs, cluster) -> tuple[str, float]:
    from elastic_dew.plan.faults import compression, draw_schedule

    if args.steps is None or args.steps < 1:
        raise _Refused(f"--draw-schedule needs --steps S with S >= 1 (got {args.steps})")
    if costs.step_seconds is None:
        raise _Refused("--draw-schedule needs the step time: give --step-seconds or --from RUN_DIR")
    factor = args.compress or compression(cluster, costs.step_seconds, args.steps)
    if args.start_step is not None and args.start_step < 0:
        raise _Refused(f"--start-step {args.start_step} must be >= 0")
    text = draw_schedule(cluster, costs.step_seconds, args.steps, args.draw_schedule, factor=factor, loss=args.loss,
                         start_step=args.start_step)
    return text, factor


def _budget_args(args: argparse.Namespace) -> dict[str, Any]:
    from elastic_dew.plan import retry

    if args.steps is not None and args.steps < 1:
        raise _Refused(f"--steps {args.steps} must be >= 1")
    max_give_up = retry.MAX_GIVE_UP if args.max_give_up is None else args.max_give_up
    if not 0 < max_give_up < 1:
        raise _Refused(f"--max-give-up {args.max_give_up} must be between 0 and 1 (0.001: 1 run in 1,000)")
    reset = retry.DEFAULT_RETRY_RESET_STEPS if args.retry_reset_steps is None else args.retry_reset_steps
    if reset < 0:
        raise _Refused(f"--retry-reset-steps {reset} must be >= 0 (0 counts over the whole run)")
    return {"steps": args.steps, "max_give_up": max_give_up, "retry_reset_steps": reset}


def run(args: argparse.Namespace) -> int:
    try:
        if args.draw_schedule is None and args.start_step is not None:
            raise _Refused("--start-step goes with --draw-schedule SEED")
        if args.draw_schedule is not None and (args.json or args.plot or args.check):
            raise _Refused("--draw-schedule prints a schedule only; leave out --json, --plot and --check")
        if args.compress is not None and not (args.compress > 0 and math.isfinite(args.compress)):
            raise _Refused(f"--compress {args.compress} must be a number > 0")
        budget = _budget_args(args)
        _writable("--json", args.json)
        _writable("--plot", args.plot)
        if args.plot:
            from elastic_dew.plan.picture import require_matplotlib

            try:
                require_matplotlib()
            except RuntimeError as error:
                raise _Refused(str(error)) from None
        costs, cluster, figures = _inputs(args)
        if args.draw_schedule is not None:
            text, factor = _schedule(args, costs, cluster)
            print(f"# {args.steps} steps of {costs.step_seconds:g} s on {cluster.slices} slices, seed "
                  f"{args.draw_schedule}, the cluster's time compressed {factor:.6g}x "
                  f"(slice MTBF {cluster.slice_mtbf_hours:g} h -> {cluster.slice_mtbf_hours * 3600 / factor:.4g} s, "
                  f"return {cluster.return_minutes:g} min -> {cluster.return_minutes * 60 / factor:.4g} s); "
                  f"plan this frame with --compress {factor:.6g}")
            print(text)
            return 0
        if args.check:
            from elastic_dew.plan import check

            try:
                runs = [check.measure(run_dir) for run_dir in args.check]
            except (ValueError, OSError) as error:
                raise _Refused(f"--check: {error}") from None
            frame = _compressed(cluster, args.compress)
            try:
                check.check_frame(runs, frame, args.compress or 1.0)
            except ValueError as error:
                raise _Refused(f"--check: {error}") from None
    except _Refused as error:
        print(f"elastic-dew plan: error: {error}", file=sys.stderr)
        return USAGE_EXIT
    from elastic_dew.plan import planner

    if args.check:
        print(_check_table(runs, costs, frame, args.compress, budget))
        return 0
    result = planner.plan(costs, cluster, **budget)
    print(_table(result, figures, cluster))
    compressed = None
    if args.compress is not None:
        frame = _compressed(cluster, args.compress)
        compressed = planner.plan(costs, frame, **budget)
        print(_compressed_table(compressed, result, frame, args.compress))
    if args.json:
        data = _json(result, figures)
        if compressed is not None:
            data["compressed"] = {"factor": args.compress, "cluster": dataclasses.asdict(frame),
                                  "policies": [row.to_json() for row in compressed.policies],
                                  "recommended": compressed.recommended.to_json()}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
        print(f"\njson: {args.json}")
    if args.plot:
        from elastic_dew.plan.picture import draw_plan

        draw_plan(result, args.plot, title=f"{args.from_dir or 'given costs'}; slice MTBF "
                  f"{cluster.slice_mtbf_hours:g} h, return {cluster.return_minutes:g} min, "
                  f"{cluster.preemptions_per_day:g} preemptions/day, {cluster.spares} spares")
        print(f"plot: {args.plot}")
    return 0


def _json(result, figures) -> dict[str, Any]:
    return {
        "inputs": {name: figure.to_json() for name, figure in figures.items()},
        "policies": [row.to_json() for row in result.policies],
        "recommended": result.recommended.to_json(),
        "by_slices": list(result.by_slices),
    }


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _compressed(cluster, factor: float | None):
    from elastic_dew.plan.faults import compressed

    return cluster if factor is None else compressed(cluster, factor)


def _odds(p: float) -> str:
    """A probability as '1 in N' runs."""
    if p <= 1e-12:
        return "< 1 in 10^12"
    if p >= 0.5:
        return f"{100 * p:.0f}%"
    return f"1 in {1 / p:,.0f}"


#: What a mark beside a prediction means.
_UNCHECKED = ("outside the range the model was checked over against real runs: the figure is the model's, not a "
              "checked prediction")


def _mark(row) -> str:
    return " *" if row.outside_checked_range else ""


def _unchecked_note(row) -> str:
    return "; outside the checked range (*)" if row.outside_checked_range else ""


def _unchecked_lines(rows) -> list[str]:
    flagged = [row for row in rows if row.outside_checked_range]
    if not flagged:
        return []
    lines = ["", f"* {_UNCHECKED}:"]
    for row in flagged:
        lines += [f"  {row.policy} ({row.spares} spare{'' if row.spares == 1 else 's'}): {reason}"
                  for reason in row.outside_checked_range]
    return lines


def train_flags(row) -> str:
    """The ``elastic-dew train`` flags of a plan's row (:meth:`PolicyPlan.elastic_settings`)."""
    from elastic_dew import console

    return " ".join(f"{console.flag_of(name)} {value}" for name, value in row.elastic_settings().items()
                    if value is not None)


def _retry_lines(rows) -> list[str]:
    from elastic_dew.plan import retry

    budgets = [row for row in rows if row.retry is not None]
    if not budgets:
        return []
    first = budgets[0].retry
    lines = ["", f"retry budget (a run of {first.steps:,} steps gives up in at most {_odds(first.max_give_up)}; a "
             f"count of slice losses ends after {first.retry_reset_steps} steps of progress):",
             f"  {'policy':15s} {'spares':>6s} {'max_attempts':>12s} {'gives up':>18s} "
             f"{f'defaults ({retry.DEFAULT_MAX_ATTEMPTS} in {retry.DEFAULT_RETRY_RESET_STEPS}) give up':>32s} "
             f"{'losses/count':>12s} {'crash loop ends':>15s}"]
    for row in budgets:
        b = row.retry
        attempts = "none <= 1000" if b.max_attempts is None else str(b.max_attempts)
        defaults = _odds(b.default_give_up_probability) + (": too low" if b.defaults_too_low else "")
        lines.append(f"  {row.policy:15s} {row.spares:6d} {attempts:>12s} {_odds(b.give_up_probability):>18s} "
                     f"{defaults:>32s} {b.window_mean:12.2f} {b.crash_loop_seconds:13.1f} s")
    return lines


def _compressed_table(compressed, real, frame, factor: float) -> str:
    lines = ["", f"in the frame of a schedule drawn with --compress {factor:g} (the cluster's time {factor:g} times "
             f"faster: slice MTBF {frame.slice_mtbf_hours * 3600:.4g} s, return {frame.return_minutes * 60:.4g} s, "
             f"{frame.preemptions_per_day:g} preemptions/day, reschedule {frame.reschedule_minutes * 60:.4g} s); "
             f"the run's costs are its own:",
             f"  {'policy':15s} {'spares':>6s} {'goodput':>8s} {'(real)':>8s} {'snapshot':>9s} {'checkpoint':>10s} "
             f"{'min':>6s}",
             f"  {'':15s} {'':>6s} {'':>8s} {'':>8s} {'every':>9s} {'every':>10s} {'slices':>6s}"]
    for row, own in zip(compressed.policies, real.policies, strict=True):
        lines.append(f"  {row.policy:15s} {row.spares:6d} {_pct(row.goodput):>8s} {_pct(own.goodput):>8s} "
                     f"{'-' if row.snapshot_every is None else row.snapshot_every:>9} {row.checkpoint_every:>10} "
                     f"{'-' if row.min_slices is None else row.min_slices:>6}{_mark(row)}")
    lines += _unchecked_lines(compressed.policies)
    lines += _retry_lines(compressed.policies)
    best = compressed.recommended
    lines += ["", f"a run under that schedule follows the compressed frame's plan ({best.policy}, {best.spares} spares"
              f"{_unchecked_note(best)}): elastic-dew train ... {train_flags(best)}"]
    return "\n".join(lines)


def _check_table(runs, costs, frame, factor, budget) -> str:
    from elastic_dew.plan import check

    lines = [f"{len(runs)} finished run{'s' if len(runs) != 1 else ''}, goodput by the model's definition (productive "
             "step time over wall time, from the first step after the first checkpoint, or the first step, to the "
             "last step):"]
    for measured in runs:
        lines.append(f"  {measured.run_dir}: {_pct(measured.goodput).strip()} over {measured.wall_seconds:.1f} s, "
                     f"{measured.losses} slice losses; {measured.settings_source}")
    groups = check.by_settings(runs)
    flagged: list[tuple[str, str]] = []
    lines += ["", f"  {'policy':15s} {'runs':>4s} {'measured':>9s} {'s.e.':>6s} {'predicted':>9s} {'gap':>7s}  settings"
              + ("" if factor is None else f"   (frame: --compress {factor:g})")]
    for key, members in groups.items():
        result = check.compare(members, costs, frame)
        se = "-" if result.standard_error is None else f"{100 * result.standard_error:.1f}"
        lines.append(f"  {result.policy:15s} {len(members):4d} {_pct(result.measured):>9s} {se:>6s} "
                     f"{_pct(result.predicted):>9s} {100 * (result.measured - result.predicted):+6.1f}  {key}"
                     f"{' *' if result.outside_checked_range else ''}")
        flagged.extend((result.policy, reason) for reason in result.outside_checked_range)
    if flagged:
        lines += ["", f"* {_UNCHECKED}:"] + [f"  {policy}: {reason}" for policy, reason in dict.fromkeys(flagged)]
    return "\n".join(lines)


def _table(result, figures, cluster) -> str:
    from elastic_dew.plan.inputs import CLUSTER_FIELDS, COST_FIELDS

    lines = ["inputs:"]
    for name in CLUSTER_FIELDS + COST_FIELDS:
        if name in figures:
            value = figures[name].value
            shown = f"{value:g}" if isinstance(value, float) else str(value)
            lines.append(f"  {name:27s} {shown:>10s}  {figures[name].source}")
    lines += ["", f"on {cluster.slices} slices, each policy at its recommended settings:",
              f"  {'policy':15s} {'spares':>6s} {'goodput':>8s} {'useful':>8s} {'snapshot':>9s} {'checkpoint':>10s} "
              f"{'min':>6s} {'lost/loss':>10s} {'down/loss':>10s} {'faults/day':>10s}",
              f"  {'':15s} {'':>6s} {'':>8s} {'work':>8s} {'every':>9s} {'every':>10s} {'slices':>6s} "
              f"{'(steps)':>10s} {'(s)':>10s} {'':>10s}"]
    for row in result.policies:
        lines.append(
            f"  {row.policy:15s} {row.spares:6d} {_pct(row.goodput):>8s} {_pct(row.useful_work):>8s} "
            f"{'-' if row.snapshot_every is None else row.snapshot_every:>9} {row.checkpoint_every:>10} "
            f"{'-' if row.min_slices is None else row.min_slices:>6} {row.lost_steps:10.1f} "
            f"{row.downtime_seconds:10.0f} {row.faults_per_day:10.1f}{_mark(row)}")
    lines += _unchecked_lines(result.policies)
    lines += _retry_lines(result.policies)
    best = result.recommended
    lines += ["", f"recommended (the most useful work): {best.policy} with {best.spares} "
              f"spare{'' if best.spares == 1 else 's'}"
              + (f", min_slices {best.min_slices}" if best.min_slices is not None else "")
              + (f", snapshot every {best.snapshot_every} steps" if best.snapshot_every else "")
              + f", checkpoint every {best.checkpoint_every} steps"
              + (f", max_attempts {best.retry.max_attempts} within {best.retry.retry_reset_steps} steps"
                 if best.retry is not None and best.retry.max_attempts is not None else "")
              + f": useful work {_pct(best.useful_work).strip()}, goodput {_pct(best.goodput).strip()}"
              + _unchecked_note(best),
              f"  elastic-dew train ... {train_flags(best)}"]
    counts = (1, 4, 16, 64, 256, 1024, 4096, 10000)
    lines += ["", f"goodput / useful work by slices ({cluster.spares} spares):",
              "  " + f"{'slices':>7s}"
              + "".join(f" {policy:>22s}" for policy in ("restart", "pause_resume", "replica_resize"))]
    for n in counts:
        cells = []
        for policy in ("restart", "pause_resume", "replica_resize"):
            row = next(r for r in result.by_slices if r["slices"] == n and r["policy"] == policy)
            cells.append(f"{_pct(row['goodput'])} / {_pct(row['useful_work'])}")
        lines.append("  " + f"{n:7d}" + "".join(f" {cell:>22s}" for cell in cells))
    return "\n".join(lines)
