"""A renamed public name keeps working for one minor version, with a warning naming the new one;
a wrong keyword to a public constructor names its public parameters.

The renames users already hit (issue 28): ``SimulatedSlices(num_slices=)`` -> ``slices=``
(and the ``slices`` marker's keyword, and the ``num_slices`` attribute), ``--chaos`` ->
``--schedule``, the ``TrainConfig`` fields ``Trainer``/``Trainer.from_nnx`` took directly ->
``train=TrainConfig(...)``, ``record.run_events`` -> ``record.read_events`` (in
``test_record``). ``CHANGELOG.md`` lists each under "Deprecated".
"""

from __future__ import annotations

import inspect

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from elastic_dew import Trainer, TrainConfig, cli, simulate
from elastic_dew._deprecation import REMOVED_IN
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.simulate import schedule, topology
from elastic_dew.testing import pytest_plugin


def _dataset() -> grain.MapDataset:
    xs = np.random.default_rng(1).normal(size=(64, 3)).astype(np.float32)
    return grain.MapDataset.range(64).map(lambda i: {"x": xs[i], "y": xs[i].sum()})


def _functional() -> dict:
    def init(key):
        return {"w": jax.random.normal(key, (3,))}

    def loss(params, batch, key):
        return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)

    return dict(init=init, loss=loss)


def _common(tmp_path) -> dict:
    return dict(optimizer=optax.sgd(0.1), dataset=_dataset(), run_dir=tmp_path / "run",
                config=ElasticConfig(minimum_slice_count=1, global_batch=8))


def _nnx_model():
    from flax import nnx

    def loss(model, batch):
        return jnp.mean((model(batch["x"])[:, 0] - batch["y"]) ** 2)

    return (lambda rngs: nnx.Linear(3, 1, rngs=rngs)), loss


def test_the_slices_marker_takes_num_slices_with_a_warning_naming_slices():
    with pytest.warns(DeprecationWarning, match=r"@pytest\.mark\.slices\(num_slices=\.\.\.\) .*; use @pytest\.mark\.slices\(slices=\.\.\.\)"):
        shape = pytest_plugin._shape(pytest.mark.slices(num_slices=3, devices_per_slice=2).mark)
    assert (shape["slices"], shape["devices_per_slice"]) == (3, 2)


