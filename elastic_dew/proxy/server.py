"""The gRPC face of the local Pathways backend: the IFRT proxy service jaxlib's client calls.

:class:`ProxyService` serves ``xla.ifrt.proxy.GrpcIfrtService`` (its messages from
:mod:`elastic_dew.proxy.protocol`): ``GetVersion`` picks the protocol version
(:func:`~elastic_dew.proxy.protocol.choose_version`, refusing with one line a client it does
not speak), ``IfrtSession`` is one client's stream of requests, each answered in order by a
:class:`Session` on the :class:`~elastic_dew.proxy.backend.ProxyBackend`, and the host-buffer
calls move array bytes between the client and the session's buffer store.

A request the backend cannot serve is answered with an error status in that response's
metadata (the client raises it where the program asked), never by ending the stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np

from elastic_dew.proxy import backend as be
from elastic_dew.proxy import protocol
from elastic_dew.proxy.backend import ProxyBackend, ProxyArray, ProxyError

__all__ = ["ProxyService", "Session", "UNSERVED"]

logger = logging.getLogger(__name__)

_SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
_STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
_CHUNK = 1 << 20

#: What the boundary does not serve, and the error the program sees (docs/simulator.md).
UNSERVED = {
    "host_callbacks": "programs with host callbacks (jax.debug.print, jax.pure_callback, io_callback) are not "
                      "served by the local Pathways backend",
}


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


class Session:
    """One client's session: its host buffers and the answer to each of its requests."""

    def __init__(self, backend: ProxyBackend, version: int, session_id: int, buffers: HostBuffers):
        self.backend, self.version, self.session_id, self.buffers = backend, version, session_id, buffers
        self._seq = 0

    # ------------------------------------------------------------------ dispatch

    def answer(self, request: Any) -> Any:
        """The response to ``request`` (an ``IfrtRequest``)."""
        response = protocol.message("IfrtResponse")()
        response.response_metadata.op_id = request.request_metadata.op_id
        which = request.WhichOneof("request")
        handler = getattr(self, f"_{which}", None)
        try:
            if handler is None:
                raise ProxyError(be.UNIMPLEMENTED, f"the local Pathways backend does not serve {which}")
            body = handler(getattr(request, which))
            getattr(response, which.replace("_request", "_response")).CopyFrom(body)
            response.response_metadata.seq_num = self._seq
            self._seq += 1
        except ProxyError as error:
            response.response_metadata.status.code = error.code
            response.response_metadata.status.message = str(error)
            if error.code == be.DATA_LOSS and self.backend.stepper is not None:
                self.backend.stepper.met_loss()
        except Exception as error:  # noqa: BLE001 - every failure goes back to the client, never ends the stream
            logger.exception("request %s failed", which)
            response.response_metadata.status.code = be.INTERNAL
            response.response_metadata.status.message = f"{type(error).__name__}: {error}"
        return response

    def _new(self, short: str) -> Any:
        return protocol.message(short)()

    def _take_buffer(self, handle: int) -> bytes:
        return self.buffers.take(handle)

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
            self.backend.check_readable(held)
            for shard in held.shards:
                shard.block_until_ready()
        return self._new("CheckValueReadyResponse")

    # ------------------------------------------------------------------ arrays from and to the host

    def _host_array(self, kind: int, shape: tuple[int, ...], data: bytes, strides: Any) -> np.ndarray:
        dtype = be.numpy_dtype(kind)
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
        device_ids, memory = be.sharding_devices(request.sharding)
        kind, inner = be.parse_sharding(request.sharding)
        if kind == be.HLO and len(device_ids) > 1:
            # a whole array for a sharded layout: each device takes its own part
            held = self._sharded_from_whole(request.dtype.kind, shape, request.sharding, value)
        else:
            shards = self.backend.shards_on([value] * len(device_ids), device_ids, memory)
            held = self.backend.make_held(request.dtype.kind, shape, request.sharding, shards)
        handle = request.array_handle if request.HasField("array_handle") else self.backend.new_handle()
        self.backend.put(handle, held)
        out = self._new("MakeArrayFromHostBufferResponse")
        out.array_handle = handle
        return out

    def _sharded_from_whole(self, kind: int, shape: tuple[int, ...], sharding: Any, value: np.ndarray) -> ProxyArray:
        from elastic_dew._compat import jax as jax_private

        device_ids, memory = be.sharding_devices(sharding)
        _, inner = be.parse_sharding(sharding)
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
            device_ids, memory = be.sharding_devices(array_spec.sharding)
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
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            self.backend.put(handle, held)
            out.array_handles.append(handle)
        return out

    def _make_error_arrays_request(self, request: Any) -> Any:
        out = self._new("MakeErrorArraysResponse")
        handles = list(request.array_handles)
        for index, spec in enumerate(request.array_specs):
            held = self.backend.make_held(spec.dtype.kind, tuple(spec.shape.dims), spec.sharding, [],
                                          (request.error.code or be.INTERNAL, request.error.message))
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, held))
        return out

    def _copy_to_host_buffer_request(self, request: Any) -> Any:
        held = self.backend.get(request.array_handle)
        value = np.ascontiguousarray(self.backend.to_numpy(held))
        strides = tuple(request.byte_strides.strides) if request.HasField("byte_strides") else ()
        data = _with_strides(value, strides) if strides and strides != value.strides else value.tobytes()
        self.buffers.put(request.host_buffer_handle, data)
        return self._new("CopyToHostBufferResponse")

    # ------------------------------------------------------------------ arrays from arrays

    def _assemble_array_from_single_device_arrays_request(self, request: Any) -> Any:
        parts = [self.backend.get(h) for h in request.single_device_array_handles]
        device_ids, _ = be.sharding_devices(request.sharding)
        by_device = {p.device_ids[0]: p for p in parts if p.device_ids}
        shards = [by_device[d].shards[0] for d in device_ids if d in by_device and by_device[d].shards]
        kind = request.dtype.kind if request.HasField("dtype") else parts[0].kind
        error = next((e for e in (self.backend.status(p) for p in parts) if e is not None), None)
        held = self.backend.make_held(kind, tuple(request.shape.dims), request.sharding, shards, error)
        held.epochs = tuple(sorted({e for p in parts for e in p.epochs}))
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
            part = ProxyArray(held.kind, tuple(shard.shape), be.single_device_sharding(device_id, held.memory_kind),
                        (device_id,), held.memory_kind, [shard], self.backend.slices.epochs((device_id,)), held.error)
            part.epochs = tuple(e for e in held.epochs if e[0] == self.backend.slices.slice_of(device_id))
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, part))
        return out

    def _copy_arrays_request(self, request: Any) -> Any:
        out = self._new("CopyArraysResponse")
        handles = list(request.result_handles)
        memory = request.memory_kind if request.HasField("memory_kind") else None
        targets = list(request.device_ids)
        for index, source in enumerate(request.array_handles):
            held = self.backend.get(source)
            shards = self.backend.shards_on(held.shards, targets[:len(held.shards)], memory)
            moved = be.moved_sharding(held.sharding, targets, memory)
            copy = self.backend.make_held(held.kind, held.shape, moved, shards, self.backend.status(held))
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            out.array_handles.append(self.backend.put(handle, copy))
        return out

    def _fully_replicated_shard_request(self, request: Any) -> Any:
        held = self.backend.get(request.array_handle)
        device_id = held.device_ids[0]
        part = ProxyArray(held.kind, held.shape, be.single_device_sharding(device_id, held.memory_kind), (device_id,),
                    held.memory_kind, held.shards[:1], held.epochs, held.error)
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
            value = self.backend.to_numpy(held) if self.backend.status(held) is None else None
            shape = tuple(spec.shape.dims)
            if value is None:
                copy = self.backend.make_held(spec.dtype.kind, shape, spec.sharding, [], self.backend.status(held))
            else:
                kind, _ = be.parse_sharding(spec.sharding)
                if kind == be.HLO:
                    copy = self._sharded_from_whole(spec.dtype.kind, shape, spec.sharding, value)
                else:
                    device_ids, memory = be.sharding_devices(spec.sharding)
                    copy = self.backend.make_held(spec.dtype.kind, shape, spec.sharding,
                                                  self.backend.shards_on([value] * len(device_ids), device_ids, memory))
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
        for mapping in plan.mappings:
            source = inputs[mapping.in_array]
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

    # ------------------------------------------------------------------ programs

    def _compile_request(self, request: Any) -> Any:
        if len(request.host_callbacks):
            raise ProxyError(be.UNIMPLEMENTED, UNSERVED["host_callbacks"])
        if request.program.type_name not in ("xla::ifrt::HloProgram", "xla::ifrt::XlaProgram"):
            raise ProxyError(be.UNIMPLEMENTED, f"the local Pathways backend compiles XLA programs only, not "
                                               f"{request.program.type_name}")
        options = request.compile_options
        if options.type_name != "xla::ifrt::XlaCompileOptions":
            raise ProxyError(be.UNIMPLEMENTED, f"compile options of type {options.type_name} are not served")
        xla_options = protocol.message("xla.ifrt.XlaCompileOptionsProto").FromString(options.data)
        program = self.backend.compile(request.program.data, xla_options.compile_options.SerializeToString(), None)
        name = program.name
        handle = self.backend.new_handle()
        self.backend.programs[handle] = program
        out = self._new("CompileResponse")
        out.loaded_executable_handle = handle
        out.name = name
        out.num_devices = len(program.device_ids)
        out.device_ids.extend(program.device_ids)
        out.addressable_device_ids.extend(program.device_ids)
        try:
            out.fingerprint_value = (program.executable.fingerprint or b"")
        except Exception as error:  # noqa: BLE001 - the CPU client may have none
            out.fingerprint_error.code = be.UNIMPLEMENTED
            out.fingerprint_error.message = str(error)
        out.ready_future_handle = self.backend.future()
        return out

    def _program(self, handle: int) -> be.ProxyProgram:
        program = self.backend.programs.get(handle)
        if program is None:
            raise ProxyError(be.NOT_FOUND, f"executable handle {handle} is unknown to the local Pathways backend")
        return program

    def _loaded_executable_metadata_request(self, request: Any) -> Any:
        program = self._program(request.loaded_executable_handle)
        out = self._new("LoadedExecutableMetadataResponse")
        for op in program.parameter_shardings:
            out.parameter_shardings.shardings.add().ParseFromString(op.SerializeToString())
        for op in program.output_shardings:
            out.output_shardings.shardings.add().ParseFromString(op.SerializeToString())
        if not program.parameter_shardings:
            out.ClearField("parameter_shardings")
        if not program.output_shardings:
            out.ClearField("output_shardings")
        out.parameter_layouts_error.code = be.UNIMPLEMENTED
        out.parameter_layouts_error.message = "default layouts"
        out.output_layouts_error.code = be.UNIMPLEMENTED
        out.output_layouts_error.message = "default layouts"
        kinds = out.output_memory_kinds.memory_kind_lists.add()
        kinds.memory_kinds.extend(program.output_memory_kinds)
        out.donated_input_indices.SetInParent()
        out.compiled_memory_stats_error.code = be.UNIMPLEMENTED
        out.compiled_memory_stats_error.message = "not measured by the local Pathways backend"
        out.size_of_generated_code_in_bytes = 0
        return out

    def _loaded_executable_execute_request(self, request: Any) -> Any:
        program = self._program(request.loaded_executable_handle)
        args = [self.backend.get(h) for h in request.args_handles]
        results, error = self.backend.execute(program, args)
        out = self._new("LoadedExecutableExecuteResponse")
        handles = list(request.result_array_handle)
        for index, held in enumerate(results):
            handle = handles[index] if index < len(handles) else self.backend.new_handle()
            self.backend.put(handle, held)
            o = out.outputs.add()
            o.dtype.kind = held.kind
            o.shape.dims.extend(held.shape)
            o.sharding.CopyFrom(held.sharding)
            o.array_handle = handle
        if request.execute_options.fill_status:  # else the client expects no status future
            status = request.result_status_handle or self.backend.new_handle()
            self.backend.futures[status] = error
            if not request.result_status_handle:
                out.status_handle = status
        return out

    def _loaded_executable_fetch_execute_result_request(self, request: Any) -> Any:
        status = self.backend.futures.pop(request.result_status_handle, None)
        if status is not None:
            raise ProxyError(*status)
        return self._new("LoadedExecutableFetchExecuteResultResponse")

    def _loaded_executable_cost_analysis_request(self, request: Any) -> Any:
        out = self._new("LoadedExecutableCostAnalysisResponse")
        out.status.code = be.UNIMPLEMENTED
        out.status.message = "no cost analysis on the local Pathways backend"
        return out

    def _loaded_executable_human_readable_program_text_request(self, request: Any) -> Any:
        program = self._program(request.loaded_executable_handle)
        out = self._new("LoadedExecutableHumanReadableProgramTextResponse")
        out.human_readable_program_text = program.executable.get_hlo_text()
        return out

    def _loaded_executable_delete_request(self, request: Any) -> Any:
        self.backend.programs.pop(request.loaded_executable_handle, None)
        out = self._new("LoadedExecutableDeleteResponse")
        out.future_handle = self.backend.future()
        return out

    def _loaded_executable_is_deleted_request(self, request: Any) -> Any:
        out = self._new("LoadedExecutableIsDeletedResponse")
        out.is_deleted = request.loaded_executable_handle not in self.backend.programs
        return out

    def _loaded_executable_destruct_request(self, request: Any) -> Any:
        self.backend.programs.pop(request.loaded_executable_handle, None)
        return self._new("LoadedExecutableDestructResponse")

    def _get_default_device_assignment_request(self, request: Any) -> Any:
        replicas, partitions = request.num_replicas, request.num_partitions
        if replicas * partitions > len(self.backend.devices):
            raise ProxyError(be.INVALID_ARGUMENT, f"{replicas} replicas x {partitions} partitions need "
                                                  f"{replicas * partitions} devices; the backend has "
                                                  f"{len(self.backend.devices)}")
        out = self._new("GetDefaultDeviceAssignmentResponse")
        out.device_assignment.replica_count = replicas
        out.device_assignment.computation_count = partitions
        for c in range(partitions):
            out.device_assignment.computation_devices.add().replica_device_ids.extend(
                r * partitions + c for r in range(replicas))
        return out

    def _get_default_layout_request(self, request: Any) -> Any:
        # a PjRtLayout serializes as its XLA layout's text: minor-to-major dimensions in braces
        out = self._new("GetDefaultLayoutResponse")
        out.serialized_pjrt_layout = ("{" + ",".join(map(str, reversed(range(len(request.dims))))) + "}").encode()
        return out


