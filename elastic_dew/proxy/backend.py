"""The local Pathways backend's state: its slices of CPU devices, the arrays and programs it holds.

A :class:`ProxyBackend` carries out what the proxy client asks on jaxlib's own CPU client, in the
server's process (which must see ``slices * devices_per_slice`` CPU devices before JAX
starts: :func:`cpu_flags`). Each array is held as its single-device shards (each a
``jax.Array`` on one CPU device) with the dtype, shape and IFRT sharding the client knows it
by; each program is compiled on the CPU client from the MLIR and options the client sends.

Slices fail as Pathways reports it (:class:`~elastic_dew.proxy.slices.Slices`, the fault state
machine both boundaries share): after a loss every array with a shard on the lost slice (held
before the loss or made after it) reads as ``DATA_LOSS`` (or the loss's code), and every
program run on its devices gives results that do (a dispatch itself never fails: the error
travels in the results, where pathwaysutils' health check and ``elastic_retry`` look for
it); a read of a hung slice's result waits. What the protocol describes (dtypes, shardings,
modules, error codes) is :mod:`elastic_dew.proxy.ifrt`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from elastic_dew.proxy import protocol
from elastic_dew.proxy.ifrt import (
    CONCRETE_EVEN,
    HLO,
    INVALID_ARGUMENT,
    NOT_FOUND,
    UNIMPLEMENTED,
    ProxyError,
    dtype_kind,
    hlo_sharding,
    numpy_dtype,
    parse_sharding,
    read_module,
    replicated,
    sharding_devices,
    single_device_sharding,
)
from elastic_dew.proxy.slices import Slices

__all__ = ["ProxyBackend", "ProxyArray", "ProxyProgram", "cpu_flags"]

logger = logging.getLogger(__name__)


def cpu_flags(devices: int, flags: str = "") -> str:
    """``XLA_FLAGS`` for a server process with ``devices`` CPU devices (other flags kept)."""
    kept = [f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


@dataclasses.dataclass
class ProxyArray:
    """One array the client holds a handle of."""

    kind: int  # DTypeProto.Kind
    shape: tuple[int, ...]
    sharding: Any  # the client's ShardingProto (xla.ifrt.ShardingProto)
    device_ids: tuple[int, ...]
    memory_kind: str | None
    shards: list[Any]  # one single-device jax.Array per device of device_ids, in that order
    epochs: tuple[tuple[int, int], ...]
    error: tuple[int, str] | None = None
    producer: str | None = None  # the program whose result it is
    mark: Any = None  # where its data came from (a proxy.records.Mark), when the backend keeps records
    landed_once: bool = False  # a host copy's first readiness check was answered as it finished


@dataclasses.dataclass
class ProxyProgram:
    """One compiled program."""

    name: str
    executable: Any
    device_ids: tuple[int, ...]
    parameter_shardings: list[Any]
    output_shardings: list[Any]
    output_memory_kinds: list[str]
    output_shapes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    output_bytes: int = 0
    outputs: list[tuple[int, tuple[int, ...], Any, str | None]] | None = None  # each result's spec, once run


class ProxyBackend:
    """The CPU client's side of every session: devices, slices, arrays, programs, futures.

    Args:
        slices: the number of virtual slices.
        devices_per_slice: CPU devices in each; the process must see ``slices *
            devices_per_slice`` CPU devices (:func:`cpu_flags` in ``XLA_FLAGS`` before JAX
            starts).

    Raises:
        RuntimeError: JAX's CPU backend has fewer devices than the slices need.
    """

    def __init__(self, slices: int, devices_per_slice: int):
        import jax
        import jax.extend.backend

        self.client = jax.extend.backend.get_backend("cpu")
        devices = sorted(self.client.devices(), key=lambda d: d.id)
        need = slices * devices_per_slice
        if len(devices) < need:
            raise RuntimeError(f"the CPU backend has {len(devices)} devices, {slices} slices of {devices_per_slice} "
                               f"need {need}: start the server with XLA_FLAGS={cpu_flags(need)!r}")
        self.devices = devices[:need]
        self.slices = Slices(slices, devices_per_slice)
        self._lock = threading.Lock()
        self.arrays: dict[int, ProxyArray] = {}
        self.programs: dict[int, ProxyProgram] = {}
        self.futures: dict[int, tuple[int, str] | None] = {}
        #: The epochs of the slices each run's status future waits on (a hung slice's run).
        self.pending: dict[int, tuple[tuple[int, int], ...]] = {}
        self._next_handle = 1 << 63  # above every handle the client makes itself
        self.dispatches = 0
        self.stepper: Any = None  # a StepSchedule, set by its attach()
        self._singles: dict[tuple[int, str | None], Any] = {}
        self._gspmd: dict[tuple[tuple[int, ...], bytes, str | None], Any] = {}

    # -------------------------------------------------------------- handles and futures

    def new_handle(self) -> int:
        with self._lock:
            self._next_handle += 1
            return self._next_handle

    def future(self, status: tuple[int, str] | None = None) -> int:
        handle = self.new_handle()
        self.futures[handle] = status
        return handle

    def device(self, device_id: int) -> Any:
        if not 0 <= device_id < len(self.devices):
            raise ProxyError(INVALID_ARGUMENT, f"device {device_id} does not exist (the backend has 0.."
                                               f"{len(self.devices) - 1})")
        return self.devices[device_id]

    # -------------------------------------------------------------- arrays

    def put(self, handle: int, held: ProxyArray) -> int:
        self.arrays[handle] = held
        return handle

    def get(self, handle: int) -> ProxyArray:
        held = self.arrays.get(handle)
        if held is None:
            raise ProxyError(NOT_FOUND, f"array handle {handle} is unknown to the local Pathways backend")
        return held

    def status(self, held: ProxyArray) -> tuple[int, str] | None:
        """Why ``held`` cannot be read (``(code, message)``), or ``None`` when it can."""
        if held.error is not None:
            return held.error
        lost = self.slices.lost_among(held.epochs)
        if lost:
            return (self.slices.code_of(lost[0]), f"the array's data was on slice {lost[0]}, which is lost "
                                                  f"(elastic-dew local Pathways backend)")
        return None

    def landed(self, held: ProxyArray) -> bool:
        """Whether this readiness check of ``held`` is the first of a copy into host memory that
        finished before every loss its slices met since: it is answered as the copy finished
        (the program's snapshot worker learns that its copy landed, as in-process the simulator
        lands a snapshot's copy before a step-keyed fault fires); every later check, and every
        read of its data, fails."""
        if held.memory_kind not in ("pinned_host", "unpinned_host") or held.error is not None or held.landed_once:
            return False
        held.landed_once = True
        states = self.slices.states
        gone = set(self.slices.lost_among(held.epochs))
        return bool(gone) and all(states.epochs[s] != epoch for s, epoch in held.epochs if s in gone)

    def check_readable(self, held: ProxyArray) -> None:
        """Wait while ``held`` is a hung slice's (not in host memory); raise when it is lost."""
        if held.memory_kind != "pinned_host":
            self.slices.await_answer(held.epochs)
        status = self.status(held)
        if status is not None:
            raise ProxyError(*status)

    def make_held(self, kind: int, shape: tuple[int, ...], sharding: Any, shards: list[Any],
                  error: tuple[int, str] | None = None) -> ProxyArray:
        device_ids, memory = sharding_devices(sharding)
        return ProxyArray(kind, tuple(shape), sharding, device_ids, memory, shards, self.slices.epochs(device_ids), error)

    def _single(self, device_id: int, memory_kind: str | None) -> Any:
        key = (device_id, memory_kind)
        sharding = self._singles.get(key)
        if sharding is None:
            import jax

            sharding = self._singles[key] = jax.sharding.SingleDeviceSharding(self.device(device_id),
                                                                              memory_kind=memory_kind)
        return sharding

    def shards_on(self, values: Sequence[Any], device_ids: Sequence[int], memory_kind: str | None) -> list[Any]:
        """Each of ``values`` on the device of the same place in ``device_ids``, in one batched put."""
        import jax

        return list(jax.device_put(list(values), [self._single(d, memory_kind) for d in device_ids]))

    def assembled(self, held: ProxyArray, device_ids: Sequence[int], op_sharding: Any, memory_kind: str | None) -> Any:
        """``held`` as one ``jax.Array`` over ``device_ids`` sharded by ``op_sharding`` (its
        shards joined as they are, in that order: no copy, no check)."""
        from elastic_dew._compat import jax as jax_private

        if len(held.shards) == 1 and len(device_ids) == 1:
            return held.shards[0]
        key = (tuple(device_ids), op_sharding.SerializeToString(), memory_kind)
        sharding = self._gspmd.get(key)
        if sharding is None:
            devices = [self.device(d) for d in device_ids]
            sharding = self._gspmd[key] = jax_private.XLA_GSPMD_SHARDING.get()(devices, op_sharding,
                                                                               memory_kind=memory_kind)
        by_device = dict(zip(held.device_ids, held.shards))
        shards = [by_device[d] for d in device_ids if d in by_device]
        if len(shards) != len(device_ids):
            raise ProxyError(INVALID_ARGUMENT, f"an argument on devices {list(held.device_ids)} does not cover the "
                                               f"program's devices {list(device_ids)}")
        aval = jax_private.SHAPED_ARRAY.get()(held.shape, numpy_dtype(held.kind))
        return jax_private.ARRAY_IMPL.get()(aval, sharding, shards, committed=True, _skip_checks=True)

    def to_numpy(self, held: ProxyArray) -> np.ndarray:
        """The whole array on the host."""
        self.check_readable(held)
        if len(held.shards) == 1:
            return np.asarray(held.shards[0])
        kind, inner = parse_sharding(held.sharding)
        if kind == CONCRETE_EVEN and inner.is_fully_replicated:
            return np.asarray(held.shards[0])
        if kind != HLO:
            raise ProxyError(UNIMPLEMENTED, f"reading an array with an IFRT sharding of type {kind} is not served by "
                                            "the local Pathways backend")
        from elastic_dew._compat import jax as jax_private

        op = jax_private.XLA_OP_SHARDING.get()()
        op.ParseFromString(inner.xla_op_sharding.SerializeToString())
        devices = [self.device(d) for d in held.device_ids]
        sharding = jax_private.XLA_GSPMD_SHARDING.get()(devices, op)
        indices = sharding.devices_indices_map(held.shape)
        out = np.empty(held.shape, numpy_dtype(held.kind))
        for device_id, shard in zip(held.device_ids, held.shards):
            out[indices[self.devices[device_id]]] = np.asarray(shard)
        return out

    # -------------------------------------------------------------- programs

    def compile(self, mlir: bytes, options: bytes, device_ids: Sequence[int] | None) -> ProxyProgram:
        """Compile ``mlir`` (MLIR bytecode or a StableHLO portable artifact) with the serialized
        ``CompileOptionsProto`` ``options`` on ``device_ids`` (default: its device assignment's)."""
        from elastic_dew._compat import jax as jax_private

        name, shapes, out_bytes = read_module(mlir)
        compile_options = jax_private.XLA_COMPILE_OPTIONS.get().ParseFromString(options)
        if device_ids is None:
            assignment = protocol.message("xla.DeviceAssignmentProto").FromString(
                compile_options.device_assignment.serialize())
            ids: list[int] = []
            for replica in range(assignment.replica_count):
                for computation in assignment.computation_devices:
                    ids.append(computation.replica_device_ids[replica])
            device_ids = ids
        devices = jax_private.XLA_DEVICE_LIST.get()(tuple(self.device(d) for d in device_ids))
        executable = self.client.compile_and_load(mlir, devices, compile_options)
        return ProxyProgram(
            name=name, executable=executable, device_ids=tuple(device_ids),
            parameter_shardings=list(executable.get_parameter_shardings() or []),
            output_shardings=list(executable.get_output_shardings() or []),
            output_memory_kinds=list(executable.get_output_memory_kinds()[0]) if executable.get_output_memory_kinds()
            else [],
            output_shapes=shapes, output_bytes=out_bytes,
        )

    def execute(self, program: ProxyProgram, args: list[ProxyArray]) -> tuple[list[ProxyArray], tuple[int, str] | None]:
        """Run ``program`` on ``args``; its results, and why they are lost (or ``None``).

        With a :attr:`stepper` (a :class:`~elastic_dew.proxy.faults.StepSchedule`), a dispatch
        it counts as a step fires what is due before it runs and after; a fault that fails the
        step (``error``) travels in its results, as a lost slice's error does.
        """
        if self.stepper is None:
            return self._execute(program, args)
        in_bytes = sum(_nbytes(h) for h in args)
        slices = frozenset(self.slices.slice_of(d) for d in program.device_ids)
        chained = sum(_nbytes(h) for h in args if h.producer == program.name)  # the state it carries
        failed: tuple[int, str] | None = None
        step = None
        marks = [h.mark for h in args]
        from elastic_dew.proxy.faults import probe_programs
        from elastic_dew.proxy.records import newest

        if program.name not in probe_programs():
            self.stepper.placing(program.device_ids, f"program {program.name}")
        try:
            dead = any(self.status(h) is not None for h in args)  # in-process such a dispatch fails at once
            step = self.stepper.before(program, in_bytes, program.output_bytes, slices, chained,
                                       None if dead else marks)
        except ProxyError as error:
            failed = (error.code, str(error))
        results, lost = self._execute(program, args)
        if step is not None:
            for held in results:
                held.mark = self.stepper.step_mark
        else:  # a program that moves its input between memories is a copy (jax.device_put to a memory kind)
            source = max(args, key=lambda h: h.mark.position if h.mark is not None else -1, default=None)
            for held in results:
                held.mark = self.stepper.records.copied(newest(marks), source.memory_kind if source else None,
                                                        held.memory_kind)
        try:
            self.stepper.after(step)
        except ProxyError as error:
            failed = failed or (error.code, str(error))
        if failed is None:
            return results, lost
        return [dataclasses.replace(held, error=failed) for held in results], failed

    def _execute(self, program: ProxyProgram, args: list[ProxyArray]) -> tuple[list[ProxyArray], tuple[int, str] | None]:
        error = None
        for held in args:
            error = error or self.status(held)
        down = self.slices.states.down
        lost = [s for s in sorted({self.slices.slice_of(d) for d in program.device_ids}) if s in down]
        if lost and error is None:
            error = (self.slices.code_of(lost[0]), f"program {program.name} ran on slice {lost[0]}, which is lost "
                                                   f"(elastic-dew local Pathways backend)")
        inputs = []
        for index, held in enumerate(args):
            op = program.parameter_shardings[index] if index < len(program.parameter_shardings) else None
            if op is None or len(program.device_ids) == 1:
                inputs.append(held.shards[0] if len(held.shards) == 1 else self.assembled(
                    held, program.device_ids, replicated(), held.memory_kind))
            else:
                inputs.append(self.assembled(held, program.device_ids, op, held.memory_kind))
        results = program.executable.execute_sharded(inputs)
        outputs = results.disassemble_into_single_device_arrays()
        self.dispatches += 1
        if program.outputs is None:  # what every run's results are, read once
            program.outputs = [self._output_spec(program, index, shards) for index, shards in enumerate(outputs)]
        epochs = self.slices.epochs(program.device_ids)
        return [ProxyArray(kind, shape, sharding, program.device_ids, memory, list(shards), epochs, error, program.name)
                for (kind, shape, sharding, memory), shards in zip(program.outputs, outputs)], error

    def _output_spec(self, program: ProxyProgram, index: int, shards: list[Any]) -> tuple[int, tuple[int, ...], Any,
                                                                                          str | None]:
        """The dtype kind, shape, IFRT sharding and memory kind of the program's ``index``-th result."""
        first = shards[0]
        memory = program.output_memory_kinds[index] if index < len(program.output_memory_kinds) else None
        if len(program.device_ids) == 1:
            sharding = single_device_sharding(program.device_ids[0], memory)
        else:
            op = program.output_shardings[index] if index < len(program.output_shardings) else replicated()
            sharding = hlo_sharding(program.device_ids, memory, op.SerializeToString())
        shape = program.output_shapes[index] if index < len(program.output_shapes) else tuple(first.shape)
        return dtype_kind(first.dtype), shape, sharding, memory


def _nbytes(held: ProxyArray) -> int:
    return int(np.prod(held.shape, dtype=np.int64)) * numpy_dtype(held.kind).itemsize
