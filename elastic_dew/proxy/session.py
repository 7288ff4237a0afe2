"""One client's session on the local Pathways backend: the answer to each of its requests.

:class:`Session` answers each ``IfrtRequest`` of one client's stream on the
:class:`~elastic_dew.proxy.backend.ProxyBackend`: its arrays from and to the host, arrays
from arrays, readiness and futures here, its programs in
:class:`~elastic_dew.proxy.programs.ProgramRequests`. A request the backend cannot serve
is answered with an error status in that response's metadata (the client raises it where
the program asked), never by ending the stream. :class:`HostBuffers` holds the session's
host buffers, which move on separate streams.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from elastic_dew.proxy import ifrt, protocol
from elastic_dew.proxy.backend import ProxyArray, ProxyBackend
from elastic_dew.proxy.ifrt import ProxyError
from elastic_dew.proxy.programs import ProgramRequests
from elastic_dew.proxy.slices import SLICE_DOWN

__all__ = ["Session", "HostBuffers"]

logger = logging.getLogger(__name__)

#: How long a request waits for the host buffer it names to arrive (a separate stream).
BUFFER_WAIT_S = 60.0


class HostBuffers:
    """One session's host buffers by handle; a request may name one still arriving."""

    def __init__(self) -> None:
        self._data: dict[int, bytes] = {}
        self._arrived = threading.Condition()

    def put(self, handle: int, data: bytes) -> None:
        with self._arrived:
            self._data[handle] = data
            self._arrived.notify_all()

    def get(self, handle: int) -> bytes | None:
        with self._arrived:
            return self._data.get(handle)

    def pop(self, handle: int) -> None:
        with self._arrived:
            self._data.pop(handle, None)

    def take(self, handle: int, timeout: float = BUFFER_WAIT_S) -> bytes:
        """The buffer ``handle``, removed; waits up to ``timeout`` seconds for it to arrive.

        Raises:
            ProxyError: DEADLINE_EXCEEDED when it does not arrive in time.
        """
        with self._arrived:
            if not self._arrived.wait_for(lambda: handle in self._data, timeout):
                raise ProxyError(4, f"host buffer {handle} did not arrive within {timeout:g} s")
            return self._data.pop(handle)


