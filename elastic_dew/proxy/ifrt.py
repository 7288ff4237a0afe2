"""What the IFRT proxy protocol describes, read and written for the local Pathways backend.

The error codes it answers with (``tensorflow.error.Code``) and :class:`ProxyError`, the
IFRT dtype kinds and the numpy dtypes they are, the IFRT shardings a client sends and reads
(single-device, HLO, concrete-even, opaque) and a compiled module's name and results
(:func:`read_module`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from elastic_dew.proxy import protocol

__all__ = ["ProxyError", "DTYPES", "numpy_dtype", "dtype_kind", "parse_sharding", "sharding_devices",
           "single_device_sharding", "hlo_sharding", "moved_sharding", "read_module", "replicated"]

#: ``tensorflow.error.Code`` values the backend reports.
OK, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, FAILED_PRECONDITION, UNIMPLEMENTED, INTERNAL, DATA_LOSS = (
    0, 3, 4, 5, 9, 12, 13, 15)

#: IFRT DType kinds and the numpy dtypes they are (``DTypeProto.Kind``).
DTYPES: dict[int, str] = {
    1: "bool", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "uint8", 7: "uint16", 8: "uint32",
    9: "uint64", 10: "float16", 11: "float32", 12: "float64", 15: "complex64", 16: "bfloat16",
    18: "complex128", 19: "float8_e5m2", 20: "float8_e4m3fn", 21: "int4", 22: "uint4",
}
_KINDS = {name: kind for kind, name in DTYPES.items()}


class ProxyError(Exception):
    """A request the backend refuses or fails; :attr:`code` is its ``tensorflow.error.Code``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def numpy_dtype(kind: int) -> np.dtype:
    name = DTYPES.get(kind)
    if name is None:
        raise ProxyError(UNIMPLEMENTED, f"the local Pathways backend holds no arrays of IFRT dtype kind {kind}")
    if name in ("bfloat16", "float8_e5m2", "float8_e4m3fn", "int4", "uint4"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def dtype_kind(dtype: Any) -> int:
    name = np.dtype(dtype).name
    if name not in _KINDS:
        raise ProxyError(UNIMPLEMENTED, f"the local Pathways backend cannot describe dtype {name} to the client")
    return _KINDS[name]



# IFRT serialisation names of the shardings the client sends and reads.
SINGLE = "xla::ifrt::SingleDeviceSharding"
HLO = "xla::ifrt::HloSharding"
CONCRETE_EVEN = "xla::ifrt::ConcreteEvenSharding"
OPAQUE = "xla::ifrt::OpaqueSharding"
_SHARDING_MESSAGES = {
    SINGLE: "xla.ifrt.SingleDeviceShardingProto",
    HLO: "xla.ifrt.HloShardingProto",
    CONCRETE_EVEN: "xla.ifrt.ConcreteEvenShardingProto",
    OPAQUE: "xla.ifrt.OpaqueShardingProto",
}


def parse_sharding(proto: Any) -> tuple[str, Any]:
    """The serialisation type and the decoded message of an IFRT ``ShardingProto``."""
    serialized = proto.serialized_sharding
    name = _SHARDING_MESSAGES.get(serialized.type_name)
    if name is None:
        raise ProxyError(UNIMPLEMENTED, f"the local Pathways backend does not serve arrays with an IFRT sharding "
                                        f"of type {serialized.type_name!r}")
    return serialized.type_name, protocol.message(name).FromString(serialized.data)


def sharding_devices(proto: Any) -> tuple[tuple[int, ...], str | None]:
    """The device ids and memory kind of an IFRT ``ShardingProto``."""
    kind, inner = parse_sharding(proto)
    memory = inner.memory_kind if inner.HasField("memory_kind") else None
    if kind == SINGLE:
        return (inner.device_id,), memory
    return tuple(inner.devices.device_ids), memory


def single_device_sharding(device_id: int, memory_kind: str | None) -> Any:
    inner = protocol.message("xla.ifrt.SingleDeviceShardingProto")(device_id=device_id)
    if memory_kind is not None:
        inner.memory_kind = memory_kind
    return _wrap(SINGLE, inner)


def hlo_sharding(device_ids: Sequence[int], memory_kind: str | None, op_sharding: bytes) -> Any:
    inner = protocol.message("xla.ifrt.HloShardingProto")()
    inner.devices.device_ids.extend(device_ids)
    inner.xla_op_sharding.ParseFromString(op_sharding)
    if memory_kind is not None:
        inner.memory_kind = memory_kind
    return _wrap(HLO, inner)


def moved_sharding(proto: Any, device_ids: Sequence[int], memory_kind: str | None) -> Any:
    """``proto`` with its devices replaced by ``device_ids`` and its memory kind by ``memory_kind``."""
    kind, inner = parse_sharding(proto)
    if kind == SINGLE:
        inner.device_id = device_ids[0]
    else:
        del inner.devices.device_ids[:]
        inner.devices.device_ids.extend(device_ids)
    if memory_kind is not None:
        inner.memory_kind = memory_kind
    return _wrap(kind, inner)


def _wrap(kind: str, inner: Any) -> Any:
    proto = protocol.message("xla.ifrt.ShardingProto")()
    proto.serialized_sharding.type_name = kind
    proto.serialized_sharding.data = inner.SerializeToString()
    return proto


def read_module(mlir: bytes) -> tuple[str, list[tuple[int, ...]], int]:
    """The module's name, the global shapes of its ``main`` function's results and their bytes."""
    from elastic_dew._compat import jax as jax_private
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with jax_private.MLIR_CONTEXT.get()() as context:
        if mlir[:4] == b"ML\xefR" and b"StableHLO_v" in mlir[:64]:
            module = stablehlo.deserialize_portable_artifact(context, mlir)
        else:
            module = ir.Module.parse(mlir)
        attributes = module.operation.attributes
        name = ir.StringAttr(attributes["sym_name"]).value if "sym_name" in attributes else "program"
        for op in module.body.operations:
            if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                function = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                types = [ir.RankedTensorType(t) for t in function.results]
                size = sum(int(np.prod(t.shape, dtype=np.int64)) * _element_bytes(str(t.element_type))
                           for t in types)
                return name, [tuple(t.shape) for t in types], size
    raise ProxyError(INVALID_ARGUMENT, f"program {name} has no main function")


def _element_bytes(element: str) -> int:
    """The bytes of one element of MLIR element type ``element`` (``f32``, ``bf16``, ``i1``)."""
    if element.startswith("complex<"):
        return 2 * _element_bytes(element[len("complex<"):-1])
    match = re.search(r"\d+", element)
    return max(1, int(match.group()) // 8) if match else 1


def replicated() -> Any:
    from elastic_dew._compat import jax as jax_private

    op = jax_private.XLA_OP_SHARDING.get()()
    op.type = op.type.REPLICATED if hasattr(op.type, "REPLICATED") else 1
    return op
