"""``Trainer.from_nnx``: a real Flax NNX model (``nnx.BatchNorm``, ``nnx.Dropout``, its own
``nnx.Rngs``) on simulated slices, through a slice loss, a return and a real SIGTERM."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from elastic_dew import Trainer
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.record import committed_step_lines, read_events
from elastic_dew.runtime import Preempted
from elastic_dew.simulate import SimulatedSlices

pytestmark = pytest.mark.libraries  # Flax NNX

TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # the elastic layer's tolerance across meshes
STEPS, BATCH = 9, 24


class Net(nnx.Module):
    """A classifier with every kind of variable: parameters, batch statistics, an RNG stream."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(4, 16, use_bias=False, rngs=rngs)  # BatchNorm has the bias
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(self.drop(nnx.relu(self.norm(self.hidden(x)))))


def classify(model: Net, batch: dict) -> tuple[jax.Array, dict]:
    logits = model(batch["x"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss, {"accuracy": jnp.mean(logits.argmax(-1) == batch["y"])}


def _data(n: int, offset: int = 0) -> grain.MapDataset:
    xs = np.random.default_rng(3).normal(size=(2048, 4)).astype(np.float32) * 3 + 1
    ys = (xs[:, 0] - xs[:, 1] > 0).astype(np.int32)
    return grain.MapDataset.range(n).map(lambda i: {"x": xs[offset + i], "y": ys[offset + i]})


def _trainer(run_dir, **overrides) -> Trainer:
    arguments = dict(
        optimizer=optax.adam(1e-2), dataset=_data(1024),
        config=ElasticConfig(minimum_slice_count=1, poll_interval=0.05, timeout=60, global_batch=BATCH,
                             snapshot_every=2, checkpoint_every=4, precompile_smaller_meshes=False),
        run_dir=run_dir,
    )
    arguments.update(overrides)
    return Trainer.from_nnx(Net, classify, **arguments)


def _batch_stats(model: Net) -> dict:
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)))


def _rng_count(model: Net) -> int:
    (count,) = jax.tree.leaves(nnx.to_pure_dict(nnx.state(model, nnx.RngCount)))
    return int(count)


@pytest.mark.slow
def test_an_nnx_model_with_batch_statistics_trains_exactly_once_through_a_loss_a_return_and_a_preemption(tmp_path):
    faults = "lose:1@3,restore:1@5"
    with SimulatedSlices(2, 2, schedule=f"{faults},preempt@7", fault_log=tmp_path / "run" / "faults.jsonl"):
        with pytest.raises(Preempted) as stopped:
            _trainer(tmp_path / "run").fit(STEPS)
        resumed = _trainer(tmp_path / "run").fit(STEPS)
    with SimulatedSlices(2, 2, schedule=faults, fault_log=tmp_path / "same" / "faults.jsonl"):
        uninterrupted = _trainer(tmp_path / "same").fit(STEPS)
    with SimulatedSlices(2, 2):
        unfaulted = _trainer(tmp_path / "plain").fit(STEPS)

    assert stopped.value.step == 7
    lines = read_events(tmp_path / "run")
    assert {(e["reason"], e["step"]) for e in lines if e["event"] == "stop"} >= {("slice_lost", 2), ("preempted", 7)}
    assert any(e["event"] == "resume" and e["source"] == "live" for e in lines)  # the return
    committed = committed_step_lines(lines)
    assert [e["step"] for e in committed] == list(range(1, STEPS + 1))
    assert [e["examples"] for e in committed] == [[BATCH * i, BATCH * (i + 1)] for i in range(STEPS)]
    assert all(0 <= e["metrics"]["accuracy"] <= 1 for e in committed)

    # Bitwise after the preemption: parameters, batch statistics and the dropout stream's counter.
    assert resumed.summary["state_digest"] == uninterrupted.summary["state_digest"]
    jax.tree.map(np.testing.assert_array_equal, _batch_stats(resumed.model), _batch_stats(uninterrupted.model))
    assert _rng_count(resumed.model) == _rng_count(uninterrupted.model) == STEPS  # one dropout draw a step
    # Close after the resize to a run that never lost a slice.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOLERANCE), resumed.params, unfaulted.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOLERANCE),
                 _batch_stats(resumed.model), _batch_stats(unfaulted.model))
    # The running statistics moved with training (BatchNorm starts at mean 0, variance 1).
    stats = _batch_stats(resumed.model)["norm"]
    assert np.abs(stats["mean"]).max() > 0.05 and np.abs(stats["var"] - 1).max() > 0.05


def test_an_nnx_models_variables_are_laid_out_by_the_policy_and_its_annotations(tmp_path):
    class Annotated(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
            self.wide = nnx.Linear(64, 128, kernel_init=init, rngs=rngs)  # 32 KiB: fsdp adds data
            self.norm = nnx.BatchNorm(128, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.out = nnx.Linear(128, 2, rngs=rngs)

        def __call__(self, x):
            return self.out(self.drop(self.norm(self.wide(x))))

    examples = grain.MapDataset.range(64).map(
        lambda i: {"x": np.full((64,), i, np.float32) / 64, "y": np.int32(i % 2)}
    )
    with SimulatedSlices(2, 4):
        result = Trainer.from_nnx(
            Annotated, classify, optimizer=optax.sgd(0.1), dataset=examples,
            config=ElasticConfig(global_batch=8, snapshot_every=0, checkpoint_every=0, model_axis=2),
            run_dir=tmp_path / "run",
        ).fit(1)
    spec = lambda sharding: sharding.spec  # noqa: E731
    params, variables = result.shardings["params"], result.shardings["variables"]
    assert spec(params["wide"]["kernel"]) == P("data", "model")  # the annotation, with fsdp's data
    assert spec(params["out"]["kernel"]) == P()  # small: replicated
    assert spec(variables["drop"]["rngs"]["key"]) == P()  # a typed PRNG key: replicated
    assert spec(variables["drop"]["rngs"]["count"]) == P()  # an integer counter: replicated
    # The optimizer's moments (none for sgd) and the batch statistics follow the same policy.
    assert spec(variables["norm"]["mean"]) == P()


def test_an_nnx_annotation_naming_another_mesh_axis_is_refused_with_its_path(tmp_path):
    class Elsewhere(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", None))
            self.layer = nnx.Linear(4, 2, kernel_init=init, rngs=rngs)

        def __call__(self, x):
            return self.layer(x)

    with pytest.raises(ValueError, match=r"\['layer'\]\['kernel'\].*'embed'.*'data' and 'model'"):
        Trainer.from_nnx(Elsewhere, classify, optimizer=optax.sgd(0.1), dataset=_data(64),
                         config=ElasticConfig(global_batch=8), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "model, message",
    [
        (lambda rngs: "not a module", "returned str, not an nnx.Module"),
        (3, "model must be an nnx.Module or a function of an nnx.Rngs"),
    ],
)
def test_a_model_that_is_not_an_nnx_module_is_refused_before_anything_is_written(tmp_path, model, message):
    with pytest.raises(TypeError, match=message):
        Trainer.from_nnx(model, classify, optimizer=optax.sgd(0.1), dataset=_data(64),
                         config=ElasticConfig(global_batch=8), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
