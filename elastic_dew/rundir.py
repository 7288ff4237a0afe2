"""The run directory: its layout, its identity and the fault log.

This module is the one home of every file format a run directory holds, except the event
lines themselves (their schema is :mod:`elastic_dew.elastic.events`, their writer the run
record). Everything that reads or writes a run directory (the run, the trainer, the run
record, the simulator, the chaos harness, the benchmarks, the tests) goes through here.

::

    RUN_DIR/
      command.json      the run's identity (recipe, overrides, seed, batch, fault schedule)
      events.jsonl      the run record (append-only, see elastic_dew.record)
      faults.jsonl      the simulator's fired faults (append-only, fsynced before firing)
      summary.json      written at the end of each process
      final_params.npz  the final parameters
      timeline.png      the run's timeline picture
      checkpoints/      tier 2: Orbax steps (the elastic layer's default checkpoint directory)
      tensorboard/      TensorBoard event files, one per process (elastic_dew.observe)
      abandoned_checkpoints.json  steps whose save was given up on: never restored (orbax_step)
      storage.log       the storage libraries' errors, with their tracebacks

What is inside ``checkpoints/`` and when a step there is committed are the persistent tier's
(:mod:`elastic_dew.elastic.state.orbax_step`): the run directory lies above the elastic layer
and takes its names from it, never the other way round.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from elastic_dew.elastic.config import CHECKPOINTS_DIR
from elastic_dew.elastic.events import Fault, from_json
from elastic_dew.elastic.state import orbax_step

__all__ = [
    "COMMAND_FILE",
    "EVENTS_FILE",
    "FAULTS_FILE",
    "WATCH_FILE",
    "SUMMARY_FILE",
    "PARAMS_FILE",
    "TIMELINE_FILE",
    "CHECKPOINTS_DIR",
    "TENSORBOARD_DIR",
    "REPLICATOR_DIR",
    "RUN_LOG_FILE",
    "ABANDONED_FILE",
    "STORAGE_LOG",
    "ENTRIES",
    "IDENTITY_KEYS",
    "RunDirError",
    "check",
    "read_identity",
    "write_identity",
    "FaultLog",
    "read_faults",
    "fsync_append",
    "read_records",
    "atomic_write",
]

logger = logging.getLogger(__name__)

COMMAND_FILE = "command.json"
#: The run record: one event a line, append-only (:mod:`elastic_dew.record`).
EVENTS_FILE = "events.jsonl"
#: The simulator's fired faults, each appended and fsynced before it fires.
FAULTS_FILE = "faults.jsonl"
#: What a simulated program's processes did with their state (the simulator's watch, one
#: JSON record a line, :mod:`elastic_dew.simulate.watch`), read by its diagnosis.
WATCH_FILE = "watch.jsonl"
#: The summary each process writes at its end.
SUMMARY_FILE = "summary.json"
#: The final parameters (numpy arrays, no pickles).
PARAMS_FILE = "final_params.npz"
#: The run's timeline picture (the ``plot`` extra).
TIMELINE_FILE = "timeline.png"
#: TensorBoard event files (:mod:`elastic_dew.observe.tensorboard`), one per process.
TENSORBOARD_DIR = "tensorboard"
#: On a terminal, the run's routine log lines (:class:`elastic_dew.observe.logs.RunLog`).
RUN_LOG_FILE = "run.log"
#: A simulated multi-tier run's replicator stand-in (:mod:`elastic_dew.simulate.replicator`):
#: ``local/`` (the checkpoint directory), ``replicas/``, ``backup/``.
REPLICATOR_DIR = "replicator"
#: The steps whose checkpoint save was given up on (:mod:`elastic_dew.elastic.state.orbax_step`).
ABANDONED_FILE = orbax_step.ABANDONED_FILE
#: The storage libraries' error records, with their tracebacks (:mod:`elastic_dew.elastic.state.storage`).
STORAGE_LOG = "storage.log"

#: Everything a run directory may hold (``*.tmp`` are atomic writes in progress).
ENTRIES = frozenset({
    COMMAND_FILE, EVENTS_FILE, FAULTS_FILE, WATCH_FILE, SUMMARY_FILE, PARAMS_FILE, TIMELINE_FILE,
    CHECKPOINTS_DIR, SUMMARY_FILE + ".tmp", PARAMS_FILE + ".tmp", TENSORBOARD_DIR, REPLICATOR_DIR, RUN_LOG_FILE,
    ABANDONED_FILE, ABANDONED_FILE + ".tmp", STORAGE_LOG,
})

#: The keys of ``command.json`` that must match for a run directory to be resumed.
IDENTITY_KEYS = ("recipe", "overrides", "seed", "global_batch", "schedule")



class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message says why and what to do."""


