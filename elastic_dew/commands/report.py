"""``elastic-dew report DIR``: a run's summary as a table, and its timeline redrawn.

The summary is computed again from the run's ``events.jsonl`` (with the commit rule) and
the simulator's ``faults.jsonl``, so it also describes a run that has not finished (one
stopped by a preemption and not yet restarted); the state digest comes from
``final_params.npz`` and the memory figures from ``summary.json`` once the run has written them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from elastic_dew.run import USAGE_EXIT

__all__ = ["configure", "run", "report"]

logger = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="DIR", help="a run directory (it holds events.jsonl)")
    parser.add_argument(
        "--no-timeline", action="store_true", help="print the table only; leave timeline.png as it is"
    )


def report(run_dir: str | Path, *, timeline: bool = True) -> tuple[dict[str, Any], Path | None, str]:
    """Summarise ``run_dir``: ``(summary, timeline path or None, table text)``."""
    from elastic_dew import record, rundir

    run_dir = Path(run_dir)
    events = record.as_events(record.read_events(run_dir))
    params = record.load_params(run_dir) if (run_dir / rundir.PARAMS_FILE).exists() else None
    summary = record.summarize(events, params=params)
    if (run_dir / rundir.SUMMARY_FILE).exists():
        # The memory figures are measured on the arrays, not derived from events: keep the
        # ones the run wrote.
        try:
            memory = record.load_summary(run_dir).get("memory")
        except (ValueError, OSError, AttributeError):  # a damaged summary.json: no figures
            memory = None
        if memory is not None:
            summary["memory"] = memory
    picture = None
    if timeline:
        try:
            picture = record.draw_timeline(run_dir)
        except RuntimeError as error:  # matplotlib missing: the table still stands
            logger.warning("%s", error)
    return summary, picture, record.format_summary(summary, run_dir)


def _problem(run_dir: Path) -> str | None:
    from elastic_dew.record import read_events
    from elastic_dew.rundir import EVENTS_FILE

    if not run_dir.is_dir():
        return f"{run_dir} is not a directory; give a run directory (runs/NAME)"
    if not (run_dir / EVENTS_FILE).is_file():
        return (
            f"{run_dir} has no {EVENTS_FILE}; give a directory that a run wrote "
            "(elastic-dew train ... --run-dir DIR)"
        )
    if (run_dir / EVENTS_FILE).stat().st_size and not read_events(run_dir):
        return (
            f"{run_dir / EVENTS_FILE} holds no run-record event (every line is damaged or not "
            "an elastic_dew event); give the directory of an elastic_dew run"
        )
    return None


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    problem = _problem(run_dir)
    if problem is not None:
        print(f"elastic-dew report: error: {problem}", file=sys.stderr)
        return USAGE_EXIT
    try:
        _, picture, table = report(run_dir, timeline=not args.no_timeline)
    except ValueError as error:  # a damaged final_params.npz, say
        print(f"elastic-dew report: error: {error}", file=sys.stderr)
        return USAGE_EXIT
    print(table)
    if picture is not None:
        print(f"\ntimeline: {picture}")
    return 0
