"""JAX's and jaxlib's private names elastic_dew uses (read against jax 0.10.1, 0.10.2 and 0.12.0).

The runtime reads the process pool's state without starting a backend; the simulator
replaces the few places every host read and every dispatch of an array funnels through.
Nothing here imports JAX until a name is used.
"""

from __future__ import annotations

import sys
from typing import Any

from elastic_dew._compat import Private

__all__ = [
    "ARRAY_IMPL",
    "ARRAY_MEMBERS",
    "ARRAY_READS",
    "ARRAY_VALUE",
    "BATCHED_BLOCK_UNTIL_READY",
    "COLOCATED_CPU_DEVICES",
    "COLOCATED_DESERIALIZE",
    "COLOCATED_SERIALIZE",
    "DISTRIBUTED_INITIALIZE",
    "MLIR_CONTEXT",
    "SHAPED_ARRAY",
    "XLA_COMPILE_OPTIONS",
    "XLA_DEVICE_LIST",
    "XLA_GSPMD_SHARDING",
    "XLA_OP_SHARDING",
    "GET_FASTPATH_DATA",
    "JIT_FRAME_MODULES",
    "PRIVATE",
    "RUN_PYTHON_PJIT",
    "backends_started",
    "clear_jit_caches",
    "compiled_name",
    "jit_seam",
    "pool_client",
    "pool_process_id",
    "pool_size",
    "trace_state_clean",
]

_DISTRIBUTED_STATE = Private(
    "jax",
    "jax._src.distributed:global_state",
    why="the pool's coordination client (its key-value store), process id and process count, "
    "read without starting a backend: jax.process_index()/process_count() start one, and the "
    "runtime asks before XLA has read its flags",
    instead="a public accessor of the distributed client and pool size "
    "(jax.distributed.is_initialized() answers only whether a pool exists)",
)
_BACKENDS_INITIALIZED = Private(
    "jax",
    "jax._src.xla_bridge:backends_are_initialized",
    why="whether this process already opened a backend (XLA read its flags), asked without "
    "opening one; every public question (jax.devices()) opens it",
    instead="none public; a jax.extend.backend question that does not initialise",
)
ARRAY_IMPL = Private(
    "jax",
    "jax._src.array:ArrayImpl",
    why="jax.Array's one implementation: the simulator guards its reads (block_until_ready, "
    "__getitem__, __iter__, __array__, __dlpack__, item, is_ready, is_deleted, "
    "addressable_data, addressable_shards), which jax.Array (abstract) does not hold",
    instead="none: JAX has no hook on an array's host reads",
)
ARRAY_VALUE = Private(
    "jax",
    "jax._src.array:ArrayImpl._value",
    why="the property float(), int(), bool(), tolist() and repr() of an array read through; "
    "the simulator guards it",
    instead="none: JAX has no hook on an array's host reads",
)
#: ``ArrayImpl``'s members the simulator wraps, besides ``_value``: the host reads
#: (``block_until_ready`` ... ``item``), whether a result is ready or deleted, and the
#: shards a lost mark passes on to. Public names of a private class: the canary checks each
#: is still ``ArrayImpl``'s (the class, not an instance, holds it).
ARRAY_READS = ("block_until_ready", "__getitem__", "__iter__", "__array__", "__dlpack__", "item")
ARRAY_MEMBERS = tuple(
    Private(
        "jax",
        f"jax._src.array:ArrayImpl.{name}",
        why="the simulator wraps it on jax.Array's one implementation class (a read of a lost "
        "or hung slice's data raises or blocks; a lost mark passes to shards and copies)",
        instead="none: JAX has no hook on an array's host reads",
    )
    for name in (*ARRAY_READS, "is_ready", "is_deleted", "addressable_data", "addressable_shards")
)
BATCHED_BLOCK_UNTIL_READY = Private(
    "jaxlib",
    "jaxlib.xla_client:batched_block_until_ready",
    why="jax.block_until_ready's batched path calls it by module attribute; the simulator guards it",
    instead="none: JAX has no hook on blocking reads",
)
RUN_PYTHON_PJIT = Private(
    "jax",
    "jax._src.pjit:_run_python_pjit",
    why="every jax.jit call that misses the C++ cache runs it: the simulator's one seam on "
    "jax.jit dispatch (the C++ fast path has no Python seam)",
    instead="none: JAX has no dispatch hook",
    params=("p", "args_flat", "fun", "args", "kwargs"),
)
GET_FASTPATH_DATA = Private(
    "jax",
    "jax._src.pjit:_get_fastpath_data",
    why="returning None keeps a jax.jit call off the C++ fast path, so its next call comes "
    "back to _run_python_pjit while a simulator is active",
    instead="none: JAX has no dispatch hook",
)
_CPP_CACHE_FUN_ONLY = Private(
    "jax",
    "jax._src.pjit:_cpp_pjit_cache_fun_only",
    why="jax.jit's C++ cache, emptied as the simulator's jit seam is installed and removed",
    instead="jax.clear_caches() (clears every cache, compiled programs included)",
)
_CPP_CACHE_EXPLICIT = Private(
    "jax",
    "jax._src.pjit:_cpp_pjit_cache_explicit_attributes",
    why="as _cpp_pjit_cache_fun_only, for jit functions with explicit attributes",
    instead="jax.clear_caches() (clears every cache, compiled programs included)",
)
_TRACE_STATE_CLEAN = Private(
    "jax",
    "jax._src.core:trace_state_clean",
    why="whether a jax.jit call runs outside any trace (a dispatch) or inside one (tracing)",
    instead="none public",
)
_PJIT_MODULE = Private(
    "jax",
    "jax._src.pjit",
    why="its frames (and traceback_util's) are skipped to find the code that called a jax.jit function",
    instead="none: a dispatch hook would hand over the caller",
)
_TRACEBACK_UTIL = Private(
    "jax",
    "jax._src.traceback_util",
    why="as jax._src.pjit: frames skipped to find the caller of a jax.jit function",
    instead="none: a dispatch hook would hand over the caller",
)