def _with_strides(value: np.ndarray, strides: tuple[int, ...]) -> bytes:
    """The bytes of ``value`` laid out with byte ``strides`` (dense: a permutation of the
    dimensions, as a Fortran-order or transposed read asks)."""
    order = sorted(range(value.ndim), key=lambda i: -strides[i])
    return np.ascontiguousarray(value.transpose(order)).tobytes()


class ProxyService:
    """The ``GrpcIfrtService`` handlers over one :class:`ProxyBackend` (every session shares it)."""

    def __init__(self, backend: ProxyBackend):
        self.backend = backend
        self._lock = threading.Lock()
        self._next_session = 1
        self._stores: dict[int, HostBuffers] = {}
        self.refusals: list[str] = []
        self.sessions = 0

    def handler(self) -> grpc.GenericRpcHandler:
        m = protocol.message
        return grpc.method_handlers_generic_handler(protocol.SERVICE, {
            "GetVersion": grpc.unary_unary_rpc_method_handler(
                self.get_version, m("GrpcGetVersionRequest").FromString, _serialize),
            "IfrtSession": grpc.stream_stream_rpc_method_handler(
                self.ifrt_session, m("IfrtRequest").FromString, _serialize),
            "HostBufferStore": grpc.stream_unary_rpc_method_handler(
                self.host_buffer_store, m("GrpcHostBufferStoreRequest").FromString, _serialize),
            "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
                self.host_buffer_lookup, m("GrpcHostBufferLookupRequest").FromString, _serialize),
            "HostBufferDelete": grpc.unary_unary_rpc_method_handler(
                self.host_buffer_delete, m("GrpcHostBufferDeleteRequest").FromString, _serialize),
        })

    def get_version(self, request: Any, context: grpc.ServicerContext) -> Any:
        logger.info("a client offers protocol versions %d-%d, IFRT SerDes versions %d-%d",
                    request.min_version.protocol_version, request.max_version.protocol_version,
                    request.min_version.ifrt_serdes_version_number, request.max_version.ifrt_serdes_version_number)
        try:
            version = protocol.choose_version(request.min_version.protocol_version,
                                              request.max_version.protocol_version)
        except protocol.ProtocolMismatch as refusal:
            with self._lock:
                first = not self.refusals
                self.refusals.append(str(refusal))
            if first:
                logger.error("%s", refusal)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(refusal))
        low, high = protocol.SERDES_VERSIONS
        serdes = min(high, request.max_version.ifrt_serdes_version_number)
        if serdes < max(low, request.min_version.ifrt_serdes_version_number):
            message = (f"elastic-dew proxy reads IFRT SerDes versions {low}-{high}; this client offers "
                       f"{request.min_version.ifrt_serdes_version_number}-"
                       f"{request.max_version.ifrt_serdes_version_number}")
            self.refusals.append(message)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, message)
        out = protocol.message("GrpcGetVersionResponse")()
        out.version.protocol_version = version
        out.version.ifrt_serdes_version_number = serdes
        return out

    def ifrt_session(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        metadata = dict(context.invocation_metadata())
        raw = metadata.get(_SESSION_METADATA)
        if raw is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"missing session metadata {_SESSION_METADATA}")
        session_metadata = protocol.message("GrpcIfrtSessionMetadata").FromString(raw)
        with self._lock:
            session_id = self._next_session
            self._next_session += 1
            self.sessions += 1
            store = self._stores[session_id] = HostBuffers()
        session = Session(self.backend, session_metadata.version.protocol_version, session_id, store)
        logger.info("session %d: protocol version %d", session_id, session.version)
        try:
            for request in requests:
                yield session.answer(request)
        finally:
            with self._lock:
                self._stores.pop(session_id, None)
            logger.info("session %d ended", session_id)

    def _store(self, session_id: int, context: grpc.ServicerContext) -> HostBuffers:
        with self._lock:
            store = self._stores.get(session_id)
        if store is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"session {session_id} does not exist")
        assert store is not None, "grpc's abort raises"
        return store

    def host_buffer_store(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        metadata = dict(context.invocation_metadata())
        raw = metadata.get(_STORE_METADATA)
        if raw is None:
            context.abort(grpc.StatusCode.INTERNAL, "missing host buffer store metadata")
        meta = protocol.message("GrpcHostBufferStoreMetadata").FromString(raw)
        store = self._store(meta.session_id, context)
        data = b"".join(r.data for r in requests)
        if len(data) != meta.buffer_size:
            context.abort(grpc.StatusCode.DATA_LOSS, f"expected {meta.buffer_size} bytes, got {len(data)}")
        store.put(meta.handle, data)
        return protocol.message("GrpcHostBufferStoreResponse")()

    def host_buffer_lookup(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        store = self._store(request.session_id, context)
        data = store.get(request.handle)
        if data is None:  # copy_to_host_buffer answers before the lookup asks
            context.abort(grpc.StatusCode.NOT_FOUND, f"host buffer {request.handle} does not exist")
        assert data is not None, "grpc's abort raises"
        response = protocol.message("GrpcHostBufferLookupResponse")
        if not data:
            yield response()
        for offset in range(0, len(data), _CHUNK):
            yield response(data=data[offset:offset + _CHUNK])

    def host_buffer_delete(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._store(request.session_id, context).pop(request.handle)
        return protocol.message("GrpcHostBufferDeleteResponse")()


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()
