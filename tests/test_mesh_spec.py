"""A program with its own mesh axes runs under ElasticRun: the run builds every mesh (the first,
the survivors' after a loss, the precompiled smaller ones, the larger one after a scale-up) with
the program's axes and slice shape, splits batches over its batch axes, and refuses a spec that
cannot lay out the slices before anything runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from elastic_dew import record
from elastic_dew.elastic import ElasticData, ElasticRun, MeshSpec, batch_sharding
from elastic_dew.elastic.events import Event
from elastic_dew.elastic.slices.mesh import BatchError
from elastic_dew.simulate import SimulatedSlices

from linear import FEATURES
from linear import config as _config
from linear import dataset as _dataset

SPEC = MeshSpec(axes=("replica", "fsdp", "tensor"), slice_shape=(2, -1))


class FsdpTensorProgram:
    """A linear model whose weights are split over a slice's ``fsdp`` x ``tensor`` devices and
    whose batch is split over ``("replica", "fsdp")``: it names no default axis."""

    microbatch = None

    def __init__(self):
        self.meshes: list[tuple[tuple[str, ...], tuple[int, ...]]] = []

    def _shardings(self, mesh):
        return {"w": NamedSharding(mesh, PartitionSpec("fsdp", "tensor")), "seen": NamedSharding(mesh, PartitionSpec())}

    def abstract_state(self, mesh):
        s = self._shardings(mesh)
        return {"w": jax.ShapeDtypeStruct((FEATURES, 2), jnp.float32, sharding=s["w"]),
                "seen": jax.ShapeDtypeStruct((), jnp.int32, sharding=s["seen"])}

    def init_state(self, mesh):
        s = self._shardings(mesh)
        return {"w": jax.device_put(jnp.zeros((FEATURES, 2)), s["w"]), "seen": jax.device_put(jnp.int32(0), s["seen"])}

    def compile(self, mesh, global_batch):
        self.meshes.append((tuple(mesh.axis_names), tuple(mesh.devices.shape)))

        def step(state, batch):
            def loss(w):
                return jnp.mean((jnp.sum(batch["x"] @ w, axis=1) - batch["y"]) ** 2)

            value, grad = jax.value_and_grad(loss)(state["w"])
            return {"w": state["w"] - 0.05 * grad, "seen": state["seen"] + jnp.sum(batch["index"])}, {"loss": value}

        b = batch_sharding(mesh, SPEC.batch_axes)
        batch = {"x": jax.ShapeDtypeStruct((global_batch, FEATURES), jnp.float32, sharding=b),
                 "y": jax.ShapeDtypeStruct((global_batch,), jnp.float32, sharding=b),
                 "index": jax.ShapeDtypeStruct((global_batch,), jnp.int32, sharding=b)}
        out = (self._shardings(mesh), NamedSharding(mesh, PartitionSpec()))
        return jax.jit(step, out_shardings=out).lower(self.abstract_state(mesh), batch).compile()


def test_a_program_with_its_own_axes_runs_through_a_loss_and_a_scale_up_on_meshes_of_those_axes(tmp_path):
    program, events = FsdpTensorProgram(), []
    events: list[Event]
    with SimulatedSlices(2, 4, schedule="lose:1@4,restore:1@7", fault_log=tmp_path / "faults.jsonl"):
        run = ElasticRun(program, ElasticData(_dataset()), _config(tmp_path), emit=events.append, mesh_spec=SPEC)
        state, step = run.run(10)
    assert step == 10
    kinds = [(e.kind, getattr(e, "reason", getattr(e, "source", None))) for e in events if e.kind in ("stop", "resume")]
    assert ("stop", "slice_lost") in kinds and ("resume", "snapshot") in kinds
    assert ("stop", "scale_up") in kinds and ("resume", "live") in kinds
    assert {names for names, _ in program.meshes} == {("replica", "fsdp", "tensor")}
    assert {shape for _, shape in program.meshes} == {(2, 2, 2), (1, 2, 2)}  # all slices, and the survivor
    assert state["w"].sharding.spec == PartitionSpec("fsdp", "tensor")
    committed = record.as_events(record.committed_step_lines(events))
    assert [e.step for e in committed] == list(range(1, 11))
    consumed = committed[-1].examples[1]
    assert consumed == 10 * 24
    assert int(jax.device_get(state["seen"])) == sum(range(consumed))  # each example trained on once
    assert np.isfinite(committed[-1].loss)


@pytest.mark.parametrize("spec, config, error", [
    (dict(slice_shape=(3, -1)), {}, "does not lay out the 4 devices of a slice"),
    (dict(slice_shape=(2, 2)), dict(model_axis=2), "not both"),
    (dict(slice_shape=(4, 1)), dict(global_batch=20), "global_batch=20"),
])
def test_a_spec_that_cannot_lay_out_the_slices_is_refused_before_anything_runs(tmp_path, spec, config, error):
    with SimulatedSlices(2, 4):
        with pytest.raises(ValueError, match=error) as raised:
            ElasticRun(FsdpTensorProgram(), ElasticData(_dataset()), _config(tmp_path, **config),
                       mesh_spec=MeshSpec(axes=("replica", "fsdp", "tensor"), **spec))
    assert not (tmp_path / "checkpoints").exists()
    if "global_batch" in config:
        assert isinstance(raised.value, BatchError)  # 20 does not divide over 1 slice's 4 fsdp devices


@pytest.mark.parametrize("spec, error", [
    (dict(axes=("fsdp", "replica")), "starting with 'replica'"),
    (dict(axes=("replica", "fsdp", "tensor"), slice_shape=(2,)), "has 1 dimensions"),
    (dict(axes=("replica", "fsdp", "tensor"), batch_axes=("fsdp",)), "batch_axes=\\('fsdp',\\)"),
    (dict(axes=("replica", "fsdp"), batch_axes=("replica", "data")), "must be distinct axes of"),
])
def test_a_mesh_spec_names_what_is_wrong_as_it_is_made(spec, error):
    with pytest.raises(ValueError, match=error):
        MeshSpec(**spec)


def test_the_default_spec_is_the_default_axes_with_the_batch_over_replica_and_data():
    assert MeshSpec() == MeshSpec(("replica", "data", "model"), None, ("replica", "data"))
    assert MeshSpec(axes=["replica", "fsdp", "tensor"], slice_shape=[-1, 2]).batch_axes == ("replica", "fsdp")