COLOCATED_SERIALIZE = Private(
    "jax",
    "jax.experimental.colocated_python.func:_serialize",
    why="colocated Python pickles each function with cloudpickle; the simulator, which runs "
    "the sidecars in its own process, hands the function object over instead (its patches "
    "are closures that do not pickle)",
    instead="none: colocated Python has no in-process mode",
)
COLOCATED_DESERIALIZE = Private(
    "jax",
    "jax.experimental.colocated_python.func:_deserialize",
    why="the other half of COLOCATED_SERIALIZE",
    instead="none: colocated Python has no in-process mode",
)
COLOCATED_CPU_DEVICES = Private(
    "jax",
    "jax.experimental.colocated_python:colocated_cpu_devices",
    why="on CPU it maps devices to the process's first CPU devices by position; the "
    "simulator rebinds it to return CPU devices as they are (as its docstring says), so each "
    "simulated slice's sidecar data stays on its own devices",
    instead="none: the CPU mapping is JAX's",
    params=("devices_or_mesh",),
)

DISTRIBUTED_INITIALIZE = Private(
    "jax",
    "jax.distributed:initialize",
    why="a program run unmodified under `elastic-dew simulate` may join a pool with "
    "jax.distributed.initialize(); under the simulator it is one Pathways controller whose "
    "backend already started, so the launcher rebinds it (by module attribute, as programs "
    "call it) to join nothing",
    instead="none: JAX has no switch that makes initialize a no-op for one controller",
)

# The local Pathways backend (elastic_dew.proxy) carries out the proxy client's requests on
# jaxlib's CPU client: it compiles the programs the client sends (MLIR with serialized
# CompileOptions) and keeps each array with the sharding the client gave it.
SHAPED_ARRAY = Private(
    "jax",
    "jax._src.core:ShapedArray",
    why="the abstract value an ArrayImpl is built with when the local Pathways backend joins "
    "shards it already holds in its sharding's order (ArrayImpl(..., _skip_checks=True): 3 us "
    "where jax.make_array_from_single_device_arrays takes 57 us, for every argument of every step)",
    instead="jax.make_array_from_single_device_arrays, without its per-call checks",
)
MLIR_CONTEXT = Private(
    "jax",
    "jax._src.interpreters.mlir:make_ir_context",
    why="an MLIR context with JAX's dialects registered, to read the global shapes of the "
    "results of a program the proxy client sends (the CPU executable reports only shards)",
    instead="a public MLIR context factory (jax.extend.mlir has none)",
)
XLA_COMPILE_OPTIONS = Private(
    "jaxlib",
    "jaxlib.xla_client:CompileOptions",
    why="the local Pathways backend parses the client's serialized CompileOptionsProto "
    "(ParseFromString) to compile its program on the CPU client as sent",
    instead="jax.extend.backend.get_compile_options builds options, but parses none",
)
XLA_DEVICE_LIST = Private(
    "jaxlib",
    "jaxlib.xla_client:DeviceList",
    why="Client.compile_and_load takes the executable's devices as a DeviceList",
    instead="none public",
)
XLA_GSPMD_SHARDING = Private(
    "jaxlib",
    "jaxlib.xla_client:GSPMDSharding",
    why="an array the proxy client shards by an XLA OpSharding over a device list is held "
    "with that very sharding (NamedSharding needs a mesh the client never sends)",
    instead="a public jax.sharding class built from devices and an HloSharding",
)
XLA_OP_SHARDING = Private(
    "jaxlib",
    "jaxlib.xla_client:OpSharding",
    why="the OpSharding proto the client sends, parsed (ParseFromString) for GSPMDSharding, "
    "and the executable's output shardings serialized back (SerializeToString)",
    instead="none public",
)