class Session(ProgramRequests):
    """One client's session: its host buffers and the answer to each of its requests."""

    def __init__(self, backend: ProxyBackend, version: int, session_id: int, buffers: HostBuffers):
        self.backend, self.version, self.session_id, self.buffers = backend, version, session_id, buffers

    # ------------------------------------------------------------------ dispatch

    def answer(self, request: Any) -> Any:
        """The response to ``request`` (an ``IfrtRequest``)."""
        response = protocol.message("IfrtResponse")()
        response.response_metadata.op_id = request.request_metadata.op_id
        which = request.WhichOneof("request")
        handler = getattr(self, f"_{which}", None)
        try:
            if handler is None:
                raise ProxyError(ifrt.UNIMPLEMENTED, f"the local Pathways backend does not serve {which}")
            body = handler(getattr(request, which))
            getattr(response, which.replace("_request", "_response")).CopyFrom(body)
        except ProxyError as error:
            response.response_metadata.status.code = error.code
            response.response_metadata.status.message = str(error)
            if error.code in SLICE_DOWN.values() and self.backend.stepper is not None:
                self.backend.stepper.met_loss()
        except Exception as error:  # noqa: BLE001 - every failure goes back to the client, never ends the stream
            logger.exception("request %s failed", which)
            response.response_metadata.status.code = ifrt.INTERNAL
            response.response_metadata.status.message = f"{type(error).__name__}: {error}"
        return response

    def _take_buffer(self, handle: int) -> bytes:
        return self.buffers.take(handle)

    @property
    def _records(self) -> Any:
        """The backend's records of the program's state (:class:`~elastic_dew.proxy.records.StateRecords`),
        or ``None`` when it keeps none."""
        stepper = self.backend.stepper
        return stepper.records if stepper is not None else None

    def _placing(self, device_ids: Any, api: str) -> None:
        if self.backend.stepper is not None:
            self.backend.stepper.placing(device_ids, api)

    def _sent(self, values: Any, memory: str | None) -> Any:
        """The mark of arrays made from host ``values`` into ``memory`` (a state read to the host earlier)."""
        from elastic_dew.proxy.records import newest

        records = self._records
        return newest(records.sent(np.ascontiguousarray(v).tobytes(), memory) for v in values) if records else None

    def _copied(self, held: ProxyArray, memory: str | None) -> Any:
        records = self._records
        return records.copied(held.mark, held.memory_kind, memory) if records is not None else None

    # ------------------------------------------------------------------ session

    def _init_request(self, request: Any) -> Any:
        out = self._new("InitResponse")
        out.session_id = self.session_id
        out.platform_name = "cpu"
        out.platform_version = f"elastic-dew local Pathways backend on {self.backend.client.platform_version}"
        out.process_index = 0
        out.runtime_type = "proxy/elastic-dew"
        kinds = ("device", "pinned_host", "unpinned_host")
        for device in self.backend.devices:
            d = out.all_devices.add()
            d.id = device.id
            d.local_device_id = device.id
            d.local_hardware_id = device.id
            d.platform_name = "cpu"
            d.device_kind = device.device_kind
            slice_index = self.backend.slices.slice_of(device.id)
            d.debug_string = f"TFRT_CPU_{device.id}"
            d.to_string = f"CpuDevice(id={device.id}, slice_index={slice_index})"
            d.default_memory_id = device.id * len(kinds)
            d.memory_ids.extend(device.id * len(kinds) + k for k in range(len(kinds)))
            d.attributes.attributes["slice_index"].int64_value = slice_index
            out.primary_device_ids.append(device.id)
            out.addressable_device_ids.append(device.id)
            for k, kind in enumerate(kinds):
                m = out.memories.add()
                m.id = device.id * len(kinds) + k
                m.memory_space_kind = kind
                m.kind_id = k
                m.device_ids.append(device.id)
                m.debug_string = m.to_string = f"{kind}(device {device.id})"
        return out

    # ------------------------------------------------------------------ futures and readiness

    def _check_future_request(self, request: Any) -> Any:
        status = self.backend.futures.pop(request.future_handle, None)
        if status is not None:
            raise ProxyError(*status)
        return self._new("CheckFutureResponse")

    def _check_value_ready_request(self, request: Any) -> Any:
        for handle in request.value_handles:
            held = self.backend.arrays.get(handle)
            if held is None:
                continue  # an executable's handle: compiled before it was returned
            if self.backend.stepper is not None:
                self.backend.stepper.hold(held.producer, held.mark)
            if not self.backend.landed(held):
                self.backend.check_readable(held)
            for shard in held.shards:
                shard.block_until_ready()
        return self._new("CheckValueReadyResponse")

    # ------------------------------------------------------------------ arrays from and to the host

    def _host_array(self, kind: int, shape: tuple[int, ...], data: bytes, strides: Any) -> np.ndarray:
        dtype = ifrt.numpy_dtype(kind)
        flat = np.frombuffer(data, dtype=np.uint8)
        if strides is not None and len(strides.strides):
            value = np.lib.stride_tricks.as_strided(flat.view(dtype) if flat.size else flat, shape,
                                                    tuple(strides.strides))
            return np.ascontiguousarray(value)
        return flat.view(dtype).reshape(shape) if flat.size else np.zeros(shape, dtype)

    def _make_array_from_host_buffer_request(self, request: Any) -> Any:
        shape = tuple(request.shape.dims)
        value = self._host_array(request.dtype.kind, shape, self._take_buffer(request.host_buffer_handle),
                                 request.byte_strides if request.HasField("byte_strides") else None)
        device_ids, memory = ifrt.sharding_devices(request.sharding)
        self._placing(device_ids, "a transfer from the host")
        kind, inner = ifrt.parse_sharding(request.sharding)
        if kind == ifrt.HLO and len(device_ids) > 1:
            # a whole array for a sharded layout: each device takes its own part
            held = self._sharded_from_whole(request.dtype.kind, shape, request.sharding, value)
        else:
            shards = self.backend.shards_on([value] * len(device_ids), device_ids, memory)
            held = self.backend.make_held(request.dtype.kind, shape, request.sharding, shards)
        held.mark = self._sent([value], memory)
        handle = request.array_handle if request.HasField("array_handle") else self.backend.new_handle()
        self.backend.put(handle, held)
        out = self._new("MakeArrayFromHostBufferResponse")
        out.array_handle = handle
        return out

    def _sharded_from_whole(self, kind: int, shape: tuple[int, ...], sharding: Any, value: np.ndarray) -> ProxyArray:
        from elastic_dew._compat import jax as jax_private

        device_ids, memory = ifrt.sharding_devices(sharding)
        _, inner = ifrt.parse_sharding(sharding)
        op = jax_private.XLA_OP_SHARDING.get()()
        op.ParseFromString(inner.xla_op_sharding.SerializeToString())
        devices = [self.backend.device(d) for d in device_ids]
        indices = jax_private.XLA_GSPMD_SHARDING.get()(devices, op).devices_indices_map(shape)
        shards = self.backend.shards_on([value[indices[device]] for device in devices], device_ids, memory)
        return self.backend.make_held(kind, shape, sharding, shards)

    def _make_arrays_from_host_buffer_shards_request(self, request: Any) -> Any:
        out = self._new("MakeArraysFromHostBufferShardsResponse")
        handles = list(request.array_handles)
        for index, spec in enumerate(request.specs):
            array_spec = spec.array_spec
            shape = tuple(array_spec.shape.dims)
            device_ids, memory = ifrt.sharding_devices(array_spec.sharding)
            self._placing(device_ids, "a transfer from the host")
            values: dict[int, np.ndarray] = {}
            for indices, buffer in zip(spec.addressable_shard_indices, spec.host_buffers):
                value = self._host_array(buffer.dtype.kind, tuple(buffer.shape.dims),
                                         self._take_buffer(buffer.host_buffer_handle),
                                         buffer.byte_strides if buffer.HasField("byte_strides") else None)
                for position in indices.indices:
                    values[position] = value
            positions = sorted(values)
            shards = self.backend.shards_on([values[p] for p in positions], [device_ids[p] for p in positions], memory)
            held = self.backend.make_held(array_spec.dtype.kind, shape, array_spec.sharding, shards)
            held.mark = self._sent(values.values(), memory)
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            self.backend.put(handle, held)
            out.array_handles.append(handle)
        return out

    def _make_error_arrays_request(self, request: Any) -> Any:
        out = self._new("MakeErrorArraysResponse")
        handles = list(request.array_handles)
        for index, spec in enumerate(request.array_specs):
            held = self.backend.make_held(spec.dtype.kind, tuple(spec.shape.dims), spec.sharding, [],
                                          (request.error.code or ifrt.INTERNAL, request.error.message))
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, held))
        return out

    def _copy_to_host_buffer_request(self, request: Any) -> Any:
        held = self.backend.get(request.array_handle)
        if self.backend.stepper is not None:
            self.backend.stepper.hold(held.producer, held.mark)
        value = np.ascontiguousarray(self.backend.to_numpy(held))
        if self._records is not None:
            self._records.read(held.mark, value.tobytes(), held.memory_kind)
        strides = tuple(request.byte_strides.strides) if request.HasField("byte_strides") else ()
        data = _with_strides(value, strides) if strides and strides != value.strides else value.tobytes()
        self.buffers.put(request.host_buffer_handle, data)
        return self._new("CopyToHostBufferResponse")

    # ------------------------------------------------------------------ arrays from arrays

    def _assemble_array_from_single_device_arrays_request(self, request: Any) -> Any:
        parts = [self.backend.get(h) for h in request.single_device_array_handles]
        device_ids, _ = ifrt.sharding_devices(request.sharding)
        by_device = {p.device_ids[0]: p for p in parts if p.device_ids}
        shards = [by_device[d].shards[0] for d in device_ids if d in by_device and by_device[d].shards]
        kind = request.dtype.kind if request.HasField("dtype") else parts[0].kind
        error = next((e for e in (self.backend.status(p) for p in parts) if e is not None), None)
        held = self.backend.make_held(kind, tuple(request.shape.dims), request.sharding, shards, error)
        held.epochs = tuple(sorted({e for p in parts for e in p.epochs}))
        held.mark = _newest(p.mark for p in parts)
        handle = request.result_handle or self.backend.new_handle()
        self.backend.put(handle, held)
        out = self._new("AssembleArrayFromSingleDeviceArraysResponse")
        out.array_handle = handle
        return out

    def _disassemble_into_single_device_arrays_request(self, request: Any) -> Any:
        held = self.backend.get(request.array_handle)
        out = self._new("DisassembleIntoSingleDeviceArraysResponse")
        handles = list(request.result_handles)
        for index, (device_id, shard) in enumerate(zip(held.device_ids, held.shards)):
            part = ProxyArray(held.kind, tuple(shard.shape), ifrt.single_device_sharding(device_id, held.memory_kind),
                              (device_id,), held.memory_kind, [shard], self.backend.slices.epochs((device_id,)),
                              held.error, held.producer)
            part.epochs = tuple(e for e in held.epochs if e[0] == self.backend.slices.slice_of(device_id))
            part.mark = held.mark
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, part))
        return out

    def _copy_arrays_request(self, request: Any) -> Any:
        out = self._new("CopyArraysResponse")
        handles = list(request.result_handles)
        memory = request.memory_kind if request.HasField("memory_kind") else None
        targets = list(request.device_ids)
        self._placing(targets, "a copy")
        for index, source in enumerate(request.array_handles):
            held = self.backend.get(source)
            shards = self.backend.shards_on(held.shards, targets[:len(held.shards)], memory)
            moved = ifrt.moved_sharding(held.sharding, targets, memory)
            copy = self.backend.make_held(held.kind, held.shape, moved, shards, self.backend.status(held))
            copy.mark = self._copied(held, memory)
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, copy))
        return out

    def _fully_replicated_shard_request(self, request: Any) -> Any:
        held = self.backend.get(request.array_handle)
        device_id = held.device_ids[0]
        part = ProxyArray(held.kind, held.shape, ifrt.single_device_sharding(device_id, held.memory_kind), (device_id,),
                          held.memory_kind, held.shards[:1], held.epochs, held.error, held.producer, held.mark)
        handle = request.result_handle or self.backend.new_handle()
        self.backend.put(handle, part)
        out = self._new("FullyReplicatedShardResponse")
        out.array_handle = handle
        return out

    def _reshard_arrays_request(self, request: Any) -> Any:
        out = self._new("ReshardArraysResponse")
        handles = list(request.result_handles)
        for index, (source, spec) in enumerate(zip(request.array_handles, request.array_specs)):
            held = self.backend.get(source)
            self._placing(ifrt.sharding_devices(spec.sharding)[0], "a reshard")
            value = self.backend.to_numpy(held) if self.backend.status(held) is None else None
            shape = tuple(spec.shape.dims)
            if value is None:
                copy = self.backend.make_held(spec.dtype.kind, shape, spec.sharding, [], self.backend.status(held))
            else:
                kind, _ = ifrt.parse_sharding(spec.sharding)
                if kind == ifrt.HLO:
                    copy = self._sharded_from_whole(spec.dtype.kind, shape, spec.sharding, value)
                else:
                    device_ids, memory = ifrt.sharding_devices(spec.sharding)
                    copy = self.backend.make_held(spec.dtype.kind, shape, spec.sharding,
                                                  self.backend.shards_on([value] * len(device_ids), device_ids, memory))
            copy.mark = self._copied(held, ifrt.sharding_devices(spec.sharding)[1])
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, copy))
        return out

    def _remap_arrays_request(self, request: Any) -> Any:
        """Shards regrouped without moving data: each mapping takes the shards of input
        ``in_array`` in a strided range to the output ``out_array``'s shards in another."""
        plan = request.plan
        inputs = [self.backend.get(h) for h in request.array_handles]
        outputs: list[dict[int, Any]] = [{} for _ in plan.output_specs]
        errors: list[list[tuple[int, str]]] = [[] for _ in plan.output_specs]
        marks: list[list[Any]] = [[] for _ in plan.output_specs]
        for mapping in plan.mappings:
            source = inputs[mapping.in_array]
            marks[mapping.out_array].append(source.mark)
            status = self.backend.status(source)
            if status is not None:
                errors[mapping.out_array].append(status)
            for f_start, f_end, f_step, t_start, t_end, t_step in zip(
                    mapping.from_start, mapping.from_end, mapping.from_step,
                    mapping.to_start, mapping.to_end, mapping.to_step):
                for f, t in zip(range(f_start, f_end, f_step), range(t_start, t_end, t_step)):
                    outputs[mapping.out_array][t] = source.shards[f] if source.shards else None
        out = self._new("RemapArraysResponse")
        handles = list(request.result_handles)
        for index, spec in enumerate(plan.output_specs):
            shards = [outputs[index][t] for t in sorted(outputs[index])]
            held = self.backend.make_held(spec.dtype.kind, tuple(spec.shape.dims), spec.sharding,
                                          [s for s in shards if s is not None], errors[index][0] if errors[index] else None)
            held.mark = _newest(marks[index])
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, held))
        return out

    def _is_array_deleted_request(self, request: Any) -> Any:
        out = self._new("IsArrayDeletedResponse")
        out.deleted = request.array_handle not in self.backend.arrays
        return out

    def _delete_array_request(self, request: Any) -> Any:
        for handle in request.array_handle:
            self.backend.arrays.pop(handle, None)
        out = self._new("DeleteArrayResponse")
        out.deletion_future_handle = self.backend.future()
        return out

    def _destruct_array_request(self, request: Any) -> Any:
        for handle in request.array_handle:
            self.backend.arrays.pop(handle, None)
        return self._new("DestructArrayResponse")


def _newest(marks: Any) -> Any:
    from elastic_dew.proxy.records import newest

    return newest(marks)


def _with_strides(value: np.ndarray, strides: tuple[int, ...]) -> bytes:
    """The bytes of ``value`` laid out with byte ``strides`` (dense: a permutation of the
    dimensions, as a Fortran-order or transposed read asks)."""
    order = sorted(range(value.ndim), key=lambda i: -strides[i])
    return np.ascontiguousarray(value.transpose(order)).tobytes()
