"""A compiled program loaded onto other devices of a mesh of the same shape, compiling nothing.

``elastic_dew._compat.jax_executables.retarget`` is the seam (it reads JAX's executable serialization);
``elastic_dew.elastic.state.programs`` keeps the snapshots' programs by their lowered text so
that each is compiled once for all meshes of a shape, and the step compiler loads a step it
compiled for one layout onto the others (``tests/test_protocol_parts.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew._compat.jax_executables import cache_hits, retarget
from elastic_dew.elastic.state.programs import load_or_compile

pytestmark = pytest.mark.libraries

COMPILED = "/jax/core/compile/backend_compile_duration"


def _mesh(ids: list[int]) -> Mesh:
    return Mesh(np.array([jax.devices()[i] for i in ids]).reshape(3, 2), ("data", "model"))


def _step(w, x):
    y = jnp.tanh(x @ w)
    return w - 0.01 * (x.T @ y), jnp.sum(y)


def _shardings(mesh: Mesh):
    return NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("data", None)), NamedSharding(mesh, P())


def _lowered(mesh: Mesh, width: int):
    """The step on ``mesh``; ``width`` makes a program no other test compiles."""
    weights, rows, scalar = _shardings(mesh)
    return jax.jit(lambda w, x: _step(w, x), out_shardings=(weights, scalar)).lower(
        jax.ShapeDtypeStruct((width, width), np.float32, sharding=weights),
        jax.ShapeDtypeStruct((12, width), np.float32, sharding=rows),
    )


def _inputs(mesh: Mesh, width: int):
    weights, rows, _ = _shardings(mesh)
    generator = np.random.default_rng(width)
    return (
        jax.device_put(generator.random((width, width), np.float32), weights),
        jax.device_put(generator.random((12, width), np.float32), rows),
    )


class _Compiles:
    """Counts backend compiles while open."""

    def __enter__(self):
        self.count = 0
        self._listener = lambda event, duration, **kwargs: setattr(self, "count", self.count + (event == COMPILED))
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


def _ids(mesh: Mesh) -> list[int]:
    return [d.id for d in mesh.devices.flat]


def test_a_program_compiled_for_one_mesh_runs_on_another_of_the_same_shape_with_the_same_results_compiling_nothing():
    compiled_for, other = _mesh([2, 3, 4, 5, 6, 7]), _mesh([0, 1, 4, 5, 6, 7])
    compiled = _lowered(compiled_for, 40).compile()
    with _Compiles() as compiles:
        moved = retarget(compiled, dict(zip(_ids(compiled_for), other.devices.flat)))
    assert moved is not None and compiles.count == 0
    weights, total = moved(*_inputs(other, 40))
    expected_weights, expected_total = jax.jit(_step, out_shardings=(_shardings(other)[0], _shardings(other)[2]))(
        *_inputs(other, 40)
    )
    np.testing.assert_array_equal(np.asarray(weights), np.asarray(expected_weights))
    assert float(total) == float(expected_total)
    assert sorted(s.device.id for s in weights.addressable_shards) == sorted(_ids(other))
    assert _ids(moved.input_shardings[0][0].mesh) == _ids(other)


def test_a_program_loaded_from_jaxs_persistent_cache_is_counted_so_that_nothing_loads_it_elsewhere():
    # jaxlib's CPU client serializes such a program without its nested computations: loaded
    # elsewhere it fails when it runs ("Function wrapped_reduce not found").
    mesh = _mesh([2, 3, 4, 5, 6, 7])
    before = cache_hits()
    _lowered(mesh, 44).compile()  # compiled, and written to the session's persistent cache
    assert cache_hits() == before
    _lowered(mesh, 44).compile()  # a new jit of the same program: read from that cache
    assert cache_hits() == before + 1


def test_the_snapshots_programs_compile_once_for_every_mesh_of_a_shape():
    first, second, third = _mesh([2, 3, 4, 5, 6, 7]), _mesh([0, 1, 4, 5, 6, 7]), _mesh([0, 1, 2, 3, 4, 5])
    with _Compiles() as compiles:
        on_first = load_or_compile(_lowered(first, 48), first)
        on_second = load_or_compile(_lowered(second, 48), second)
        on_third = load_or_compile(_lowered(third, 48), third)
    assert compiles.count == 1
    assert load_or_compile(_lowered(first, 48), first) is on_first
    for mesh, program in ((second, on_second), (third, on_third)):
        weights, _ = program(*_inputs(mesh, 48))
        assert sorted(s.device.id for s in weights.addressable_shards) == sorted(_ids(mesh))
        np.testing.assert_array_equal(np.asarray(weights), np.asarray(on_first(*_inputs(first, 48))[0]))


def test_the_process_keeps_only_the_most_recently_used_compiled_programs_for_other_meshes(monkeypatch):
    from elastic_dew.elastic.state import programs

    monkeypatch.setattr(programs, "KEPT", 2)
    monkeypatch.setattr(programs, "_COMPILED", type(programs._COMPILED)())
    mesh = _mesh([2, 3, 4, 5, 6, 7])
    for width in (52, 56, 60):  # three programs no other test compiles
        load_or_compile(_lowered(mesh, width), mesh)
    kept = [compiled.args_info[0][0].shape[0] for compiled, _ in programs._COMPILED.values()]
    assert kept == [56, 60]
