"""``summary.json``: the run's outcome, written at the end of each process.

Its keys (those of :func:`~elastic_dew.record.goodput.summarize`) are a contract other tools
read (``docs/trainer.md``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from elastic_dew import rundir
from elastic_dew.elastic import events as ev
from elastic_dew.record.goodput import summarize
from elastic_dew.record.log import read_events
from elastic_dew.record.params import flatten_params, write_params

__all__ = ["write_summary", "load_summary"]


def write_summary(
    run_dir: str | os.PathLike[str],
    events: Iterable[ev.Event | Mapping[str, Any]] | None = None,
    params: Any = None,
    memory: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Write ``summary.json`` (and ``final_params.npz`` when ``params`` are given).

    ``events`` defaults to the run directory's own ``events.jsonl``. ``memory`` (``state_bytes``,
    ``state_bytes_per_device_max``, ``snapshot_host_bytes_per_device_max``) is measured
    where the arrays are, by the trainer, and written as the summary's ``memory``.

    Args:
        run_dir: the run directory.
        events: the run's events, or ``None`` for its ``events.jsonl``.
        params: the final parameters, or ``None``.
        memory: the memory figures, or ``None``.

    Returns:
        The summary.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [ev.to_json(e) for e in (read_events(run_dir) if events is None else events)]
    flat = flatten_params(params) if params is not None else None
    summary = summarize(lines, params=flat)
    if memory is not None:
        summary["memory"] = {key: int(value) for key, value in memory.items()}
    if flat is not None:
        write_params(run_dir, flat)
    rundir.atomic_write(
        run_dir / rundir.SUMMARY_FILE,
        lambda f: f.write((json.dumps(summary, indent=2, sort_keys=False) + "\n").encode()),
    )
    return summary


def load_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``summary.json`` of a finished run.

    Args:
        run_dir: the run directory.

    Returns:
        The summary's fields.
    """
    return json.loads((Path(run_dir) / rundir.SUMMARY_FILE).read_text())
