"""The run record: ``events.jsonl``, ``summary.json``, ``final_params.npz`` and ``timeline.png``.

Other tools read these files, so their keys are a contract (see ``docs/trainer.md``).

``events.jsonl`` is append-only, one JSON object per line, flushed after every line and
fsynced after the lines a restarted process depends on (start, save, stop, resume, fault).
A process killed with SIGKILL can leave a torn last line; the next writer starts on a fresh
line and readers skip the torn one, so no earlier line is ever lost.

A step line is *committed* if and only if no later ``resume`` line has a ``step`` at or
below its own: a resume at step R means the run went back to R and re-did every step from
there, so the earlier lines for those steps describe work that was thrown away.

The summary splits the run's wall time (the sum of every process's span) into productive
step time and badput, under the lower-case names of ml-goodput-measurement's
``BadputType``; ``other`` is the remainder, so productive time and the categories add up to
the wall time exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BADPUT_CATEGORIES",
    "EVENTS_FILE",
    "SUMMARY_FILE",
    "PARAMS_FILE",
    "TIMELINE_FILE",
    "FAULTS_FILE",
    "RunRecord",
    "read_events",
    "read_faults",
    "run_events",
    "committed_steps",
    "summarize",
    "flatten_params",
    "state_digest",
    "write_summary",
    "load_params",
    "load_summary",
    "draw_timeline",
    "process_start_time",
]

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"
PARAMS_FILE = "final_params.npz"
TIMELINE_FILE = "timeline.png"
#: The simulator's durable record of the faults it fired (``SimulatedSlices(fault_log=...)``).
FAULTS_FILE = "faults.jsonl"

#: ml-goodput-measurement's ``BadputType`` names, lower-cased, in the order the summary lists them.
BADPUT_CATEGORIES: tuple[str, ...] = (
    "program_startup",
    "unproductive_checkpoint_save_time",
    "unproductive_checkpoint_restore_time",
    "elastic_slice_down",
    "elastic_scale_up",
    "elastic_reinitialization",
    "wasted_progress_from_disruption",
    "data_loading_sync",
    "other",
)

#: Events a restarted process relies on; they reach the disk before ``append`` returns.
_DURABLE_EVENTS = frozenset({"start", "save", "stop", "resume", "fault"})

_DURATION_KEYS = ("detection", "wait_for_slices", "mesh_and_compile", "restore")


class RunRecord:
    """Append-only writer (and reader) of a run directory's ``events.jsonl``.

    Creating one creates ``run_dir``. Appends are serialised by a lock, so threads (an
    asynchronous save reporting its duration, say) can share one record.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / EVENTS_FILE
        self._lock = threading.Lock()
        self._file = open(self.path, "a+b")  # noqa: SIM115 - held for the record's life
        self._repair_torn_tail()

    def _repair_torn_tail(self) -> None:
        """Start on a fresh line when the previous writer died mid-line."""
        self._file.seek(0, os.SEEK_END)
        if self._file.tell() == 0:
            return
        self._file.seek(-1, os.SEEK_END)
        if self._file.read(1) != b"\n":
            log.warning("%s ends in a torn line (a killed writer); it will be ignored", self.path)
            self._file.write(b"\n")
            self._file.flush()
            os.fsync(self._file.fileno())

    def append(self, event: Mapping[str, Any]) -> None:
        """Write ``event`` as one JSON line; flushed always, fsynced for durable events."""
        if "event" not in event:
            raise ValueError(f"a run-record event needs an 'event' key; got keys {sorted(event)}")
        line = (json.dumps(dict(event), separators=(",", ":"), default=_json_default) + "\n").encode()
        with self._lock:
            if self._file.closed:
                raise ValueError(f"the run record {self.path} is closed")
            self._file.write(line)
            self._file.flush()
            if event["event"] in _DURABLE_EVENTS:
                os.fsync(self._file.fileno())

    def events(self) -> list[dict[str, Any]]:
        """Every complete event written so far, by any process, in file order."""
        return read_events(self.path)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()

    def __enter__(self) -> RunRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_default(value: Any) -> Any:
    """Numbers from numpy or JAX (a loss read off a device) become plain JSON numbers."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"run-record events hold JSON values; got {type(value).__name__}: {value!r}")


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Parse an ``events.jsonl`` file (or the one in a run directory).

    A line that is not a complete JSON object is a torn write from a killed process; it is
    skipped with a warning and every other line is kept.
    """
    path = Path(path)
    if path.is_dir():
        path = path / EVENTS_FILE
    events = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                event = json.loads(raw)
            except ValueError:
                log.warning("%s:%d is a torn line (a killed writer); skipping it", path, number)
                continue
            if isinstance(event, dict) and "event" in event:
                events.append(event)
            else:
                log.warning("%s:%d is not a run-record event; skipping it", path, number)
    return events


