"""What a program under the simulator does with its state: the observations diagnosis reads.

A :class:`Watch` belongs to one :class:`~elastic_dew.simulate.SimulatedSlices` and records,
as plain JSON-ready dicts (one JSON line each in ``path`` when given, flushed as it happens
so a killed process's record survives; else kept in memory; :meth:`Watch.records` reads
them either way), what the program's
process does that decides what a fault costs it and which mistakes it makes. Every record
comes from the program's calls as the simulator's patches see them
(:mod:`elastic_dew.simulate.patches`), never from its source text:

* ``attempt``: an ``elastic_retry`` attempt started with these active slices; ``attempt_end``:
  it ended (``error``: ``slice_down``, ``scale_up``, ``other`` with the error's
  ``error_type`` and ``message``, or ``None`` when it returned); ``active``: inside an
  attempt the program set a ``Manager``'s ``active_slice_indices`` itself (``added``: the
  slices it took up in place);
* ``step``: the loop's step function was dispatched (the simulator's count,
  :meth:`SimulatedSlices.step_of`, or elastic_dew's own ``step`` announcement) and its state
  reached position ``p``: the state's *position* is how many steps its data went through
  since a fresh initialisation. Each step's outputs carry their position on the array
  object; a dispatch or a copy passes the highest position of its inputs on, a snapshot or
  checkpoint save records the position of what it saved, and a restore marks what it
  returns with the saved position. So at each attempt's first step the position of the
  step's inputs says where the program resumed from (``resume``: ``snapshot``,
  ``checkpoint``, ``live`` for a state carried over, ``nothing`` for a fresh one), after a
  ``landed`` record: the newest snapshot whose copy had finished and the newest committed
  checkpoint then, in the process's Snapshotters and checkpoint managers (a tier it has
  none of is left out); ``superseded``: the simulator started its step count again (the
  step records of the process before it were not steps);
* ``save`` / ``restore``: an Orbax ``Snapshotter`` save (``skipped`` when Orbax dropped it
  because the previous one was still queued; requested, not yet landed) or load, a
  checkpoint save or restore (``CheckpointManager``, v0 ``Checkpointer.restore``, v1
  ``load``/``load_pytree``/``load_checkpointables`` of a path and ``training.Checkpointer``'s
  saves and loads), with the program's step number and the state's position;
* ``created``: a pathwaysutils ``Manager``, an Orbax ``Snapshotter``, ``CheckpointManager``
  or v1 ``Checkpointer`` made, with the attempt it was made in and whether inside the
  retried function;
* ``held``: at an attempt's first step, device arrays an earlier attempt's steps made that
  something other than the failed attempt's own (dead) frames still references, with their
  bytes and what holds them;
* ``placed``: inside an attempt, user code put a computation or a transfer on devices of a
  slice down at that moment and outside the active slices the program has (or claimed
  while it was down);
* ``detected``: the simulator raised a slice-down error (at a ``read`` or a ``dispatch``);
* ``available`` / ``looked``: a ``Manager``'s ``available_inactive_slices`` became non-empty,
  and the program (not pathwaysutils itself) read it while it was;
* ``data``: a Grain ``ElasticIterator`` was made, put at a position (``set_state``), or
  handed out the attempt's first batch.

The rules that turn these records into costs and named problems are
:mod:`elastic_dew.simulate.diagnosis`; they read only these records and the fault log, so
they hold for any boundary that can produce the same records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import jax
from orbax.checkpoint import utils as ocp_utils

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.rundir import read_records
from elastic_dew.simulate import run_records, watch_heap
from elastic_dew.simulate.frames import caller, own_loop_on_stack, user_frame
from elastic_dew.simulate.leaves import arrays_in

__all__ = ["LANDING_SECONDS", "Watch"]

logger = logging.getLogger(__name__)

#: The attribute a step's output (or a restored or derived array) carries: ``(token,
#: position, attempt, origin, saved_step)``.
_POSITION = "_elastic_dew_position"
#: The objects whose landed state is read at each resume, by the name ``created`` gets, and
#: the tier each holds.
_TIERS = {"Snapshotter": "snapshot", "CheckpointManager": "checkpoint", "Checkpointer": "checkpoint"}
#: How much of an error's message an ``attempt_end`` record keeps.
_MESSAGE = 400
#: How many held arrays get their holders named (finding them scans the heap).
_DESCRIBED = 3


#: How long a ``Snapshotter.save`` waits for the request before it to be taken up, and a
#: step-keyed fault for the copy in flight to land (a copy of a small state to host memory
#: takes milliseconds on CPU): Orbax skips a save while one is still queued, and a skip, or a
#: snapshot lost to a fault, must come from a copy that could not finish, not from a worker
#: thread the machine's load kept from running.
LANDING_SECONDS = 0.5


def _own_loop_on_stack() -> bool:
    return own_loop_on_stack(caller())  # from the watch's caller outwards


def _tag(array: Any, mark: tuple[Any, ...]) -> None:
    with contextlib.suppress(AttributeError):  # an array type without a __dict__ carries no position
        setattr(array, _POSITION, mark)


class Watch:
    """The observations of one simulated process (see the module docstring).

    Args:
        simulator: the simulator it belongs to (its topology and attempts).
        path: a JSON-lines file each record is appended to, or ``None``.
    """

    def __init__(self, simulator: Any, path: str | os.PathLike[str] | None = None) -> None:
        self._simulator = simulator
        self.path = Path(path) if path is not None else None
        self._lock = threading.RLock()
        self._token = object()
        self._snapshotters: weakref.WeakSet[Any] = weakref.WeakSet()
        #: Every Snapshotter and CheckpointManager of the process (elastic_dew's own loop's
        #: too): what has landed in them is read at each resume.
        self._tiers: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.reset()

    def reset(self) -> None:
        """Forget everything (the simulator's context was entered again)."""
        with self._lock:
            #: Every record so far, in order, when there is no ``path`` (a long run's records
            #: go to the file only).
            self.events: list[dict[str, Any]] = []
            self._last: dict[str, Any] | None = None
            self._attempt = 0  # this process's elastic_retry attempt now (0: none yet)
            self._active: tuple[int, ...] | None = None
            self._claimed_down: frozenset[int] = frozenset()  # slices the program claimed while down
            self._stepped = False  # whether the attempt now has run its first step
            self._number = 0  # the simulator's number of the newest counted step
            self._counted = 0  # how often the simulator started its count again (a step's mark carries it)
            self._retry_depth = 0
            self._saves: dict[tuple[str, int], int] = {}  # (kind, program step) -> position
            self._restored: tuple[str, int] | None = None  # announced loops: an announced restore's kind, step
            self._placed: set[tuple[int, tuple[int, ...]]] = set()
            self._looked: set[frozenset[int]] = set()
            self._data_taken = False
            self._available: set[frozenset[int]] = set()

    # ----------------------------------------------------------------- records

    def records(self) -> list[dict[str, Any]]:
        """Every record so far, in order (read back from ``path`` when there is one: with
        the records of the run's earlier processes that share it).

        Returns:
            The records.
        """
        return list(self.events) if self.path is None else read_records(self.path)

    def _emit(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"e": event, "pid": os.getpid(), "w": time.time(), "n": self._attempt, **fields}
        with self._lock:
            self._last = record
            if self.path is None:
                self.events.append(record)
            else:
                with open(self.path, "a", encoding="utf-8") as out:
                    out.write(json.dumps(record) + "\n")
        return record

    def _mark(self, array: Any) -> tuple[Any, ...] | None:
        mark = getattr(array, _POSITION, None)
        if mark is None or mark[0] is not self._token:
            return None
        return None if mark[3] == "step" and mark[5] != self._counted else mark  # a superseded program's: no step

    def _set(self, array: Any, position: int, origin: str, saved_step: int | None = None) -> None:
        _tag(array, (self._token, position, self._attempt, origin, saved_step, self._counted))

    def _newest(self, arrays: list[Any]) -> tuple[Any, ...] | None:
        best = None
        for array in arrays:
            mark = self._mark(array)
            if mark is not None and (best is None or mark[1] > best[1]):
                best = mark
        return best

    # ----------------------------------------------------------------- attempts

    def attempt_started(self, active: tuple[int, ...]) -> None:
        """pathwaysutils' wait for slices answered: attempt ``active`` starts."""
        with self._lock:
            self._attempt += 1
            self._active = tuple(active)
            self._claimed_down = frozenset()
            self._stepped = False
            self._restored = None
            self._data_taken = False
        self._emit("attempt", active=list(active))

    def retry_entered(self) -> None:
        """The retried function (given to ``elastic_retry``) starts an attempt."""
        self._retry_depth += 1

    def retry_left(self, error: BaseException | None) -> None:
        """The retried function ended: returned (``error`` ``None``) or raised ``error``."""
        self._retry_depth = max(0, self._retry_depth - 1)
        kind = None
        if error is not None:
            name = type(error).__name__
            if name == "ScaleUpSignalError":
                kind = "scale_up"
            elif isinstance(error, jax.errors.JaxRuntimeError):
                kind = "slice_down"
            else:
                kind = "other"
        if kind == "other":
            assert error is not None
            self._emit("attempt_end", error=kind, error_type=f"{type(error).__module__}.{type(error).__qualname__}",
                       message=str(error)[:_MESSAGE])
        else:
            self._emit("attempt_end", error=kind)

    def in_retry(self) -> bool:
        """Whether the program is inside the retried function now."""
        return self._retry_depth > 0

    # ----------------------------------------------------------------- steps

    def stepped(self, inputs: list[Any], outputs: list[Any], number: int | None = None) -> None:
        """A counted step (the simulator's ``number``) was dispatched on ``inputs``, giving
        ``outputs``. A number not past the last one means the simulator started its count
        again (a program carrying more state superseded what it had counted, a data
        generator's): the steps recorded before were none (``superseded``), their outputs
        carry no position, and this step is the process's first."""
        if number is not None:
            if number <= self._number:
                self._counted += 1
                self._stepped = False
                self._emit("superseded")
            self._number = number
        newest = self._newest(inputs)
        position = (newest[1] if newest is not None else 0) + 1
        if not self._stepped:
            self._stepped = True
            self._resumed(newest, inputs)
        for array in outputs:
            self._set(array, position, "step")
        self._emit("step", p=position)

    def announced(self, phase: str, step: int) -> None:
        """elastic_dew's own loop announced ``phase`` of ``step`` (its steps and its tiers)."""
        first = phase == "step" and not self._stepped
        if first:
            self._stepped = True
            self._landed()
        elif phase in ("snapshot", "checkpoint"):
            self._saves[(phase, step)] = step
        self._restored = run_records.announced_records(phase, step, first, self._restored, self._emit)

    def _landed(self) -> None:
        """What has landed now, recorded before a resume: the newest snapshot in host memory
        (its copy finished) and the newest committed checkpoint (finalized on storage: a save
        still in flight, in a manager's own list already, is not), over the process's
        Snapshotters and checkpoint managers (``landed``; a tier it cannot read is left out)."""
        newest: dict[str, int | None] = {}
        for tier, kind in list(self._tiers.items()):
            try:
                if kind == "checkpoint":  # the steps committed on storage, read without touching the manager
                    step = max(ocp_utils.checkpoint_steps(tier.directory), default=None)
                else:  # a Snapshotter: the newest snapshot whose copy landed
                    step = int(tier.latest.step) if tier.latest is not None else None
            except Exception:  # noqa: BLE001 - a tier that cannot say what landed says nothing
                logger.debug("could not read what landed in %r", tier, exc_info=True)
                continue
            known = newest.get(kind)
            newest[kind] = step if known is None or (step is not None and step > known) else known
        self._emit("landed", **newest)

    def _resumed(self, newest: tuple[Any, ...] | None, inputs: list[Any]) -> None:
        self._landed()
        if newest is None:
            origin, saved, position = "nothing", None, 0
        elif newest[3] in ("snapshot", "checkpoint") and newest[2] == self._attempt:
            origin, saved, position = newest[3], newest[4], newest[1]
        else:
            origin, saved, position = "live", newest[1], newest[1]
        self._emit("resume", origin=origin, step=saved, p=position)
        if self._attempt >= 2:
            self._check_held(inputs)

    def derived(self, inputs: list[Any], outputs: list[Any]) -> None:
        """A dispatch that is not a step (or a copy) passes its inputs' position on."""
        newest = self._newest(inputs)
        if newest is not None:
            for array in outputs:
                if self._mark(array) is None:
                    _tag(array, newest)

    # ----------------------------------------------------------------- held arrays

    def _check_held(self, inputs: list[Any]) -> None:
        """Arrays an earlier attempt's steps made, still referenced at this attempt's first step."""
        found = watch_heap.held_arrays(inputs, lambda array: (mark := self._mark(array)) is not None
                                       and mark[2] < self._attempt, _DESCRIBED)
        if found is not None:
            held, described = found
            self._emit("held", arrays=len(held), bytes=int(sum(a.nbytes for a in held)),
                       attempts=sorted({mark[2] for a in held if (mark := self._mark(a)) is not None}),
                       holders=described)

    # ----------------------------------------------------------------- placement

    def misplaced_slices(self) -> frozenset[int] | None:
        """The slices no work may go to now: those down and outside the active slices the
        program has, or down when the program claimed them; ``None`` outside any attempt or
        when there are none."""
        active = self._active
        if active is None or self._retry_depth == 0:
            return None
        lost = self._simulator.lost
        wrong = ((frozenset(range(self._simulator.slices)) - set(active)) | self._claimed_down) & lost
        return wrong or None

    def active_set(self, active: frozenset[int]) -> None:
        """The program (not pathwaysutils) set a ``Manager``'s ``active_slice_indices`` to
        ``active`` inside an attempt (the guide's in-place scale-up): placements are judged
        against it from now on, and a returned slice it adds is taken up now."""
        with self._lock:
            if self._active is None or self._retry_depth == 0:
                return
            before = set(self._active)
            self._active = tuple(sorted(active))
            self._claimed_down = frozenset(set(active) - before) & self._simulator.lost
        if set(active) != before:
            self._emit("active", active=sorted(active), added=sorted(set(active) - before))

    def placing(self, arrays: list[Any], api: str, caller: Any) -> None:
        """``arrays`` (inputs, results or a copy's target) were placed by ``api``, called from
        frame ``caller``: record it when user code put them on a slice of
        :meth:`misplaced_slices` (a placement on a healthy slice, or on a slice the program
        still counts active and is about to learn is lost, is not a mistake)."""
        down = self.misplaced_slices()
        if down is None or not arrays:
            return
        frame = user_frame(caller)
        if frame is None:
            return
        device_slice = self._simulator.topology.device_slice
        slices = sorted({device_slice[d.id] for a in arrays for d in a.sharding.device_set
                         if device_slice.get(d.id) in down})
        key = (self._attempt, tuple(slices))
        if not slices or key in self._placed:
            return
        self._placed.add(key)
        self._emit("placed", slices=slices, active=list(self._active or ()), api=api,
                   where=f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")

    def detected(self, how: str) -> None:
        """The simulator raised a slice-down error at a ``read`` or a ``dispatch``."""
        last = self._last
        if last is not None and last["e"] == "detected" and last["n"] == self._attempt:
            return  # one per attempt is enough
        self._emit("detected", how=how)

    # ----------------------------------------------------------------- state tiers

    def created(self, what: str, instance: Any = None) -> None:
        """A ``Manager``, ``Snapshotter`` or ``CheckpointManager`` (``instance``) was made."""
        own = _own_loop_on_stack()
        if what in _TIERS and instance is not None and (not own or what == "Snapshotter"):
            # elastic_dew's own loop: only its snapshots are read (in memory); its checkpoints'
            # storage is its own to bound, never listed from here
            with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced is not read at resumes
                self._tiers[instance] = _TIERS[what]
        if own:
            return
        if what == "Snapshotter" and instance is not None:
            self._snapshotters.add(instance)
        self._emit("created", what=what, in_retry=self.in_retry())

    def land_snapshots(self) -> None:
        """Give each of the program's Orbax ``Snapshotter``\\ s :data:`LANDING_SECONDS` to finish
        its request before a step-keyed fault fires, so which snapshot a recovery loads depends
        on the schedule, not on whether Orbax's worker thread ran before the fault (elastic_dew's
        own loop lands its own, :meth:`~elastic_dew.simulate.patches.Registry.land_snapshots`)."""
        deadline = time.monotonic() + LANDING_SECONDS
        for snapshotter in list(self._snapshotters):
            while orbax_private.snapshot_landing(snapshotter) and time.monotonic() < deadline:
                time.sleep(0.002)

    def saved(self, kind: str, step: int, tree: Any, skipped: bool = False) -> None:
        """The program saved ``tree`` as its ``kind`` (``snapshot``/``checkpoint``) of ``step``."""
        if _own_loop_on_stack():
            return  # elastic_dew's loop announces its saves
        newest = self._newest(arrays_in(tree))
        position = newest[1] if newest is not None else 0
        if not skipped:
            self._saves[(kind, int(step))] = position
        self._emit("save", kind=kind, step=int(step), p=position, skipped=skipped)

    def restored(self, kind: str, step: int | None, tree: Any) -> None:
        """A load or restore of the ``kind`` of ``step`` returned ``tree``."""
        if _own_loop_on_stack():
            return
        step = int(step) if step is not None else None
        position = self._saves.get((kind, step)) if step is not None else None
        if position is None:
            position = self._saved_elsewhere(kind, step)
        for array in arrays_in(tree):
            self._set(array, position, kind, step)
        self._emit("restore", kind=kind, step=step, p=position)

    def _saved_elsewhere(self, kind: str, step: int | None) -> int:
        """The position an earlier process recorded for its save of ``step`` (else ``step``)."""
        if step is None:
            return 0
        if self.path is not None:
            for record in reversed(read_records(self.path)):
                if record.get("e") == "save" and record.get("kind") == kind and record.get("step") == step:
                    return int(record["p"])
        return step

    # ----------------------------------------------------------------- data

    def data_taken(self) -> None:
        """The program took a batch from a Grain ``ElasticIterator`` (the first of the
        attempt is recorded)."""
        if not self._data_taken:
            self._data_taken = True
            self._emit("data", what="next")

    def data_positioned(self, what: str) -> None:
        """A Grain ``ElasticIterator`` was made (``made``) or put at a position (``set_state``)."""
        self._emit("data", what=what)

    # ----------------------------------------------------------------- returned slices

    def available(self, slices: frozenset[int]) -> None:
        """A Manager's ``available_inactive_slices`` became ``slices``."""
        if slices and slices not in self._available:
            self._available.add(slices)
            self._emit("available", slices=sorted(slices))

    def looked(self, slices: frozenset[int]) -> None:
        """The program read ``available_inactive_slices`` while it held ``slices``."""
        if slices and slices not in self._looked:
            self._looked.add(slices)
            self._emit("looked", slices=sorted(slices))