# ----------------------------------------------------------------------------- identity


def _writable_ancestor(path: Path) -> Path:
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent


def check(
    run_dir: str | os.PathLike[str], identity: Mapping[str, Any] | None = None, *, option: str | None = None
) -> None:
    """Refuse a run directory that cannot hold this run, before anything is written.

    A new directory must be creatable under a writable directory. An existing one must be
    a directory, empty or an elastic_dew run (it holds ``command.json`` or ``events.jsonl``,
    or only run-directory entries); with ``identity``, the run recorded in its
    ``command.json`` must be this one on every key of :data:`IDENTITY_KEYS` it records.
    ``option`` is how the caller's user gives the directory (``"run_dir= or name="``):
    the fixes then name it.
    """
    run_dir = Path(run_dir)
    choose = f"choose a {option}" if option else "choose a run directory"
    if not run_dir.exists():
        parent = _writable_ancestor(run_dir.parent)
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            why = f"{parent} is {'not writable' if parent.is_dir() else 'not a directory'}"
            raise RunDirError(
                f"run directory {run_dir} cannot be created{f' ({why})' if option else f': {why}'}; "
                f"{choose} under a writable directory"
            )
        return
    if not run_dir.is_dir():
        raise RunDirError(
            f"run directory {run_dir} exists and is not a directory; "
            f"{f'choose another {option}' if option else 'choose another path'}"
        )
    entries = {entry.name for entry in run_dir.iterdir()}
    if entries and not ({COMMAND_FILE, EVENTS_FILE} & entries) and not entries <= ENTRIES:
        foreign = sorted(entries - ENTRIES)
        raise RunDirError(
            f"run directory {run_dir} is not an elastic_dew run (no {EVENTS_FILE}, and it holds "
            f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
            "give a new or empty directory, or the directory of an earlier run to resume it"
        )
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise RunDirError(
            f"run directory {run_dir} is not writable; {choose} under a writable directory"
        )
    if identity is None:
        return
    recorded = read_identity(run_dir)
    if recorded is None:
        return
    differences = [
        f"{key} {recorded.get(key)!r} -> {identity.get(key)!r}"
        for key in IDENTITY_KEYS
        if key in recorded and key in identity and recorded[key] != identity[key]
    ]
    if differences:
        raise RunDirError(
            f"{run_dir} holds another run ({'; '.join(differences)}); resume it with its own "
            f"settings, or start a new run with another {option or 'run directory'}"
        )


