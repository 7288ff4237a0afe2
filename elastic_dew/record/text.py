"""A run's summary as a plain-text table, for a terminal (``train``, ``report``, the demo)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["format_summary"]


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _mib(value: Any) -> str:
    return "?" if value is None else f"{int(value) / 2**20:.2f} MiB"


def format_summary(summary: Mapping[str, Any], run_dir: str | Path | None = None) -> str:
    """The summary (``summary.json``'s fields) as a table: the run's outcome, then badput by category.

    Args:
        summary: the summary's fields.
        run_dir: the run directory, named in the table, or ``None``.

    Returns:
        The table's text.
    """
    wall = float(summary.get("wall_seconds") or 0.0)
    rows = []
    if run_dir is not None:
        rows.append(("run", str(run_dir)))
    rows += [
        ("final step", str(summary.get("final_step"))),
        ("examples consumed", str(summary.get("examples_consumed"))),
        ("state digest", str(summary.get("state_digest") or "- (no final_params.npz yet)")),
        (
            "goodput",
            f"{100 * float(summary.get('goodput') or 0.0):.1f} %  (productive "
            f"{float(summary.get('productive_seconds') or 0.0):.1f} s of {wall:.1f} s wall, "
            f"{summary.get('processes', '?')} process(es))",
        ),
        ("stops", _counts(summary.get("stops", {}))),
        ("resumes", _counts(summary.get("resumes", {}))),
        ("faults", _counts(summary.get("faults", {}))),
    ]
    stored = summary.get("storage")
    if stored and (stored.get("committed") or stored.get("skipped") or stored.get("abandoned")):
        seconds = stored.get("commit_seconds") or []
        took = f", each {min(seconds):.1f}-{max(seconds):.1f} s" if seconds else ""
        rows.append((
            "checkpoints",
            f"committed {stored['committed']}{took}, skipped {stored['skipped']}, abandoned {stored['abandoned']}; "
            f"{stored.get('retries', 0)} retries, {int(stored.get('bytes', 0)) / 1e6:.1f} MB moved; training waited "
            f"{float(stored.get('waited_seconds', 0.0)):.1f} s on storage "
            f"({100 * float(stored.get('waited_share', 0.0)):.1f} % of the wall time)"
            + ("  STORAGE-BOUND" if stored.get("storage_bound") else ""),
        ))
    memory = summary.get("memory")
    if memory:
        rows.append((
            "memory",
            f"state {_mib(memory.get('state_bytes'))}, largest share on a device "
            f"{_mib(memory.get('state_bytes_per_device_max'))}, snapshot in host memory per device "
            f"{_mib(memory.get('snapshot_host_bytes_per_device_max'))}",
        ))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    badput = summary.get("badput", {})
    if badput:
        name_width = max(len("badput"), *(len(k) for k in badput))
        lines += ["", f"{'badput':<{name_width}}  {'seconds':>9}  {'share':>7}"]
        for name, seconds in badput.items():
            share = 100 * seconds / wall if wall > 0 else 0.0
            lines.append(f"{name:<{name_width}}  {seconds:>9.2f}  {share:>6.1f}%")
    return "\n".join(lines)
