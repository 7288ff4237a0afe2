"""``timeline.png``: a picture of the run over wall time (needs matplotlib, the ``plot`` extra).

The top panel shows the active slices, the bottom one the step rate; every stop, resume and
fault is a vertical line across both, labelled with its kind, detail and step.
"""

from __future__ import annotations

import os
from pathlib import Path

from elastic_dew import rundir
from elastic_dew.elastic import events as ev
from elastic_dew.record.goodput import committed_flags
from elastic_dew.record.log import as_events, has_wall, read_events

__all__ = ["draw_timeline"]

#: Colour and line style of the events drawn as vertical lines.
_STYLES: dict[type[ev.Event], tuple[str, str]] = {
    ev.Stop: ("tab:red", "--"),
    ev.Resume: ("tab:green", ":"),
    ev.Fault: ("black", "-"),
}


def _attempt_segments(events: list[ev.Event]) -> list[list[ev.Step]]:
    """Runs of consecutive step lines, split at every start, stop and resume."""
    segments: list[list[ev.Step]] = [[]]
    for event in events:
        if isinstance(event, ev.Step):
            segments[-1].append(event)
        elif isinstance(event, (ev.Start, ev.Stop, ev.Resume)) and segments[-1]:
            segments.append([])
    return [s for s in segments if s]


def _detail(event: ev.Event) -> str:
    if isinstance(event, ev.Stop):
        return event.reason
    if isinstance(event, ev.Resume):
        return event.source
    if isinstance(event, ev.Fault):
        return event.action
    return ""


def draw_timeline(run_dir: str | os.PathLike[str]) -> Path:
    """Draw ``timeline.png``: active slices, step rate and stop/resume events over wall time.

    Needs matplotlib (the ``plot`` extra).

    Args:
        run_dir: the run directory.

    Returns:
        The picture's path.

    Raises:
        RuntimeError: matplotlib is not installed (the error says how to install it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError(
            "drawing timeline.png needs matplotlib; install the plot extra: "
            "pip install 'elastic-dew[plot]'"
        ) from err

    run_dir = Path(run_dir)
    events = as_events(read_events(run_dir))
    walls = [e.wall for e in events if has_wall(e)]
    starts = [
        e.process_start if e.process_start == e.process_start else e.wall
        for e in events if isinstance(e, ev.Start)
    ]
    starts = [s for s in starts if s == s]  # not nan
    t0 = min([*walls, *starts], default=0.0)
    flags = committed_flags(events)
    steps = [e for e in events if isinstance(e, ev.Step)]
    wasted_steps = [e for e, ok in zip(events, flags, strict=True) if isinstance(e, ev.Step) and not ok]

    fig, (ax_slices, ax_rate) = plt.subplots(2, 1, sharex=True, figsize=(10, 5.5))
    fig.suptitle(f"{run_dir.name}: active slices, step rate and stop/resume events")

    if steps:
        # One line per attempt: a stop, resume or process start breaks it, so neither the
        # slice count nor the step rate is drawn across a gap.
        for segment in _attempt_segments(events):
            t = [e.wall - t0 for e in segment]
            ax_slices.step(t, [e.slices for e in segment], where="post", color="tab:blue")
            window = 5
            rt = t[window:]
            rate = [
                window / (segment[i].wall - segment[i - window].wall)
                if segment[i].wall > segment[i - window].wall else float("nan")
                for i in range(window, len(segment))
            ]
            if rt:
                ax_rate.plot(rt, rate, color="tab:green", linewidth=1)
        wasted = [e.wall - t0 for e in wasted_steps]
        if wasted:
            ax_slices.scatter(
                wasted, [0] * len(wasted), marker="|", color="tab:red", label="re-done steps"
            )
    labelled = set()
    span = max(walls, default=t0) - t0 or 1.0
    group_x, in_group = None, 0
    for event in events:
        style = _STYLES.get(type(event))
        if style is None or not has_wall(event):
            continue
        color, line_style = style
        kind = event.kind
        x = event.wall - t0
        # Events close together get their labels side by side instead of on top of each other.
        if group_x is not None and x - group_x < 0.02 * span:
            in_group += 1
        else:
            group_x, in_group = x, 0
        for ax in (ax_slices, ax_rate):
            ax.axvline(x, color=color, linestyle=line_style, linewidth=1, alpha=0.7,
                       label=kind if (ax is ax_slices and kind not in labelled) else None)
        labelled.add(kind)
        ax_slices.annotate(
            f"{kind} {_detail(event)} @{getattr(event, 'step', None)}",
            (x, 1.0), xycoords=("data", "axes fraction"), rotation=90,
            xytext=(8 * in_group, 0), textcoords="offset points",
            fontsize=7, va="top", ha="right",
        )
    for s in starts:
        ax_slices.axvline(s - t0, color="gray", linewidth=2, alpha=0.4,
                          label="process start" if "start" not in labelled else None)
        labelled.add("start")
    ax_slices.set_ylabel("active slices")
    ax_slices.set_ylim(bottom=0)
    ax_slices.yaxis.get_major_locator().set_params(integer=True)
    ax_rate.set_ylabel("steps / s (5-step mean)")
    ax_rate.set_ylim(bottom=0)
    ax_rate.set_xlabel("wall time since the first process started (s)")
    if labelled or steps:
        ax_slices.legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    out = run_dir / rundir.TIMELINE_FILE
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
