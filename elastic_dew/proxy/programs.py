"""The program requests of a session on the local Pathways backend: compile, run, describe, delete.

:class:`ProgramRequests` answers a client's requests about its programs: each is compiled
on the CPU client from the MLIR the client sends (a program with host callbacks is refused,
:data:`UNSERVED`), run on the arrays it names (where the step rule counts it and a fault
schedule fires, :class:`~elastic_dew.proxy.faults.StepSchedule`), described and deleted.
"""

from __future__ import annotations

from typing import Any

from elastic_dew.proxy import backend as be
from elastic_dew.proxy import ifrt, protocol
from elastic_dew.proxy.backend import ProxyBackend
from elastic_dew.proxy.ifrt import ProxyError

__all__ = ["ProgramRequests", "UNSERVED"]

#: What the boundary does not serve, and the error the program sees (docs/simulator.md).
UNSERVED = {
    "host_callbacks": "programs with host callbacks (jax.debug.print, jax.pure_callback, io_callback) are not "
                      "served by the local Pathways backend",
}


class ProgramRequests:
    """The program handlers of a :class:`~elastic_dew.proxy.session.Session`."""

    backend: ProxyBackend

    def _new(self, short: str) -> Any:
        return protocol.message(short)()

    def _compile_request(self, request: Any) -> Any:
        if len(request.host_callbacks):
            raise ProxyError(ifrt.UNIMPLEMENTED, UNSERVED["host_callbacks"])
        if request.program.type_name not in ("xla::ifrt::HloProgram", "xla::ifrt::XlaProgram"):
            raise ProxyError(ifrt.UNIMPLEMENTED, f"the local Pathways backend compiles XLA programs only, not "
                                               f"{request.program.type_name}")
        options = request.compile_options
        if options.type_name != "xla::ifrt::XlaCompileOptions":
            raise ProxyError(ifrt.UNIMPLEMENTED, f"compile options of type {options.type_name} are not served")
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
            out.fingerprint_error.code = ifrt.UNIMPLEMENTED
            out.fingerprint_error.message = str(error)
        out.ready_future_handle = self.backend.future()
        return out

    def _program(self, handle: int) -> be.ProxyProgram:
        program = self.backend.programs.get(handle)
        if program is None:
            raise ProxyError(ifrt.NOT_FOUND, f"executable handle {handle} is unknown to the local Pathways backend")
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
        out.parameter_layouts_error.code = ifrt.UNIMPLEMENTED
        out.parameter_layouts_error.message = "default layouts"
        out.output_layouts_error.code = ifrt.UNIMPLEMENTED
        out.output_layouts_error.message = "default layouts"
        kinds = out.output_memory_kinds.memory_kind_lists.add()
        kinds.memory_kinds.extend(program.output_memory_kinds)
        out.donated_input_indices.SetInParent()
        out.compiled_memory_stats_error.code = ifrt.UNIMPLEMENTED
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
            if results:
                self.backend.pending[status] = results[0].epochs
            if not request.result_status_handle:
                out.status_handle = status
        return out

    def _loaded_executable_fetch_execute_result_request(self, request: Any) -> Any:
        status = self.backend.futures.pop(request.result_status_handle, None)
        epochs = self.backend.pending.pop(request.result_status_handle, ())
        self.backend.slices.await_answer(epochs)  # a run on a hung slice answers when it does
        gone = self.backend.slices.lost_among(epochs)
        if status is None and gone:
            status = (self.backend.slices.code_of(gone[0]), f"the program's results were on slice {gone[0]}, "
                                                             "which is lost (elastic-dew local Pathways backend)")
        if status is not None:
            raise ProxyError(*status)
        return self._new("LoadedExecutableFetchExecuteResultResponse")

    def _loaded_executable_cost_analysis_request(self, request: Any) -> Any:
        out = self._new("LoadedExecutableCostAnalysisResponse")
        out.status.code = ifrt.UNIMPLEMENTED
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
            raise ProxyError(ifrt.INVALID_ARGUMENT, f"{replicas} replicas x {partitions} partitions need "
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
