"""The picture of a plan: each policy's goodput (and useful work) against the slice count."""

from __future__ import annotations

import os
from pathlib import Path

from elastic_dew.plan.policy import POLICIES
from elastic_dew.plan.planner import Plan

__all__ = ["draw_plan", "require_matplotlib"]

_LABELS = {"restart": "restart (JobSet)", "pause_resume": "pause-resume", "replica_resize": "replica-resize"}


def require_matplotlib() -> None:
    """Raise ``RuntimeError`` saying how to install matplotlib when it is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "the plot needs matplotlib, which is not installed; install the plot extra "
            "(pip install 'elastic-dew[plot]') or leave out --plot"
        ) from None


def draw_plan(plan: Plan, path: str | os.PathLike[str], title: str = "") -> Path:
    """Draw goodput (solid) and useful work (dashed) against slices, one colour per policy,
    to ``path`` (PNG); returns it. Needs matplotlib (:func:`require_matplotlib`)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 5))
    for policy in POLICIES:
        rows = [row for row in plan.by_slices if row["policy"] == policy]
        xs = [row["slices"] for row in rows]
        line, = ax.plot(xs, [100 * row["goodput"] for row in rows], marker="o", markersize=3,
                        label=f"{_LABELS[policy]}: goodput")
        ax.plot(xs, [100 * row["useful_work"] for row in rows], linestyle="--", color=line.get_color(),
                label=f"{_LABELS[policy]}: useful work")
    ax.set_xscale("log")
    ax.set_ylim(0, 100)
    ax.set_xlabel("slices")
    ax.set_ylabel("goodput, useful work (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