def read_identity(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run recorded in ``command.json``, or ``None`` when there is none."""
    path = Path(run_dir) / COMMAND_FILE
    if not path.exists():
        return None
    try:
        recorded = json.loads(path.read_text())
    except ValueError as err:
        raise RunDirError(f"{path} is not valid JSON ({err}); is {path.parent} a run directory?") from None
    if not isinstance(recorded, dict):
        raise RunDirError(f"{path} does not hold a JSON object; is {path.parent} a run directory?")
    return recorded


def write_identity(run_dir: str | os.PathLike[str], identity: Mapping[str, Any]) -> None:
    """Write ``command.json`` once: the first process of a run records it, later ones keep it."""
    run_dir = Path(run_dir)
    path = run_dir / COMMAND_FILE
    if path.exists():
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write((json.dumps(dict(identity), indent=2) + "\n").encode()))


def atomic_write(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write ``path`` whole or not at all: ``write(file)`` fills ``PATH.tmp``, fsynced, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON-lines records of ``path`` (the simulator's watch and attempts files), in order;
    none when it does not exist. A line that does not parse is a write cut short by a kill,
    and is skipped.

    Args:
        path: the file.

    Returns:
        Its records.
    """
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill
    return out


# ----------------------------------------------------------------------------- fault log


def fsync_append(path: Path, line: str) -> None:
    """Append one line, flushed and fsynced (and the directory too when the file is new)."""
    created = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()
        os.fsync(f.fileno())
    if created:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class FaultLog:
    """``faults.jsonl``: the simulator's durable record of the faults it fired.

    Each line is a fired fault's ``fault`` event (:class:`~elastic_dew.elastic.events.Fault`,
    serialised by its ``to_json``, as the run record serialises it), appended (flushed and
    fsynced) *before* the fault fires, so a process killed by its own fault, or preempted
    and re-run, never fires it twice. A process that ends its simulation normally with
    faults still unfired appends one such line with ``"never_fired": true`` for each (its
    ``step``: the last step it saw, -1 for none). A torn last line is a write cut short by
    a kill (the fault did not fire); any other bad line is refused.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _read(self) -> list[tuple[Fault, bool]]:
        if not self.path.exists():
            return []
        out = []
        lines = self.path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                never_fired = raw.pop("never_fired", False) is True
                fault = from_json(raw)
                if not isinstance(fault, Fault) or fault.index is None:
                    raise ValueError("not a fault")
            except (ValueError, KeyError, TypeError, AttributeError):
                if number == len(lines):
                    logger.warning("ignoring a torn last line of fault log %s", self.path)
                    continue
                raise ValueError(f"fault log {self.path} line {number} is not a fault record: {line!r}") from None
            out.append((fault, never_fired))
        return out

    def entries(self) -> list[Fault]:
        """The fired faults, in the order they fired."""
        return [fault for fault, never_fired in self._read() if not never_fired]

    def never_fired(self) -> list[Fault]:
        """The faults a process recorded as never fired when it exited (``step``: the last
        step it saw, -1 for none); a later process of the run may still fire them."""
        return [fault for fault, never_fired in self._read() if never_fired]

    def fired(self, schedule: Iterable[str]) -> dict[int, Fault]:
        """What of ``schedule`` (its faults' texts, in order) already fired: each fired
        index's record (its ``wall``: when it fired), read in one pass over the log.

        A record of a fault that is not in the schedule means the log belongs to another
        run, and is refused (``ValueError``).
        """
        texts = [str(f) for f in schedule]
        fired: dict[int, Fault] = {}
        for fault in self.entries():
            assert fault.index is not None  # every line read has its index (_read)
            if fault.index >= len(texts) or texts[fault.index] != fault.scheduled:
                raise ValueError(
                    f"fault log {self.path} records fault #{fault.index} {fault.scheduled!r}, which is "
                    f"not in schedule {','.join(texts)!r}; it belongs to another run: use a fresh "
                    "fault_log for a new schedule"
                )
            fired[fault.index] = fault
        return fired

    def append(self, fault: Fault) -> None:
        """Record ``fault`` (with its schedule ``index``) as fired; durable before this returns."""
        self._write(fault, {})

    def append_never_fired(self, fault: Fault) -> None:
        """Record, as a process exits, that ``fault`` never fired: its line with
        ``"never_fired": true``, which :meth:`entries` and :meth:`fired` leave out and
        :meth:`never_fired` returns."""
        self._write(fault, {"never_fired": True})

    def _write(self, fault: Fault, flags: Mapping[str, Any]) -> None:
        if fault.index is None:
            raise ValueError(f"a fault log line needs the fault's schedule index: {fault!r}")
        fsync_append(self.path, json.dumps({**fault.to_json(), **flags}))


def read_faults(run_dir: str | os.PathLike[str]) -> list[Fault]:
    """The faults fired in ``run_dir``, in the order they fired (none without a fault log).

    Args:
        run_dir: the run directory.

    Returns:
        The fired faults' ``fault`` events.

    Raises:
        ValueError: a line of the fault log that is not a fault record (other than a torn last
            line, which is skipped).
    """
    return FaultLog(Path(run_dir) / FAULTS_FILE).entries()