#: The modules whose frames lie between a ``jax.jit`` function's caller and ``_run_python_pjit``.
JIT_FRAME_MODULES = (_PJIT_MODULE.module, _TRACEBACK_UTIL.module)

def _compiled() -> Any:
    import jax

    return jax.jit(lambda x: x).lower(1.0).compile()


_COMPILED_EXECUTABLE = Private(
    "jax",
    "jax.stages:Compiled._executable",
    why="a compiled program's executable, whose unsafe_call.name names the function it was "
    "lowered from: the simulator tells the loop's step function from the others by it",
    instead="a public name of the function a jax.stages.Compiled was lowered from",
    probe=_compiled,
)

PRIVATE: tuple[Private, ...] = (
    _DISTRIBUTED_STATE,
    _BACKENDS_INITIALIZED,
    ARRAY_IMPL,
    ARRAY_VALUE,
    *ARRAY_MEMBERS,
    BATCHED_BLOCK_UNTIL_READY,
    RUN_PYTHON_PJIT,
    GET_FASTPATH_DATA,
    _CPP_CACHE_FUN_ONLY,
    _CPP_CACHE_EXPLICIT,
    _TRACE_STATE_CLEAN,
    _COMPILED_EXECUTABLE,
    _PJIT_MODULE,
    _TRACEBACK_UTIL,
    COLOCATED_SERIALIZE,
    COLOCATED_DESERIALIZE,
    COLOCATED_CPU_DEVICES,
    DISTRIBUTED_INITIALIZE,
    MLIR_CONTEXT,
    SHAPED_ARRAY,
    XLA_COMPILE_OPTIONS,
    XLA_DEVICE_LIST,
    XLA_GSPMD_SHARDING,
    XLA_OP_SHARDING,
)

# ------------------------------------------------------------------ the process pool


def pool_client() -> Any:
    """The pool's coordination-service client, ``None`` outside a pool (or before JAX is imported)."""
    if "jax" not in sys.modules:
        return None
    return _DISTRIBUTED_STATE.get().client


def pool_size() -> int:
    """The pool's process count (1 outside a pool), without starting a backend."""
    if pool_client() is None:
        return 1
    return int(_DISTRIBUTED_STATE.get().num_processes)


def pool_process_id() -> int:
    """This process's id in the pool (0 outside a pool), without starting a backend."""
    if pool_client() is None:
        return 0
    return int(_DISTRIBUTED_STATE.get().process_id)


def backends_started() -> bool:
    """Whether this process already opened a JAX backend (XLA has read its flags)."""
    if "jax" not in sys.modules:
        return False
    return bool(_BACKENDS_INITIALIZED.get()())


# ------------------------------------------------------------------ the simulator's seams


def jit_seam() -> bool:
    """Whether this JAX has the jit internals the simulator's jit seam replaces."""
    return all(p.check() is None for p in (RUN_PYTHON_PJIT, GET_FASTPATH_DATA, _CPP_CACHE_FUN_ONLY, _CPP_CACHE_EXPLICIT))


def clear_jit_caches() -> None:
    """Empty ``jax.jit``'s C++ caches (no call takes a fast path cached before)."""
    for cache in (_CPP_CACHE_FUN_ONLY, _CPP_CACHE_EXPLICIT):
        cache.get().clear()


def trace_state_clean() -> bool:
    """Whether no trace is under way in this thread."""
    return bool(_TRACE_STATE_CLEAN.get()())


def compiled_name(compiled: Any) -> str | None:
    """The name of the function a ``jax.stages.Compiled`` was lowered from (``jit(f)``'s
    ``"jit(f)"``), ``None`` when its executable does not say."""
    try:
        return getattr(compiled, _COMPILED_EXECUTABLE.name).unsafe_call.name
    except AttributeError:
        return None
