"""``ModelProgram`` on its own: the model's shapes are traced once, not at every question."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elastic_dew.elastic.slices.mesh import mesh_of
from elastic_dew.trainer.model import Functional
from elastic_dew.trainer.program import ModelProgram


def _program(traces: list[int]) -> ModelProgram:
    def init(key):
        traces.append(1)  # runs once per trace of the model's init
        return {"w": jax.random.normal(key, (4, 8)) * 0.1, "b": jnp.zeros((8,))}

    def loss(params, batch, key):
        del key
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    example = {"x": np.zeros(4, np.float32), "y": np.zeros(8, np.float32)}
    return ModelProgram(Functional(init, loss), optax.adam(1e-3), example)


def test_the_models_init_is_traced_once_whatever_the_program_is_asked_on_how_many_meshes():
    """The loss check, the loop's abstract state and step compile, the precompiler's and the
    tiers' questions, on two meshes: one trace of the model's init in all (it was two per
    abstract state and three per step compile)."""
    traces: list[int] = []
    program = _program(traces)
    program.check_loss(8, evaluating=False)
    four, two = mesh_of(jax.devices()[:8], 4), mesh_of(jax.devices()[:4], 2)
    for mesh in (four, two, four, two):
        program.abstract_state(mesh)
        program.state_shardings(mesh)
        program.compile(mesh, 8)
    assert len(traces) == 1


def test_the_cached_shapes_and_shardings_are_the_states_and_a_callers_change_does_not_reach_them():
    traces: list[int] = []
    program = _program(traces)
    mesh = mesh_of(jax.devices()[:8], 4)
    abstract = program.abstract_state(mesh)
    shardings = program.state_shardings(mesh)
    state = program.init_state(mesh)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), abstract) == jax.tree.map(lambda a: (a.shape, a.dtype), state)
    assert jax.tree.map(lambda a: a.sharding, abstract) == shardings == jax.tree.map(lambda a: a.sharding, state)
    program.shapes().pop("params")
    abstract.pop("params")
    shardings.pop("params")
    assert "params" in program.shapes() and "params" in program.abstract_state(mesh)
    assert "params" in program.state_shardings(mesh)
