"""A stand-in for GKE's multi-tier checkpoint replicator, so Orbax's real multi-tier code runs on CPU.

On GKE, multi-tier checkpointing has three parts: Orbax in the training program (the
controller's ``initialize_multi_tier_checkpointing`` and ``ReplicatorCheckpointManager``),
Orbax again in each TPU worker's colocated-Python sidecar (which writes the worker's
shards to its node's local RAM disk), and the **replicator**, a GKE service on every node
that copies each committed step to the node's peers in other slices and backs it up to a
Cloud Storage bucket, and that restores a replaced node's RAM disk from a peer or the
backup. Orbax and the replicator talk only through files in the local directory; this
module follows that file protocol (``orbax/checkpoint/experimental/emergency/
multi_tier_checkpointing/initialization.py`` in orbax-checkpoint 0.12.8):

* Orbax writes ``replicator.yaml`` (``job-name``, ``node-rank``, ``nodes``,
  ``peer-ranks``, ``backup-interval-minutes``, ...) through a rename; the replicator
  consumes it (deletes it) and answers with a restore marker:
  ``{job}-s{step}-n{rank}-w0.restore``, a symlink to the directory of the step it restored,
  or an empty file named for step 0 when there is nothing to restore. Orbax renames the
  symlink to ``<step>`` and reads the step from it.
* A fatal replicator error is ``replicator.failed`` (its text), a recoverable one
  ``replicator.errors``; Orbax raises on the first after the handshake.

:class:`Replicator` does that for a run, with its directories under ``root`` (the
simulator puts it under the run directory): ``local/`` is the host's local checkpoint
directory (what ``--checkpoint-dir`` points at), ``replicas/n{rank}/<step>`` what each
node's RAM disk holds, ``backup/<job>/<step>`` the bucket. A background thread answers
handshakes and copies each committed step of ``local/`` to every node's replica and to the
backup (:meth:`Replicator.sync` does it at once, and once more when the stand-in stops).

What is **not** reproduced, and why:

* One host plays every node. The simulated workers all live in this process, and Orbax
  gives every worker the same local path, so ``local/`` is every node's RAM disk at once
  and every replica holds the whole step (a real node holds its own shards and its peers').
  :meth:`Replicator.replace_node` (a node replaced, its RAM disk empty) therefore empties
  ``local/`` and that node's replica; its peers' replicas survive, and the next handshake
  restores from one of them, or from the backup when the node has no peer.
* Backups are taken of every committed step at once, not every
  ``backup-interval-minutes`` (recorded in each handshake): a wall-clock cadence would make
  a run's outcome depend on its step time. Nothing is garbage-collected.
* When ``local/`` already holds the newest step, the answer is "nothing to restore" (the
  step-0 marker): Orbax's rename of a restore symlink onto an existing step directory would
  fail, and what GKE's replicator answers in that case is not documented.
* GKE's replicator coordinates a restore across nodes; here each handshake is answered
  alone, in the order the workers make them.

Colocated Python runs a function on every Pathways worker's sidecar with that worker's
shards. JAX's CPU fallback runs it once, in this process, with every worker's shards; that
is enough for Orbax's checkpoint manager (one worker-side object writes every shard to
``local/``), but not for the initialisation's handshake, which each worker makes for its own
rank (``worker_rank_from_array`` refuses more than one shard). While a :class:`Replicator`
is active, the colocated function of Orbax's initialisation runs once per worker, with that
worker's shard of each argument, as on Pathways (:func:`_per_worker`), and the colocated
CPU device of a simulated device is the device itself (on CPU, JAX maps devices to the
first CPU devices by position, which would put one slice's sidecar data on another's
devices). Colocated functions are handed to JAX's CPU fallback as objects, not pickled
(:class:`_InProcessFunctions`: the simulator's patches do not pickle). A sidecar process
parses its absl flags, which the sidecars' Orbax reads; this process plays the sidecars, so
the stand-in marks absl's flags parsed (their defaults) when nothing has parsed them.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from elastic_dew._compat import Private
from elastic_dew._compat import jax as jax_private
from elastic_dew._compat import orbax as orbax_private

__all__ = ["Replicator", "Handshake", "Restore", "REPLICATOR_FILE", "FAILED_FILE", "local_directory"]

logger = logging.getLogger(__name__)

#: The file protocol's names (Orbax's ``initialization._REPLICATOR_FILE`` and friends).
REPLICATOR_FILE = "replicator.yaml"
FAILED_FILE = "replicator.failed"
_STEP = re.compile(r"^\d+$")


@dataclasses.dataclass(frozen=True)
class Handshake:
    """One ``replicator.yaml`` the stand-in consumed, and what it answered (``step`` 0: nothing)."""

    job: str
    rank: int
    nodes: int
    peers: tuple[int, ...]
    backup_interval_minutes: int | None
    step: int


@dataclasses.dataclass(frozen=True)
class Restore:
    """A step the stand-in copied into ``local/`` for node ``rank``, and from where."""

    rank: int
    step: int
    source: str  # "peer n{rank}" or "backup"


def local_directory(root: str | os.PathLike[str]) -> Path:
    """The local checkpoint directory of a stand-in rooted at ``root`` (its ``checkpoint_dir``)."""
    return Path(root) / "local"


def _parse(text: str) -> dict[str, Any]:
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    try:
        return {
            "job": fields["job-name"],
            "rank": int(fields["node-rank"]),
            "nodes": int(fields["nodes"]),
            "peers": tuple(ast.literal_eval(fields.get("peer-ranks", "[]"))),
            "backup_interval_minutes": (
                int(fields["backup-interval-minutes"]) if "backup-interval-minutes" in fields else None
            ),
        }
    except (KeyError, ValueError, SyntaxError) as error:
        raise ValueError(f"unreadable {REPLICATOR_FILE} ({error}): {text!r}") from error


def _steps(directory: Path) -> list[int]:
    """The committed steps in ``directory``: step directories Orbax has renamed into place."""
    if not directory.is_dir():
        return []
    return sorted(
        int(p.name) for p in directory.iterdir()
        if _STEP.match(p.name) and (p / "_CHECKPOINT_METADATA").exists()
    )


def _copy(source: Path, target: Path) -> None:
    """Copy a step directory so that ``target`` appears whole or not at all."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, symlinks=False)
    os.replace(partial, target)


