"""``Trainer.fit`` on simulated slices: the run record, the Layout rule, bad arguments."""

from __future__ import annotations

import json

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jax.sharding import PartitionSpec as P

from elastic_dew import Trainer, TrainConfig
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.record import read_events
from elastic_dew.runtime import Layout
from elastic_dew.simulate import SimulatedSlices


def _model():
    def init(key):
        return {"w": jax.random.normal(key, (3,)) * 0.1, "b": jnp.zeros(())}

    def loss(params, batch, key):
        del key
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    xs = np.random.default_rng(1).normal(size=(512, 3)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    dataset = grain.MapDataset.range(512).map(lambda i: {"x": xs[i], "y": ys[i]})
    return dict(init=init, loss=loss, optimizer=optax.sgd(0.1), dataset=dataset)


def _config(**overrides):
    values = dict(minimum_slice_count=1, poll_interval=0.05, timeout=60, global_batch=24,
                  snapshot_every=2, checkpoint_every=4)
    values.update(overrides)
    return ElasticConfig(**values)


@pytest.mark.slow
def test_fit_writes_the_run_record_and_a_summary_with_every_badput_category(tmp_path):
    with SimulatedSlices(4, 2, schedule="lose:3@5", fault_log=tmp_path / "run" / "faults.jsonl"):
        result = Trainer(**_model(), config=_config(), run_dir=tmp_path / "run").fit(10)
    assert result.final_step == 10
    run = tmp_path / "run"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "stop" and events[-1]["reason"] == "done"
    assert any(e["event"] == "stop" and e["reason"] == "slice_lost" for e in events)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 10
    assert summary["examples_consumed"] == 10 * 24
    assert 0 < summary["goodput"] < 1
    assert set(summary["badput"]) == {
        "program_startup", "training_prep", "unproductive_checkpoint_save_time",
        "unproductive_checkpoint_restore_time", "elastic_slice_down", "elastic_scale_up",
        "elastic_reinitialization", "wasted_progress_from_disruption",
        "infrastructure_recovery_from_disruption", "data_loading_sync", "custom_badput_events", "other",
    }
    assert summary["badput"]["elastic_slice_down"] > 0
    with np.load(run / "final_params.npz", allow_pickle=False) as saved:
        assert len(saved.files) == 2
    losses = [e["loss"] for e in events if e["event"] == "step"]
    assert losses[-1] < losses[0]
    assert (run / "checkpoints").is_dir()


def test_a_completed_run_re_run_resumes_from_its_final_checkpoint_and_does_no_step(tmp_path):
    with SimulatedSlices(4, 2):
        first = Trainer(**_model(), config=_config(), run_dir=tmp_path / "run").fit(6)
        again = Trainer(**_model(), config=_config(), run_dir=tmp_path / "run").fit(6)
    assert again.summary["state_digest"] == first.summary["state_digest"]
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    resumes = [e for e in events if e["event"] == "resume"]
    assert resumes[-1]["source"] == "checkpoint" and resumes[-1]["step"] == 7


def test_host_owned_params_run_with_snapshots_off_and_match_device_owned_params(tmp_path):
    with SimulatedSlices(4, 2):
        device = Trainer(**_model(), config=_config(snapshot_every=0), run_dir=tmp_path / "a").fit(5)
        host = Trainer(
            **_model(), config=_config(snapshot_every=0), run_dir=tmp_path / "b",
            layout=Layout(host=frozenset({"params", "opt_state"})),
        ).fit(5)
    assert host.summary["state_digest"] == device.summary["state_digest"]


def test_host_owned_state_with_in_memory_snapshots_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="snapshot_every=0"):
        Trainer(**_model(), config=_config(), run_dir=tmp_path / "run",
                layout=Layout(host=frozenset({"params"})))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(config="not a config"), "ElasticConfig"),
        (dict(log_every=5), "unexpected keyword argument 'log_every'"),  # a TrainConfig field goes in train=
        (dict(train=dict(seed=3)), "train must be a TrainConfig"),
        (dict(model_sharding="columns"), "model_sharding must be a callable"),
        (
            dict(train=TrainConfig(sharding=lambda path, leaf, mesh: P()), model_sharding=lambda path, leaf, mesh: P()),
            "sharding is a callable, which already decides the 'model' axis",
        ),
    ],
)
def test_bad_trainer_arguments_are_refused_with_the_fix(tmp_path, overrides, message):
    arguments = dict(_model(), config=_config(), run_dir=tmp_path / "run")
    arguments.update(overrides)
    with pytest.raises((ValueError, TypeError), match=message):
        Trainer(**arguments)
    assert not (tmp_path / "run").exists()