_FAULT_TEXT = re.compile(r"^(?P<action>[a-z_]+)(?::(?P<slice>\d+))?@(?P<at>\d+)(?:/(?P<phase>[a-z_]+))?$")


def read_faults(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The simulator's fired faults in ``run_dir/faults.jsonl``, as ``fault`` events.

    Each becomes ``{"event": "fault", "action", "slice", "step", "phase", "wall",
    "scheduled"}``, where ``step`` is the step whose phase fired it and ``scheduled`` the
    schedule token. No file (a run without the simulator) is no faults.
    """
    path = Path(run_dir) / FAULTS_FILE
    if not path.exists():
        return []
    faults = []
    for entry in _read_json_lines(path):
        match = _FAULT_TEXT.match(str(entry.get("fault", "")))
        if match is None or "time" not in entry:
            continue
        faults.append({
            "event": "fault",
            "action": match["action"],
            "slice": int(match["slice"]) if match["slice"] is not None else None,
            "step": entry.get("step", int(match["at"])),
            "phase": entry.get("phase", match["phase"] or "step"),
            "wall": float(entry["time"]),
            "scheduled": entry["fault"],
        })
    return faults


def _read_json_lines(path: Path) -> list[dict[str, Any]]:
    """JSON objects of a JSON-lines file, skipping torn lines."""
    out = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                value = json.loads(raw)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


def run_events(
    run_dir: str | os.PathLike[str], events: Iterable[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The run's events (``events.jsonl`` unless given) with the simulator's faults added.

    Each fault is inserted before the first event written after it fired; the order of the
    run record's own lines is never changed (the commit rule depends on it). Faults the
    events already hold are not added twice.
    """
    events = [dict(e) for e in (read_events(run_dir) if events is None else events)]
    have = {
        (e.get("action"), e.get("slice"), e.get("step"), e.get("phase"))
        for e in events
        if e.get("event") == "fault"
    }
    for fault in read_faults(run_dir):
        if (fault["action"], fault["slice"], fault["step"], fault["phase"]) in have:
            continue
        position = next(
            (i for i, e in enumerate(events) if e.get("wall", float("-inf")) > fault["wall"]),
            len(events),
        )
        events.insert(position, fault)
    return events


def process_start_time() -> float:
    """When this process started (seconds since the epoch), for a ``start`` event.

    Program start-up badput runs from here to the first resume, so it includes the
    interpreter and the imports. Read from ``/proc/self/stat`` on Linux (psutil where
    installed); elsewhere the current time, which leaves the imports unmeasured.
    """
    try:
        import psutil

        return float(psutil.Process(os.getpid()).create_time())
    except Exception:  # psutil missing: read /proc directly
        pass
    try:
        with open("/proc/self/stat", "rb") as f:
            # Field 22 (starttime, in clock ticks since boot) follows the ")" of the name.
            fields = f.read().rsplit(b")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - started_after_boot)
    except (OSError, ValueError, IndexError):
        return time.time()


def _committed_flags(events: list[Mapping[str, Any]]) -> list[bool]:
    """For each event, whether it is a committed step line (see :func:`committed_steps`)."""
    flags = [False] * len(events)
    lowest_later_resume = float("inf")
    for i in range(len(events) - 1, -1, -1):
        kind = events[i].get("event")
        if kind == "resume":
            lowest_later_resume = min(lowest_later_resume, events[i]["step"])
        elif kind == "step":
            flags[i] = events[i]["step"] < lowest_later_resume
    return flags


def committed_steps(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The step lines that count: those with no later ``resume`` at or below their step.

    Returned in file order, so after a rollback the re-done steps come last.
    """
    events = list(events)
    return [dict(e) for e, ok in zip(events, _committed_flags(events), strict=True) if ok]


def _processes(events: list[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Split the record into the runs of one process each, at every ``start`` line."""
    processes: list[list[Mapping[str, Any]]] = []
    for event in events:
        if event.get("event") == "start" or not processes:
            processes.append([])
        processes[-1].append(event)
    return processes


def _span(process: list[Mapping[str, Any]]) -> float:
    """Seconds from the process's start (or first event) to its last event."""
    walls = [e["wall"] for e in process if "wall" in e]
    if not walls:
        return 0.0
    first = process[0]
    begin = first.get("process_start", first.get("wall")) if first.get("event") == "start" else None
    if begin is None:
        begin = min(walls)
    return max(0.0, max(walls) - begin)


def _durations(resume: Mapping[str, Any]) -> dict[str, float]:
    given = resume.get("durations") or {}
    return {k: float(given.get(k, 0.0) or 0.0) for k in _DURATION_KEYS}


def summarize(events: Iterable[Mapping[str, Any]], *, params: Any = None) -> dict[str, Any]:
    """The ``summary.json`` fields of a run, from its events (and final parameters).

    ``final_step``: the highest committed step (``None`` before any step).
    ``state_digest``: :func:`state_digest` of ``params`` (``None`` without them).
    ``examples_consumed``: the end of the committed example ranges; with exactly-once data
    they tile ``[0, examples_consumed)``.
    ``goodput``: productive step time (the ``seconds`` of committed steps less their
    ``data_seconds``) over wall time.
    ``badput``: seconds by category:

    - ``program_startup``: each process's start to its first resume, less that resume's
      own durations (counted below), plus the time a ``fresh`` resume took to build the
      initial state;
    - ``unproductive_checkpoint_save_time``: the ``seconds`` of ``save`` events (both tiers);
    - ``unproductive_checkpoint_restore_time``: ``durations.restore`` of snapshot and
      checkpoint resumes;
    - ``elastic_slice_down``: ``detection`` and ``wait_for_slices`` of resumes that follow
      a ``slice_lost`` stop;
    - ``elastic_scale_up``: every duration of ``live`` resumes;
    - ``elastic_reinitialization``: ``mesh_and_compile`` of snapshot, checkpoint and fresh
      resumes;
    - ``wasted_progress_from_disruption``: the ``seconds`` of step lines that were not
      committed;
    - ``data_loading_sync``: the ``data_seconds`` of committed steps;
    - ``other``: the remainder, so that productive time and badput add up to the wall time.
    """
    events = [dict(e) for e in events]
    flags = _committed_flags(events)
    for event, ok in zip(events, flags, strict=True):
        event["_committed"] = ok
    committed = [e for e in events if e["_committed"]]

    badput = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    productive = 0.0
    wall = 0.0
    counts: dict[str, dict[str, int]] = {"stops": {}, "resumes": {}, "faults": {}}

    for process in _processes(events):
        wall += _span(process)
        start = process[0] if process[0].get("event") == "start" else None
        last_stop: Mapping[str, Any] | None = None
        first_resume_seen = False
        for event in process:
            kind = event.get("event")
            if kind == "save":
                badput["unproductive_checkpoint_save_time"] += float(event.get("seconds", 0.0))
            elif kind == "stop":
                last_stop = event
                reason = str(event.get("reason"))
                counts["stops"][reason] = counts["stops"].get(reason, 0) + 1
            elif kind == "fault":
                action = str(event.get("action"))
                counts["faults"][action] = counts["faults"].get(action, 0) + 1
            elif kind == "resume":
                source = str(event.get("source"))
                counts["resumes"][source] = counts["resumes"].get(source, 0) + 1
                d = _durations(event)
                if source == "live":
                    badput["elastic_scale_up"] += sum(d.values())
                else:
                    if source == "fresh":  # building a fresh state is part of starting up
                        badput["program_startup"] += d["restore"]
                    else:
                        badput["unproductive_checkpoint_restore_time"] += d["restore"]
                    badput["elastic_reinitialization"] += d["mesh_and_compile"]
                    if last_stop is not None and last_stop.get("reason") == "slice_lost":
                        badput["elastic_slice_down"] += d["detection"] + d["wait_for_slices"]
                if not first_resume_seen and start is not None:
                    first_resume_seen = True
                    begin = start.get("process_start", start.get("wall"))
                    if begin is not None and "wall" in event:
                        # The resume's own durations are counted in their own categories.
                        startup = event["wall"] - begin - sum(d.values())
                        badput["program_startup"] += max(0.0, startup)
                last_stop = None
            elif kind == "step":
                # A step's ``seconds`` span all of it, its ``data_seconds`` (waiting for the
                # batch) included.
                seconds = float(event.get("seconds", 0.0))
                data = min(float(event.get("data_seconds", 0.0)), seconds)
                if event["_committed"]:
                    productive += seconds - data
                    badput["data_loading_sync"] += data
                else:
                    badput["wasted_progress_from_disruption"] += seconds

    accounted = productive + sum(v for k, v in badput.items() if k != "other")
    badput["other"] = wall - accounted
    if -1e-6 < badput["other"] < 0:
        badput["other"] = 0.0

    ranges = [e["examples"] for e in committed if e.get("examples") is not None]
    summary: dict[str, Any] = {
        "final_step": max((e["step"] for e in committed), default=None),
        "state_digest": state_digest(params) if params is not None else None,
        "examples_consumed": max((int(r[1]) for r in ranges), default=0),
        "goodput": productive / wall if wall > 0 else 0.0,
        "badput": {k: round(v, 6) for k, v in badput.items()},
        "wall_seconds": round(wall, 6),
        "productive_seconds": round(productive, 6),
        "committed_steps": len(committed),
        "processes": len(_processes(events)) if events else 0,
        "stops": counts["stops"],
        "resumes": counts["resumes"],
        "faults": counts["faults"],
    }
    return summary


def _path_part(entry: Any) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def flatten_params(params: Any) -> dict[str, np.ndarray]:
    """A parameter pytree as ``{"path/to/leaf": numpy array}``, sorted by path.

    A flat mapping of such paths (what :func:`load_params` returns) flattens to itself, so a
    digest of saved parameters equals the digest of the live ones.
    """
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    flat: dict[str, np.ndarray] = {}
    for path, leaf in leaves:
        name = "/".join(_path_part(p) for p in path) or "value"
        if name in flat:
            raise ValueError(f"two parameters flatten to the same path {name!r}; rename one")
        flat[name] = np.asarray(jax.device_get(leaf))
    return dict(sorted(flat.items()))


def state_digest(params: Any) -> str:
    """SHA-256 over the parameters' paths, dtypes, shapes and bytes, in sorted path order.

    Equal digests mean bitwise-equal parameters; for runs whose meshes differed compare
    ``final_params.npz`` with ``allclose`` instead.
    """
    digest = hashlib.sha256()
    for name, array in flatten_params(params).items():
        array = np.ascontiguousarray(array)
        header = f"{name}\0{array.dtype.str}\0{array.shape}\0".encode()
        digest.update(len(header).to_bytes(8, "little"))
        digest.update(header)
        digest.update(array.tobytes())
    return digest.hexdigest()


def write_summary(
    run_dir: str | os.PathLike[str],
    events: Iterable[Mapping[str, Any]] | None = None,
    params: Any = None,
) -> dict[str, Any]:
    """Write ``summary.json`` (and ``final_params.npz`` when ``params`` are given).

    ``events`` defaults to the run directory's own ``events.jsonl``; the simulator's fired
    faults (``faults.jsonl``) are added to them. Returns the summary.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    events = run_events(run_dir, events)
    flat = flatten_params(params) if params is not None else None
    summary = summarize(events, params=flat)
    if flat is not None:
        _atomic_write(run_dir / PARAMS_FILE, lambda f: np.savez(f, **flat))
    _atomic_write(
        run_dir / SUMMARY_FILE,
        lambda f: f.write((json.dumps(summary, indent=2, sort_keys=False) + "\n").encode()),
    )
    return summary


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_params(run_dir: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The final parameters of a finished run, as written by :func:`write_summary`."""
    path = Path(run_dir) / PARAMS_FILE
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in sorted(data.files)}
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        # allow_pickle=False: a file that would need unpickling is refused, never run.
        why = (
            "it holds pickled (object) data, which elastic_dew never writes and never loads"
            if "pickle" in str(error) else str(error)
        )
        raise ValueError(
            f"{path} is not a parameters file elastic_dew wrote ({why}); delete it and run the "
            "run's train command again, which rewrites it from the final checkpoint"
        ) from error


def load_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``summary.json`` of a finished run."""
    return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())


def _attempt_segments(events: list[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Runs of consecutive step lines, split at every start, stop and resume."""
    segments: list[list[Mapping[str, Any]]] = [[]]
    for event in events:
        kind = event.get("event")
        if kind == "step":
            segments[-1].append(event)
        elif kind in ("start", "stop", "resume") and segments[-1]:
            segments.append([])
    return [s for s in segments if s]


def draw_timeline(run_dir: str | os.PathLike[str]) -> Path:
    """Draw ``timeline.png``: active slices, step rate and stop/resume events over wall time.

    Needs matplotlib (the ``plot`` extra); without it, a ``RuntimeError`` says how to install it.
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
    events = run_events(run_dir)
    walls = [e["wall"] for e in events if "wall" in e]
    starts = [e.get("process_start", e.get("wall")) for e in events if e.get("event") == "start"]
    t0 = min([*walls, *[s for s in starts if s is not None]], default=0.0)
    flags = _committed_flags(events)
    steps = [e for e in events if e.get("event") == "step"]
    wasted_steps = [e for e, ok in zip(events, flags, strict=True) if e.get("event") == "step" and not ok]

    fig, (ax_slices, ax_rate) = plt.subplots(2, 1, sharex=True, figsize=(10, 5.5))
    fig.suptitle(f"{run_dir.name}: active slices, step rate and stop/resume events")

    if steps:
        # One line per attempt: a stop, resume or process start breaks it, so neither the
        # slice count nor the step rate is drawn across a gap.
        for segment in _attempt_segments(events):
            t = [e["wall"] - t0 for e in segment]
            ax_slices.step(t, [e.get("slices", 0) for e in segment], where="post", color="tab:blue")
            window = 5
            rt = t[window:]
            rate = [
                window / (segment[i]["wall"] - segment[i - window]["wall"])
                if segment[i]["wall"] > segment[i - window]["wall"] else float("nan")
                for i in range(window, len(segment))
            ]
            if rt:
                ax_rate.plot(rt, rate, color="tab:green", linewidth=1)
        wasted = [e["wall"] - t0 for e in wasted_steps]
        if wasted:
            ax_slices.scatter(
                wasted, [0] * len(wasted), marker="|", color="tab:red", label="re-done steps"
            )
    styles = {
        "stop": ("tab:red", "--"),
        "resume": ("tab:green", ":"),
        "fault": ("black", "-"),
    }
    labelled = set()
    span = max(walls, default=t0) - t0 or 1.0
    group_x, in_group = None, 0
    for event in events:
        kind = event.get("event")
        if kind not in styles or "wall" not in event:
            continue
        color, style = styles[kind]
        x = event["wall"] - t0
        # Events close together get their labels side by side instead of on top of each other.
        if group_x is not None and x - group_x < 0.02 * span:
            in_group += 1
        else:
            group_x, in_group = x, 0
        detail = event.get("reason") or event.get("source") or event.get("action") or ""
        for ax in (ax_slices, ax_rate):
            ax.axvline(x, color=color, linestyle=style, linewidth=1, alpha=0.7,
                       label=kind if (ax is ax_slices and kind not in labelled) else None)
        labelled.add(kind)
        ax_slices.annotate(
            f"{kind} {detail} @{event.get('step')}",
            (x, 1.0), xycoords=("data", "axes fraction"), rotation=90,
            xytext=(8 * in_group, 0), textcoords="offset points",
            fontsize=7, va="top", ha="right",
        )
    for s in starts:
        if s is not None:
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
    out = run_dir / TIMELINE_FILE
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def format_summary(summary: Mapping[str, Any], run_dir: str | Path | None = None) -> str:
    """The summary as a plain-text table: the run's outcome, then badput by category."""
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
