"""A constant global batch by accumulation: ``TrainConfig(microbatch=M)`` and ``--microbatch M``.

Runs on the simulator's CPU slices (4 slices of 2 devices). The loss function records, at
trace time, the leading size of the batch it is given, so the tests see how many examples
each micro-step holds per device and how many micro-steps a step takes.
"""

from __future__ import annotations

import re
import types

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from elastic_dew import Trainer, TrainConfig
from elastic_dew import console
from elastic_dew import run as runs
from elastic_dew.run import planning
from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.settings import SettingError
from elastic_dew.simulate import SimulatedSlices

GLOBAL_BATCH = 48  # per device: 6 on 4 slices of 2, 8 on 3, 12 on 2; all divisible by 2


def _model(seen: list):
    def init(key):
        k1, k2 = jax.random.split(key)
        return {"w1": jax.random.normal(k1, (3, 8)) * 0.3, "w2": jax.random.normal(k2, (8,)) * 0.3}

    def loss(params, batch, key):
        del key
        seen.append(batch["x"].shape[0])  # trace time: the rows one (micro-)step holds
        hidden = jnp.tanh(batch["x"] @ params["w1"])
        return jnp.mean((hidden @ params["w2"] - batch["y"]) ** 2)

    xs = np.random.default_rng(1).normal(size=(1024, 3)).astype(np.float32)
    ys = np.sin(xs @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
    dataset = grain.MapDataset.range(1024).map(lambda i: {"x": xs[i], "y": ys[i]})
    return dict(init=init, loss=loss, optimizer=optax.adam(0.05), dataset=dataset)


def _config(**overrides):
    values = dict(minimum_slice_count=2, poll_interval=0.05, timeout=60, global_batch=GLOBAL_BATCH,
                  snapshot_every=2, checkpoint_every=0, precompile_smaller_meshes=False)
    values.update(overrides)
    return ElasticConfig(**values)


def _fit(run_dir, steps, *, lose_at=None, microbatch=None):
    """Fit on 4x2 slices; ``lose_at`` loses slice 3 during that step's computation."""
    seen: list = []
    box = {}

    def lose(phase, step):
        if phase == "step" and step == lose_at and "fired" not in box:
            box["fired"] = True
            box["sim"].lose(3)

    hooks.add_listener(lose)
    try:
        with SimulatedSlices(4, 2) as sim:
            box["sim"] = sim
            built = Trainer(**_model(seen), config=_config(), run_dir=run_dir,
                            train=TrainConfig(microbatch=microbatch))
            seen.clear()  # building traced the loss once on the whole batch, to check its form
            result = built.fit(steps)
    finally:
        hooks.remove_listener(lose)
    return result, seen


def test_a_microbatched_step_makes_the_full_batch_update(tmp_path):
    full, full_rows = _fit(tmp_path / "full", 6)
    micro, micro_rows = _fit(tmp_path / "micro", 6, microbatch=2)
    assert set(full_rows) == {GLOBAL_BATCH}
    assert set(micro_rows) == {8 * 2}  # eight data-parallel devices, two examples each
    for name in full.params:
        np.testing.assert_allclose(micro.params[name], full.params[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_lost_slice_under_the_constant_batch_adds_micro_steps_not_examples_per_device(tmp_path):
    full, _ = _fit(tmp_path / "full", 8, lose_at=4)
    micro, rows = _fit(tmp_path / "micro", 8, lose_at=4, microbatch=2)
    # Every micro-step holds two examples per data-parallel device: 16 rows on eight devices
    # (three micro-steps of the 48), 12 rows on the six that survive (four micro-steps).
    assert set(rows) == {16, 12}
    assert micro.summary["examples_consumed"] == full.summary["examples_consumed"] == 8 * GLOBAL_BATCH
    for name in full.params:
        np.testing.assert_allclose(micro.params[name], full.params[name], rtol=1e-5, atol=1e-6)


def test_a_microbatch_a_reachable_slice_count_cannot_take_is_refused_before_the_run(tmp_path):
    with SimulatedSlices(4, 2):
        trainer = Trainer(**_model([]), config=_config(), run_dir=tmp_path / "run",
                          train=TrainConfig(microbatch=4))
        with pytest.raises(ValueError, match=r"microbatch=4 does not divide the per-device batch of 6 on 4 "
                           r"active slices.*are 12, 8, 6, which microbatch 1, 2 divide"):
            trainer.fit(3)
    assert not (tmp_path / "run" / "events.jsonl").exists()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_microbatch_that_is_not_a_positive_int_is_refused(bad):
    with pytest.raises(ValueError, match=f"microbatch={bad!r} must be a whole number >= 1, or None"):
        TrainConfig(microbatch=bad)


def test_the_command_line_refuses_a_microbatch_before_anything_runs(tmp_path):
    config = runs.RunConfig(
        recipe="mlp", run_dir=str(tmp_path / "run"), train=TrainConfig(microbatch=5),
        sim=runs.SimConfig(slices=4, devices_per_slice=2),
        elastic=ElasticConfig(global_batch=GLOBAL_BATCH, minimum_slice_count=2),
    )
    with pytest.raises(SettingError) as refused:
        planning.plan_run(config)
    assert re.search(r"^--microbatch 5 does not divide.*microbatch 1, 2 divide", console.refusal(refused.value))
    assert not (tmp_path / "run").exists()


class _Refusals:
    """A display that keeps the refusals it is shown (run.Display)."""

    def __init__(self):
        self.refusals = []

    def refused(self, error):
        self.refusals.append(console.refusal(error))

    def running(self, plan):
        import contextlib

        return contextlib.nullcontext(())

    def finished(self, plan, outcome):
        raise AssertionError(f"a refused run finished: {outcome}")


@pytest.mark.parametrize(
    ("given", "refusal"),
    [
        (dict(microbatch=5), r"^--microbatch 5 does not divide.*microbatch 1, 2 divide"),
        (dict(global_batch=20), r"^--global-batch 20 .* divisible by"),
    ],
)
def test_on_real_slices_a_batch_they_cannot_take_exits_2_and_leaves_the_run_directory_untouched(
    tmp_path, monkeypatch, given, refusal
):
    """Real slices are counted only when the protocol is built, after planning.

    Mocked, because they cannot exist here: real slices (``run.simulating`` says no) and
    pathwaysutils' Manager over them, a stand-in holding four slices of two of the test's
    CPU devices. ``prepare_process`` is stubbed: on a real allocation it joins the pool and
    installs the process's exit hook, which a test process must not get.
    """
    devices = jax.devices()[:8]
    manager = types.SimpleNamespace(
        slice_to_devices={i: devices[2 * i:2 * i + 2] for i in range(4)}, total_slice_count=4
    )
    monkeypatch.setattr(planning, "simulating", lambda: False)
    monkeypatch.setattr("elastic_dew.elastic.loop.protocol.make_manager", lambda: manager)
    monkeypatch.setattr("elastic_dew.runtime.prepare_process", lambda **options: None)
    config = runs.RunConfig(
        recipe="mlp", run_dir=str(tmp_path / "run"), train=TrainConfig(microbatch=given.get("microbatch")),
        elastic=ElasticConfig(global_batch=given.get("global_batch", GLOBAL_BATCH), minimum_slice_count=2),
    )
    display = _Refusals()

    assert runs.main(config, display=display) == runs.USAGE_EXIT

    assert len(display.refusals) == 1 and re.search(refusal, display.refusals[0]), display.refusals
    assert not (tmp_path / "run").exists()