def test_from_nnx_takes_the_constructors_run_parameters_with_the_same_defaults_and_types():
    """The two public signatures are the one declaration of a run's parameters: from_nnx has
    every one of the constructor's but the model's own (and model_sharding), alike."""
    import inspect

    own = inspect.signature(Trainer.__init__).parameters
    nnx = inspect.signature(Trainer.from_nnx).parameters
    assert set(nnx) - {"cls", "model"} == set(own) - {"self", "init", "model_sharding"}
    for name in set(nnx) - {"cls", "model", "loss", "eval_loss"}:  # a loss takes (model, batch) there
        assert (nnx[name].kind, nnx[name].default, nnx[name].annotation) == (
            own[name].kind, own[name].default, own[name].annotation), name


def test_fit_refuses_a_non_positive_step_count(tmp_path):
    with pytest.raises(ValueError, match="steps=0"):
        Trainer(**_model(), config=_config(), run_dir=tmp_path / "run").fit(0)


@pytest.mark.slow
@pytest.mark.libraries
def test_a_flax_linen_model_trains_through_init_and_loss_as_the_trainer_page_writes_them(tmp_path):
    """Linen needs no adapter: its variables are the params tree, and the trained ones apply."""
    from flax import linen as nn

    model, data = nn.Dense(1), _model()
    x = jnp.zeros((1, 3))

    def loss(params, batch, key):
        return jnp.mean((model.apply(params, batch["x"])[:, 0] - batch["y"]) ** 2)

    with SimulatedSlices(2, 2):
        result = Trainer(init=lambda key: model.init(key, x), loss=loss, optimizer=data["optimizer"],
                         dataset=data["dataset"], config=_config(), run_dir=tmp_path / "run").fit(4)
    losses = [e["loss"] for e in read_events(tmp_path / "run") if e["event"] == "step"]
    assert losses[-1] < losses[0]
    assert model.apply(result.params, np.ones((2, 3), np.float32)).shape == (2, 1)


def test_a_loss_returning_metrics_writes_them_averaged_over_the_step_to_each_step_line(tmp_path):
    """A mean metric of a step accumulated in micro-steps is the whole batch's mean."""
    model = _model()

    def loss(params, batch, key):
        error = batch["x"] @ params["w"] + params["b"] - batch["y"]
        return jnp.mean(error**2), {"mae": jnp.mean(jnp.abs(error)), "largest": jnp.max(jnp.abs(error))}

    model["loss"] = loss
    with SimulatedSlices(4, 2):
        Trainer(**model, config=_config(minimum_slice_count=None), run_dir=tmp_path / "a").fit(3)
        Trainer(**model, config=_config(minimum_slice_count=None), run_dir=tmp_path / "b",
                train=TrainConfig(microbatch=1)).fit(3)
    whole, micro = ([e for e in read_events(tmp_path / run) if e["event"] == "step"] for run in "ab")
    for one, other in zip(whole, micro, strict=True):
        assert set(one["metrics"]) == {"mae", "largest"}
        assert other["metrics"]["mae"] == pytest.approx(one["metrics"]["mae"], rel=1e-5)
        assert other["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert other["metrics"]["largest"] <= one["metrics"]["largest"]  # a mean of per-micro-step maxima


@pytest.mark.parametrize(
    "output, message",
    [
        (lambda error: error**2, r"returned a loss of shape \(24,\), not a scalar.*\(loss, metrics\)"),
        (lambda error: (jnp.mean(error**2), [1.0]), r"returned a tuple of 2 items.*\(loss, metrics\)"),
        (lambda error: (jnp.mean(error**2), {"per_example": error}), r"metrics must be a dict of scalars"),
        (lambda error: (jnp.mean(error**2), {"loss": 0.0}), r"metrics name 'loss'"),
    ],
)
def test_a_loss_of_the_wrong_form_is_refused_before_anything_is_written(tmp_path, output, message):
    model = _model()
    model["loss"] = lambda params, batch, key: output(batch["x"] @ params["w"] + params["b"] - batch["y"])
    with pytest.raises(TypeError, match=message):
        Trainer(**model, config=_config(), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
