"""What the local Pathways backend sees of a program's state, written as the in-process watch's records.

The verdict's costs and problem rules (:mod:`elastic_dew.simulate.costs`,
:mod:`elastic_dew.simulate.problems`) read a run's records
(:class:`elastic_dew.simulate.run_records.Records`); in-process the watch writes them from the
program's calls (:mod:`elastic_dew.simulate.watch`). Through the proxy nothing runs in the
program's process, so :class:`StateRecords` writes the records the backend can tell from what
crosses the boundary (programs, arrays, their slices and memory kinds, the bytes read to and
sent from the host), in the same format and file (``watch.jsonl``), and the same functions
turn them into the same costs and problems:

* ``attempt`` and ``step``: each attempt the backend sees start, each counted step, with the
  state's *position* (how many steps its data went through since a fresh state): each array
  carries a :class:`Mark`; a step's results are one past the newest of its inputs, and every
  other program, copy, reshard, remap, assembly or part passes its inputs' newest on;
* ``save`` (``snapshot``): a step's state copied into pinned host memory (what Orbax's
  ``Snapshotter`` saves); ``landed`` before each resume: the newest such copy the backend
  still holds for the process (a process that made none has no ``snapshot`` tier);
* ``resume``: at an attempt's first step, where its state came from: ``snapshot`` (copied
  back from pinned host memory since the last step), ``checkpoint`` (sent from the host with
  the very bytes of a state the program read to the host earlier, in this process or an
  earlier one), ``live`` (a state carried over), ``nothing`` (a fresh one); a step whose
  inputs were lost before it was dispatched is no step of the state (in-process such a
  dispatch fails at once);
* ``active``: a step spans a slice the last one did not, with no new attempt (the program
  took a returned slice up in place);
* ``detected`` and ``attempt_end``: the backend answered a request of the program with a
  slice-down error on a slice its last step ran on (the attempt learnt of the loss and ends);
* a loop that announces its phases (elastic_dew's own, its announcements forwarded by
  :mod:`elastic_dew.proxy.announce`): its steps, saves, restores and scale-ups as announced;
* ``placed``: once the program met a loss and its retry probed the slices, a transfer or a
  program across slices placed on a slice down at that moment.

What the backend cannot see is not guessed: the step number a program gives its save (a
save's and a resume's ``step`` here is the state's position, or ``None``), its objects
(``created``), heap (``held``), its ``Manager``'s reads (``available``, ``looked``), its Grain
iterators (``data``), Orbax's skipped saves and the commits of its checkpoints.
:data:`UNSEEN` names the rules that need them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elastic_dew.simulate import run_records

__all__ = ["Mark", "StateRecords", "UNSEEN", "charged_to_programs", "unmet_losses"]

#: The problem rules the proxy boundary cannot evaluate, and what each needs.
UNSEEN = {
    "recreated_per_attempt": "needs the program's objects (a Manager or Snapshotter made inside the retried "
                             "function)",
    "held_across_attempts": "needs the program's heap (which of its objects still hold an attempt's arrays)",
    "snapshot_skipped": "needs the program's calls into Orbax's Snapshotter (a skipped save sends nothing)",
    "no_save_at_preemption": "needs the program's calls into Orbax's CheckpointManager (a checkpoint's commit "
                             "is on storage, not at the backend)",
    "data_not_rewound": "needs the program's Grain objects (ElasticIterator's position)",
    "returned_slice_ignored": "needs the program's reads of its Manager's available_inactive_slices",
}
#: How many host reads of a state's bytes are remembered for a ``checkpoint`` resume.
_READS_KEPT = 4096
#: Memory kinds the backend keeps snapshots in.
_HOST = ("pinned_host", "unpinned_host")


@dataclasses.dataclass(frozen=True)
class Mark:
    """Where an array's data came from.

    Args:
        position: the steps its data went through since a fresh state.
        origin: ``step`` (a step's result, or made from one), ``snapshot`` (copied through
            pinned host memory), ``checkpoint`` (sent from the host as a state read earlier).
        restored: the process's step count when it was restored (``None``: not restored).
        pid: the process whose steps made it.
    """

    position: int
    origin: str
    restored: int | None
    pid: int | None


def newest(marks: Iterable[Mark | None]) -> Mark | None:
    """The mark of the highest position among ``marks``, or ``None``."""
    best = None
    for mark in marks:
        if mark is not None and (best is None or mark.position > best.position):
            best = mark
    return best


class StateRecords:
    """The records of what the backend sees (see the module docstring), appended to ``path``.

    Args:
        path: the JSON-lines file (``watch.jsonl``), or ``None`` to keep nothing.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self._lock = threading.Lock()
        self._reads: OrderedDict[bytes, Mark] = OrderedDict()  # the run's host reads, every process
        self.process_started(None)

    def process_started(self, pid: int | None) -> None:
        """A new process of the run starts: attempts and steps count afresh."""
        with self._lock:
            self.pid = pid
            self.attempt = 0
            self.steps = 0
            self._stepped = True  # the attempt's first step was seen (no attempt yet)
            self._saved: set[int] = set()
            self._snapshots = False  # the process copied a state into pinned host memory
            self._detected_in = -1
            self._placed: set[tuple[int, tuple[int, ...]]] = set()
            self._restored: tuple[str, int] | None = None  # an announced restore, until the next resume
            #: Whether the program's loop announces its phases: then its steps are its announcements.
            self.announcing = False

    def _emit(self, event: str, **fields: Any) -> None:
        if self.path is None:
            return
        record = {"e": event, "pid": self.pid, "w": time.time(), "n": self.attempt, **fields}
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")

    # ----------------------------------------------------------------- attempts and steps

    def attempt_started(self, active: Iterable[int]) -> None:
        """The backend saw an attempt start on ``active`` (at its first step)."""
        with self._lock:
            self.attempt += 1
            self._stepped = False
            self._emit("attempt", active=sorted(active))

    def taken_up(self, active: Iterable[int], added: Iterable[int]) -> None:
        """A step spans ``added`` besides the last step's slices, with no new attempt."""
        with self._lock:
            if not self.announcing:  # a loop that announces says when it scales up
                self._emit("active", active=sorted(active), added=sorted(added))

    def stepped(self, inputs: Iterable[Mark | None], held: Any, counted: int = 1) -> Mark:
        """``counted`` steps (more than one when the step rule counts a program's earlier
        dispatches as it recognises it: each chained its results into the next), the last on
        inputs marked ``inputs``; ``held(pid)`` gives the newest snapshot position the backend
        holds for the process (for ``landed``).

        Returns:
            The mark of the last step's results.
        """
        with self._lock:
            mark = newest(inputs)
            if self.announcing:  # its steps are its announcements
                return Mark((mark.position if mark is not None else 0) + max(1, counted), "step", None, self.pid)
            if not self._stepped:
                self._stepped = True
                self._resumed(mark, held)
            base = mark.position if mark is not None else 0
            for position in range(base + 1, base + max(1, counted) + 1):
                self.steps += 1
                self._emit("step", p=position)
            return Mark(position, "step", None, self.pid)

    def _resumed(self, mark: Mark | None, held: Any) -> None:
        self._emit("landed", **({"snapshot": held(self.pid)} if self._snapshots else {}))
        if mark is None:
            origin, step, position = "nothing", None, 0
        elif mark.origin in ("snapshot", "checkpoint") and mark.restored == self.steps:
            origin, step, position = mark.origin, None, mark.position  # the program's own step number is unseen
        else:
            origin, step, position = "live", mark.position, mark.position
        self._emit("resume", origin=origin, step=step, p=position)

    # ----------------------------------------------------------------- copies and the host

    def copied(self, mark: Mark | None, source_memory: str | None, target_memory: str | None) -> Mark | None:
        """A copy of an array marked ``mark`` from ``source_memory`` into ``target_memory``: a
        step's state into pinned host memory is a snapshot's save, a snapshot back into device
        memory is restored. The copy's mark.

        Returns:
            The copy's mark, or ``None``.
        """
        if mark is None:
            return None
        with self._lock:
            if target_memory in _HOST and mark.origin == "step":
                self._snapshots = True
                if mark.position not in self._saved and mark.position > 0:
                    self._saved.add(mark.position)
                    self._emit("save", kind="snapshot", step=mark.position, p=mark.position, skipped=False)
                return Mark(mark.position, "snapshot", None, mark.pid)
            if mark.origin == "snapshot" and source_memory in _HOST and target_memory not in _HOST:
                return Mark(mark.position, "snapshot", self.steps, mark.pid)
            return mark

    def read(self, mark: Mark | None, data: bytes, memory: str | None = None) -> None:
        """The program read to the host ``data``, an array in ``memory`` marked ``mark``."""
        if mark is None or mark.position <= 0:
            return
        if memory in _HOST and mark.origin == "step":
            mark = Mark(mark.position, "snapshot", None, mark.pid)  # a state in host memory: a snapshot's
        with self._lock:
            self._reads[_digest(data)] = mark
            self._reads.move_to_end(_digest(data))
            while len(self._reads) > _READS_KEPT:
                self._reads.popitem(last=False)

    def sent(self, data: bytes, memory: str | None = None) -> Mark | None:
        """The program sent ``data`` from the host into ``memory``: the mark of a state it read
        earlier with these very bytes (into device memory, a checkpoint restored, or a snapshot
        if the state was one; into host memory, a snapshot's copy), or ``None``."""
        with self._lock:
            if not self._reads:
                return None
            read = self._reads.get(_digest(data))
            if read is None:
                return None
            if memory in _HOST:  # a state put into host memory: a snapshot's copy (as a copy there is)
                return Mark(read.position, "snapshot", None, read.pid)
            return Mark(read.position, read.origin if read.origin == "snapshot" else "checkpoint", self.steps,
                        read.pid)

    # ----------------------------------------------------------------- losses

    def detected(self) -> None:
        """The backend answered a request of the program with a slice-down error on a slice
        its last step ran on: the attempt learnt of the loss and ends (``detected``, then
        ``attempt_end``; once per attempt)."""
        with self._lock:
            if self._detected_in != self.attempt:
                self._detected_in = self.attempt
                self._emit("detected", how="read")
                self._emit("attempt_end", error="slice_down")

    # ----------------------------------------------------------------- a loop that announces

    def announced(self, phase: str, step: int) -> None:
        """elastic_dew's own loop announced ``phase`` of ``step``: its steps, saves, restores
        and scale-ups are what it says, as the in-process watch records them
        (:meth:`elastic_dew.simulate.watch.Watch.announced`; what landed is not seen)."""
        with self._lock:
            self.announcing = True
            first = phase == "step" and not self._stepped
            if first:
                self._stepped = True
                self._emit("landed")
            self.steps += phase == "step"
            self._restored = run_records.announced_records(phase, step, first, self._restored, self._emit)

    def placed(self, slices: Iterable[int], api: str) -> None:
        """After the program met a loss and probed the slices, ``api`` placed work on
        ``slices``, down at that moment (one record per attempt and slices)."""
        key = (self.attempt, tuple(sorted(slices)))
        with self._lock:
            if key in self._placed:
                return
            self._placed.add(key)
            self._emit("placed", slices=list(key[1]), active=None, api=api,
                       where="the backend (the program's line is not seen through the proxy)")


def unmet_losses(fired: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The fired ``lose`` faults after which the backend answered no request ``DATA_LOSS``.

    Args:
        fired: the fired faults' records.
        records: the attempts file's records (its ``met`` lines).

    Returns:
        Their scheduled texts.
    """
    met = [r["wall"] for r in records if r.get("met")]
    return tuple(f["scheduled"] for f in fired if f["action"] == "lose" and not any(w >= f["wall"] for w in met))


def charged_to_programs(fired: Sequence[Mapping[str, Any]],
                        records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The fired faults, each charged to the program's process that ran when it fired (the
    newest start in the attempts file before it): the backend fires them, so their ``pid`` is
    its own, while the costs and the rules read them as in-process, in the program's process.

    Args:
        fired: the fired faults' records.
        records: the attempts file's records (its ``start`` lines).

    Returns:
        The faults' records, each with the program's ``pid``.
    """
    starts = [(r["wall"], r["pid"]) for r in records if r.get("start") and "wall" in r]
    out = []
    for fault in fired:
        before = [pid for wall, pid in starts if wall <= fault["wall"]]
        out.append({**fault, "pid": before[-1]} if before else dict(fault))
    return out


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()