class Replicator:
    """GKE's multi-tier replicator, for one simulated run, as a context manager (see the module).

    Fault controls: :meth:`fail` (the next handshake writes ``replicator.failed``),
    ``answering = False`` (handshakes are left unconsumed, so Orbax's initialisation times
    out), :meth:`replace_node`. Observations: :attr:`handshakes`, :attr:`restores`.
    """

    def __init__(self, root: str | os.PathLike[str], *, poll_seconds: float = 0.02) -> None:
        self.root = Path(root)
        self.local = local_directory(self.root)
        self.replicas = self.root / "replicas"
        self.backup = self.root / "backup"
        self.poll_seconds = poll_seconds
        #: Whether handshakes are answered (``False``: ``replicator.yaml`` stays, as when the
        #: replicator is not running on the node).
        self.answering = True
        self.handshakes: list[Handshake] = []
        self.restores: list[Restore] = []
        self._failure: str | None = None
        self._replaced: set[int] = set()
        self._nodes = 1
        self._job: str | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._undo: list[Any] = []

    # ------------------------------------------------------------------ context
    def __enter__(self) -> Replicator:
        for directory in (self.local, self.replicas, self.backup):
            directory.mkdir(parents=True, exist_ok=True)
        self._install()
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, name="elastic-dew-replicator", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sync()  # what was committed before the end is replicated and backed up
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    # ------------------------------------------------------------------ controls
    def fail(self, message: str = "simulated replicator failure") -> None:
        """Make the next handshake fail: the replicator writes ``replicator.failed``."""
        with self._lock:
            self._failure = message

    def replace_node(self, rank: int) -> None:
        """Node ``rank`` was replaced: its RAM disk (``local/`` here, see the module) is empty."""
        with self._lock:
            shutil.rmtree(self.replicas / f"n{rank}", ignore_errors=True)
            self._replaced.add(rank)
            for entry in self.local.iterdir():
                if entry.is_symlink() or entry.is_file():
                    entry.unlink()
                else:
                    shutil.rmtree(entry)
        logger.warning("simulated replacement of node %d: its local checkpoints are gone", rank)

    def sync(self) -> None:
        """Copy every committed step of ``local/`` not yet replicated to every node and the backup."""
        with self._lock:
            if self._job is None:
                return
            for step in _steps(self.local):
                source = self.local / str(step)
                targets = [self.replicas / f"n{rank}" / str(step) for rank in range(self._nodes)]
                targets.append(self.backup / self._job / str(step))
                for target in targets:
                    if not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        _copy(source, target)

    # ------------------------------------------------------------------ protocol
    def _serve(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self._answer()
                self.sync()
            except Exception:  # noqa: BLE001 - a service keeps serving; the log says why
                logger.exception("the replicator stand-in failed to serve %s", self.local)

    def _answer(self) -> None:
        request = self.local / REPLICATOR_FILE
        with self._lock:
            if not self.answering or not request.exists():
                return
            fields = _parse(request.read_text())
            request.unlink()  # consumed: Orbax waits for this
            if self._failure is not None:
                (self.local / FAILED_FILE).write_text(self._failure)
                logger.warning("replicator stand-in: %s", self._failure)
                self._failure = None
                return
            self._job, self._nodes = fields["job"], fields["nodes"]
            step = self._restore(fields["job"], fields["rank"], fields["peers"])
            self.handshakes.append(Handshake(step=step, **fields))

    def _restore(self, job: str, rank: int, peers: tuple[int, ...]) -> int:
        """Answer node ``rank``: restore the newest step if it was replaced, else say there is none.

        A replaced node gets the newest step from its first peer that holds it, else from the
        backup, through a restore marker. A node that was not replaced holds its steps
        already; when ``local/`` (shared by every node here) lacks them and no replaced node
        will restore them, they are put back from that node's own replica.
        """
        holders = {f"peer n{peer}": self.replicas / f"n{peer}" for peer in peers}
        holders["backup"] = self.backup / job
        known = {step: name for name, directory in reversed(holders.items()) for step in _steps(directory)}
        own = self.replicas / f"n{rank}"
        newest = max([*known, *_steps(own), *_steps(self.local)], default=None)
        if newest is None or newest in _steps(self.local):
            return self._nothing(job, rank)
        if rank not in self._replaced:
            if not self._replaced and newest in _steps(own):
                _copy(own / str(newest), self.local / str(newest))
            return self._nothing(job, rank)
        self._replaced.discard(rank)
        if newest not in known:
            return self._nothing(job, rank)
        source = known[newest]
        staged = self.local / f".restored-{newest}"
        shutil.rmtree(staged, ignore_errors=True)
        _copy(holders[source] / str(newest), staged)
        (self.local / f"{job}-s{newest}-n{rank}-w0.restore").symlink_to(staged.name)
        self.restores.append(Restore(rank=rank, step=newest, source=source))
        logger.info("replicator stand-in: restored step %d for node %d from %s", newest, rank, source)
        return newest

    def _nothing(self, job: str, rank: int) -> int:
        (self.local / f"{job}-s0-n{rank}-w0.restore").touch()
        return 0

    # ------------------------------------------------------------------ per-worker dispatch
    def _install(self) -> None:
        from absl import flags

        self._replace(orbax_private.MTC_COLOCATED_PYTHON, SimpleNamespace(colocated_python=_per_worker))
        functions = _InProcessFunctions()
        self._replace(jax_private.COLOCATED_SERIALIZE, functions.serialize)
        self._replace(jax_private.COLOCATED_DESERIALIZE, functions.deserialize)
        self._replace(
            jax_private.COLOCATED_CPU_DEVICES, _colocated_cpu_devices(jax_private.COLOCATED_CPU_DEVICES.get())
        )
        if not flags.FLAGS.is_parsed():
            # The sidecars' Orbax reads absl flags (a restore reads
            # --experimental_use_distributed_id_for_mesh_consistency); a sidecar process
            # parses its flags, and here this process plays the sidecars.
            flags.FLAGS.mark_as_parsed()
            self._undo.append(flags.FLAGS.unparse_flags)


    def _replace(self, point: Private, replacement: Any) -> None:
        """Replace the seam's ``point`` until :meth:`uninstall`."""
        owner, name = point.owner(), point.name
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        self._undo.append(lambda: setattr(owner, name, original))


class _InProcessFunctions:
    """Colocated Python's function serialisation, kept in this process.

    JAX pickles a colocated function with cloudpickle and, on CPU, unpickles it at once to
    run it here. The simulator's own patches are closures over its registry and locks,
    which JAX functions reach (a colocated function's signature names ``jax.Array``), so
    the pickle would fail for a reason no Pathways run has; the function object itself is
    handed over instead.
    """

    def __init__(self) -> None:
        self._functions: dict[int, Any] = {}
        self._keys = itertools.count()

    def serialize(self, obj: Any) -> bytes:
        key = next(self._keys)
        self._functions[key] = obj
        return f"elastic-dew-colocated:{key}".encode()

    def deserialize(self, data: bytes) -> Any:
        return self._functions.pop(int(data.decode().rpartition(":")[2]))


def _colocated_cpu_devices(original: Any) -> Any:
    """``colocated_cpu_devices`` that returns CPU devices as they are, as JAX's docstring says.

    On CPU, JAX's implementation maps devices to the process's first CPU devices by
    position, which would put the sidecar data of slice 2's devices on slice 1's.
    """

    def colocated_cpu_devices(devices_or_mesh: Any) -> Any:
        devices = devices_or_mesh.devices.flat if isinstance(devices_or_mesh, Mesh) else devices_or_mesh
        if all(device.platform == "cpu" for device in devices):
            return devices_or_mesh if isinstance(devices_or_mesh, Mesh) else tuple(devices_or_mesh)
        return original(devices_or_mesh)

    return colocated_cpu_devices


class _PerWorkerCall:
    """A colocated function called once per worker, with each worker's one shard of each argument.

    The arguments are what Orbax's initialisation passes: arrays with one shard per worker
    device (replicated or split along one axis). The result has the first argument's shape
    and sharding, assembled from each worker's one-device result.
    """

    def __init__(self, function: Any) -> None:
        self.function = function

    def specialize(self, **_: Any) -> _PerWorkerCall:
        return self

    def __call__(self, *arrays: jax.Array) -> jax.Array:
        first = arrays[0]
        devices = list(cast(jax.sharding.NamedSharding, first.sharding).mesh.devices.flat)
        results = []
        for device in devices:
            args = [_shard_on(array, device) for array in arrays]
            result = self.function(*args)
            results.append(result.addressable_shards[0].data)
        return jax.make_array_from_single_device_arrays(first.shape, first.sharding, results)


def _per_worker(function: Any) -> _PerWorkerCall:
    return _PerWorkerCall(function)


def _shard_on(array: jax.Array, device: jax.Device) -> jax.Array:
    """``array``'s shard on ``device`` as a one-device array, as that worker's sidecar sees it."""
    sharding = array.sharding
    if not isinstance(sharding, NamedSharding):
        raise TypeError(
            f"the simulator runs colocated functions per worker for NamedSharding arguments only, got {sharding}"
        )
    (shard,) = [s for s in array.addressable_shards if s.device == device]
    mesh = Mesh(np.array([device]).reshape((1,) * len(sharding.mesh.axis_names)), sharding.mesh.axis_names)
    return jax.device_put(shard.data, NamedSharding(mesh, sharding.spec))
