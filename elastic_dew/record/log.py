"""``events.jsonl``: the run record's writer and readers.

The file is append-only, one JSON object per line. The lines a restarted process depends
on (start, a checkpoint's save, stop, resume, fault) are durable: each is written, with every
line before it, flushed and fsynced before ``append`` returns. The other lines (a step, an
evaluation, a snapshot's save, which does not outlive the process) are written in batches: at the next durable line, once the oldest waiting line is
:data:`BATCH_SECONDS` old, and at ``close``; so a step costs the loop no system call. A
process killed with SIGKILL therefore keeps every line up to its last durable one (its
last checkpoint save, stop or resume) and may lose the step and snapshot save lines after
it, which are never committed (a restart resumes at or before that checkpoint), and can leave a torn last line; the
next writer starts on a fresh line and readers skip the torn one, so no durable line, and
no line before one, is ever lost.

The lines' schema is :mod:`elastic_dew.elastic.events`; :func:`as_events` turns lines (or
hand-written mappings, or typed events) into those typed events for the readers of the
record. A fault the simulator fires joins the run's event stream as it fires, so the record
holds it; the simulator's own fault log is read through :mod:`elastic_dew.rundir`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from elastic_dew import rundir
from elastic_dew.elastic import events as ev

__all__ = [
    "RunRecord",
    "BATCH_SECONDS",
    "read_events",
    "as_event",
    "as_events",
    "has_wall",
    "process_start_time",
]

log = logging.getLogger(__name__)

#: Events a restarted process relies on; they reach the disk, with every line before them,
#: before ``append`` returns (a ``save`` only of tier 2: a snapshot dies with its process).
_DURABLE_EVENTS = frozenset({"start", "save", "stop", "resume", "fault"})

#: The longest a written line waits in memory before it is handed to the OS (at the next
#: ``append``): a reader of a live run (``elastic-dew report``) sees its steps this late.
BATCH_SECONDS = 1.0

#: What a field left out of a hand-written or older line reads as. Fields not listed here
#: (a step's ``step``, a stop's ``reason``, ...) are required: a line without them is skipped.
_MISSING = {
    "pid": 0,
    "slices": 0,
    "loss": None,
    "examples": None,
    "seconds": 0.0,
    "data_seconds": 0.0,
    "taken": True,
    "tier": "",
    "slice": None,
    "phase": "step",
    "scheduled": "",
}


class RunRecord:
    """Append-only writer (and reader) of a run directory's ``events.jsonl``.

    Creating one creates ``run_dir``. Appends are serialised by a lock, so threads (an
    asynchronous save reporting its duration, say) can share one record. It is a sink of
    the run's event stream: calling it with an event appends it. Lines that are not
    durable wait in memory (the module's rule); :meth:`events` and :meth:`close` write them.

    Args:
        run_dir: the run directory (created when missing).
    """

    name = "run record"

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / rundir.EVENTS_FILE
        self._lock = threading.Lock()
        self._file = open(self.path, "a+b")  # noqa: SIM115 - held for the record's life
        self._waiting: list[bytes] = []  # encoded lines not yet written
        self._oldest = 0.0  # when the first of them was appended (time.monotonic())
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

    def append(self, event: ev.Event | Mapping[str, Any]) -> None:
        """Write ``event`` (typed, or its JSON mapping) as one JSON line.

        A durable kind is on disk (fsynced, after every line before it) when this returns;
        any other waits to be written with the next batch.

        Args:
            event: a typed event, or its JSON mapping (with its ``"event"`` kind).

        Raises:
            ValueError: a line without a kind; nothing is written.
            TypeError: a value JSON cannot hold; nothing is written.
        """
        line = ev.to_json(event)
        if "event" not in line:
            raise ValueError(
                f"a run-record event needs an 'event' key (or pass an elastic_dew.elastic.events "
                f"event); got keys {sorted(line)}"
            )
        data = (json.dumps(line, separators=(",", ":"), default=_json_default) + "\n").encode()
        with self._lock:
            if self._file.closed:
                raise ValueError(f"the run record {self.path} is closed")
            if not self._waiting:
                self._oldest = time.monotonic()
            self._waiting.append(data)
            if line["event"] in _DURABLE_EVENTS and not (line["event"] == "save" and line.get("tier") == "snapshot"):
                self._write_waiting()
                os.fsync(self._file.fileno())
            elif time.monotonic() - self._oldest >= BATCH_SECONDS:
                self._write_waiting()

    def _write_waiting(self) -> None:
        """Write and flush the lines waiting in memory (the caller holds the lock)."""
        if self._waiting:
            self._file.write(b"".join(self._waiting))
            self._waiting.clear()
        self._file.flush()

    def __call__(self, event: ev.Event) -> None:
        """The record as a sink: append ``event``."""
        self.append(event)

    def events(self) -> list[dict[str, Any]]:
        """Every complete event appended so far, by any process, in file order (this
        record's waiting lines are written first).

        Returns:
            The JSON lines.
        """
        with self._lock:
            if not self._file.closed:
                self._write_waiting()
        return read_events(self.path)

    def close(self, summary: object = None) -> None:
        """Write the waiting lines, fsync and close (``summary``: as every sink's ``close``
        takes it).

        Args:
            summary: ignored (every sink's ``close`` takes it).
        """
        with self._lock:
            if not self._file.closed:
                self._write_waiting()
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
    """Parse an ``events.jsonl`` file (or the one in a run directory) into its JSON lines.

    A line that is not a complete JSON object is a torn write from a killed process; it is
    skipped with a warning and every other line is kept. :func:`as_events` types them.

    Args:
        path: an ``events.jsonl`` file or a run directory.

    Returns:
        The JSON lines, in file order.

    Raises:
        FileNotFoundError: there is no such file.
    """
    path = Path(path)
    if path.is_dir():
        path = path / rundir.EVENTS_FILE
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                log.warning("%s:%d is a torn line (a killed writer); skipping it", path, number)
                continue
            if isinstance(line, dict) and "event" in line:
                lines.append(line)
            else:
                log.warning("%s:%d is not a run-record event; skipping it", path, number)
    return lines


def as_event(line: ev.Event | Mapping[str, Any]) -> ev.Event | None:
    """The typed event of one line; ``None`` for a kind this version does not know.

    Fields a line leaves out read as in ``_MISSING`` (a hand-written line, or one from an
    older writer); a line without ``wall`` gets ``nan`` there (see :func:`has_wall`), never
    the current time. A line missing a required field is refused with ``ValueError``.

    Args:
        line: a typed event or a JSON line.

    Returns:
        The typed event, or ``None``.

    Raises:
        ValueError: the line lacks a required field.
    """
    if isinstance(line, ev.Event):
        return line
    cls = ev.KINDS.get(line.get("event"))  # type: ignore[arg-type]
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    filled = {k: v for k, v in _MISSING.items() if k in names and k not in line}
    if "wall" not in line:
        filled["wall"] = math.nan
    if cls is ev.Start and "process_start" not in line:
        filled["process_start"] = line.get("wall", math.nan)
    return ev.from_json({**line, **filled})


def as_events(lines: Iterable[ev.Event | Mapping[str, Any]]) -> list[ev.Event]:
    """:func:`as_event` of each line, leaving out kinds this version does not know.

    Args:
        lines: typed events or JSON lines.

    Returns:
        The typed events of the known kinds, in order.
    """
    return [e for e in map(as_event, lines) if e is not None]


def has_wall(event: ev.Event) -> bool:
    """Whether the event says when it happened (a hand-written line may not)."""
    return math.isfinite(event.wall)


def process_start_time() -> float:
    """When this process started (seconds since the epoch), for a ``start`` event.

    Program start-up badput runs from here to the first resume, so it includes the
    interpreter and the imports. Read from ``/proc/self/stat`` and ``/proc/uptime`` on Linux
    (to the clock tick); elsewhere from psutil where installed (whose Linux reading counts
    from the boot time rounded down to a whole second, so it is not preferred); else the
    current time, which leaves the imports unmeasured.

    Returns:
        Seconds since the epoch.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            # Field 22 (starttime, in clock ticks since boot) follows the ")" of the name.
            fields = f.read().rsplit(b")", 1)[1].split()
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - started_after_boot)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return float(psutil.Process(os.getpid()).create_time())
    except ImportError:
        return time.time()