@pytest.mark.parametrize("spelling", [["--chaos", "lose:9@3"], ["--chaos=lose:9@3"]])
def test_the_chaos_flag_is_read_as_schedule_with_a_warning_on_the_command_line(spelling, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.warns(DeprecationWarning, match="--chaos"):
        status = cli.main(["train", "mlp", *spelling, "--run-dir", "run"])
    err = capsys.readouterr().err
    assert f"elastic-dew: warning: --chaos is deprecated and will be removed in {REMOVED_IN}; use --schedule" in err
    # The schedule reached the schedule's own check, worded with the new flag.
    assert status == 2 and "--schedule: fault lose:9@3/step names slice 9" in err


def test_a_train_config_field_given_to_the_trainer_goes_into_train_with_a_warning(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"Trainer\(log_every=\.\.\., seed=\.\.\.\) .*; use Trainer\(train=TrainConfig\(log_every=\.\.\., seed=\.\.\.\)\)"):
        trainer = Trainer(**_functional(), **_common(tmp_path), log_every=5, seed=7)
    assert (trainer.train.log_every, trainer.train.seed) == (5, 7)
    with pytest.warns(DeprecationWarning):
        trainer = Trainer(**_functional(), **_common(tmp_path), train=TrainConfig(seed=3), log_every=5)
    assert (trainer.train.log_every, trainer.train.seed) == (5, 3)


def test_from_nnx_takes_eval_every_with_a_warning_naming_train_config(tmp_path):
    pytest.importorskip("flax")
    model, loss = _nnx_model()
    with pytest.warns(DeprecationWarning, match=r"Trainer\.from_nnx\(eval_every=\.\.\.\) .*; use Trainer\.from_nnx\(train=TrainConfig\(eval_every=\.\.\.\)\)"):
        trainer = Trainer.from_nnx(model, loss, **_common(tmp_path), eval_dataset=_dataset(), eval_every=10)
    assert trainer.train.eval_every == 10 and trainer.evaluation is not None


def test_a_wrong_keyword_to_the_trainer_names_its_public_parameters_not_a_private_method(tmp_path):
    with pytest.raises(TypeError) as refused:
        Trainer(**_functional(), **_common(tmp_path), bogus=1)
    text = str(refused.value)
    assert text.startswith("Trainer() got an unexpected keyword argument 'bogus'; its parameters are init, loss,")
    assert "eval_dataset" in text and "_configure" not in text


def test_a_wrong_keyword_to_from_nnx_names_from_nnx_and_its_public_parameters(tmp_path):
    pytest.importorskip("flax")
    model, loss = _nnx_model()
    with pytest.raises(TypeError) as refused:
        Trainer.from_nnx(model, loss, **_common(tmp_path), bogus=1)
    text = str(refused.value)
    assert text.startswith("Trainer.from_nnx() got an unexpected keyword argument 'bogus'; its parameters are "
                           "model, loss, optimizer, dataset, config, run_dir,")
    assert "model_sharding" not in text and "_configure" not in text
    assert not (tmp_path / "run").exists()


def test_from_nnx_takes_the_constructors_run_parameters_with_the_same_defaults_and_types():
    """The two public signatures are the one declaration of a run's parameters: from_nnx has
    every one of the constructor's but the model's own (and model_sharding), alike."""
    own = inspect.signature(Trainer.__init__).parameters
    nnx = inspect.signature(Trainer.from_nnx).parameters
    assert set(nnx) - {"cls", "model"} == set(own) - {"self", "init", "model_sharding"}
    for name in set(nnx) - {"cls", "model", "loss", "eval_loss"}:  # a loss takes (model, batch) there
        assert (nnx[name].kind, nnx[name].default, nnx[name].annotation) == (
            own[name].kind, own[name].default, own[name].annotation), name


@pytest.mark.parametrize("call", [
    lambda: schedule.check_fault_slices(simulate.parse_schedule("lose:1@3"), num_slices=4),
    lambda: schedule.unreachable(simulate.parse_schedule("lose:1@3"), num_slices=4),
    lambda: topology.Topology.check_shape(num_slices=4, devices_per_slice=2),
], ids=["check_slices", "unreachable", "Topology.check_shape"])
def test_the_other_public_callables_that_took_num_slices_take_it_with_a_warning_naming_slices(call):
    with pytest.warns(DeprecationWarning, match=r"\(num_slices=\.\.\.\) is deprecated .*; use .*\(slices=\.\.\.\)"):
        assert call() is None


#: Names renamed in 0.2.0 so that each names one concept (issue 38): old path -> new path.
RENAMED_0_2 = {
    "elastic_dew.run.Plan": "elastic_dew.run.planning.RunPlan",
    "elastic_dew.run.Outcome": "elastic_dew.run.execution.RunOutcome",
    "elastic_dew.run.plan": "elastic_dew.run.planning.plan_run",
    "elastic_dew.plan.Outcome": "elastic_dew.plan.model.PolicyOutcome",
    "elastic_dew.plan.model.Outcome": "elastic_dew.plan.model.PolicyOutcome",
    "elastic_dew.testing.Outcome": "elastic_dew.testing.outcome.ScenarioOutcome",
    "elastic_dew.testing.outcome.Outcome": "elastic_dew.testing.outcome.ScenarioOutcome",
    "elastic_dew.simulate.Fault": "elastic_dew.simulate.schedule.ScheduledFault",
    "elastic_dew.simulate.schedule.Fault": "elastic_dew.simulate.schedule.ScheduledFault",
    "elastic_dew.testing.fault_proxy.Fault": "elastic_dew.testing.fault_proxy.ProxyFault",
}


def _resolve(path: str):
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("old", sorted(RENAMED_0_2))
def test_a_name_renamed_in_0_2_is_served_from_its_old_place_with_a_warning_naming_the_new_one(old):
    new = RENAMED_0_2[old]
    with pytest.warns(DeprecationWarning, match=rf"^{old} is deprecated and will be removed in {REMOVED_IN}; use {new}$"):
        value = _resolve(old)
    assert value is _resolve(new)


def test_a_name_that_never_existed_is_still_an_attribute_error_naming_the_module():
    import elastic_dew.run

    with pytest.raises(AttributeError, match="module 'elastic_dew.run' has no attribute 'Nothing'"):
        elastic_dew.run.Nothing
