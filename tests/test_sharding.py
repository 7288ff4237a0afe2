"""The state sharded inside a slice (FSDP, tensor parallelism) and replicated across slices.

Everything runs on simulated CPU slices (four slices of two devices, so the ``data`` axis has
two devices); nothing is mocked.
"""

from __future__ import annotations

import argparse

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from elastic_dew import Trainer, TrainConfig, console, record
from elastic_dew import run as runs
from elastic_dew.run import execution
from elastic_dew.run import planning
from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.slices.mesh import mesh_of
from elastic_dew.elastic.slices.sharding import FSDP_MIN_BYTES, state_shardings
from elastic_dew.runtime import Preempted
from elastic_dew.simulate import SimulatedSlices

SLICES, PER_SLICE, STEPS, BATCH = 4, 2, 10, 24


def _model():
    """A linear map 128 -> 32 trained by Adam: ``w`` is 16 KiB (sharded under fsdp), ``b`` is not."""
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(2048, 128)).astype(np.float32)
    true_w = rng.normal(size=(128, 32)).astype(np.float32) / 8
    ys = (xs @ true_w).astype(np.float32)

    def init(key):
        return {"w": jax.random.normal(key, (128, 32)) * 0.01, "b": jnp.zeros(32)}

    def loss(params, batch, key):
        del key
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    dataset = grain.MapDataset.range(2048).map(lambda i: {"x": xs[i], "y": ys[i]})
    return dict(init=init, loss=loss, optimizer=optax.adam(0.01), dataset=dataset)


def _config(**overrides):
    values = dict(minimum_slice_count=1, poll_interval=0.05, timeout=60, global_batch=BATCH,
                  snapshot_every=2, checkpoint_every=4, max_to_keep=100)
    values.update(overrides)
    return ElasticConfig(**values)


def _train(run_dir, schedule=None, **trainer):
    """Train in ``run_dir`` as a JobSet would: a preempted process is started again."""
    from elastic_dew.elastic.slices.retry import make_manager

    for _ in range(3):
        with SimulatedSlices(SLICES, PER_SLICE, schedule=schedule, fault_log=run_dir / "faults.jsonl") as sim:
            manager = make_manager()
            # a scale-up at the step the schedule fixes, not when the monitor thread polls
            hold = lambda phase, step: sim.await_monitor(manager) if phase == "step" else None  # noqa: E731
            hooks.add_listener(hold)
            try:
                return Trainer(**_model(), config=_config(), run_dir=run_dir, train=TrainConfig(log_every=1000),
                               manager=manager, **trainer).fit(STEPS)
            except Preempted:
                continue
            finally:
                hooks.remove_listener(hold)
    raise AssertionError("still preempted after three processes")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("ref") / "run")


def _abstract_state():
    model = _model()

    def init(key):
        params_key, rng = jax.random.split(key)
        params = model["init"](params_key)
        return {"params": params, "opt_state": model["optimizer"].init(params), "rng": rng}

    return jax.eval_shape(init, jax.random.PRNGKey(0))


def _nbytes(leaf) -> int:
    return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def _split_by_fsdp(leaf) -> bool:
    """The test's own FSDP rule: at least FSDP_MIN_BYTES and a dimension two devices divide."""
    return _nbytes(leaf) >= FSDP_MIN_BYTES and any(d % PER_SLICE == 0 for d in leaf.shape)


def test_fsdp_splits_large_parameters_and_their_adam_moments_over_data_and_replicates_the_rest():
    mesh = mesh_of(jax.devices()[: SLICES * PER_SLICE], SLICES)
    abstract = _abstract_state()
    placed = state_shardings("fsdp", abstract, mesh)
    adam = placed["opt_state"][0]
    for tree in (placed["params"], adam.mu, adam.nu):
        assert tree["w"].spec == P("data")  # dimension 0 (128) is the largest
        assert tree["b"].spec == P()  # 128 bytes: replicated
    assert adam.count.spec == P() and placed["rng"].spec == P()
    assert all("replica" not in str(s.spec) for s in jax.tree.leaves(placed))


def test_typed_prng_keys_and_integer_counters_are_replicated_whatever_their_size_and_the_policy():
    """Flax NNX keeps an RNG stream's key and counter beside the parameters; neither can be
    split, and a callable is never asked about a key (it has no dtype numpy knows)."""
    mesh = mesh_of(jax.devices()[: SLICES * PER_SLICE], SLICES)
    big = 2 * FSDP_MIN_BYTES
    params = {
        "w": jax.ShapeDtypeStruct((big // 4,), jnp.float32),
        "keys": jax.eval_shape(lambda: jax.random.split(jax.random.key(0), big // 8)),
        "count": jax.ShapeDtypeStruct((big // 4,), jnp.uint32),
    }
    asked = []

    def rule(path, leaf, mesh):
        asked.append(jax.tree_util.keystr(path))
        return P("data")

    for policy in ("fsdp", "replicated", rule):
        placed = state_shardings(policy, {"params": params}, mesh)["params"]
        assert placed["keys"].spec == P()
        if policy != rule:
            assert placed["count"].spec == P()
    assert placed["w"].spec == placed["count"].spec == P("data")  # the callable decides integers
    assert asked == ["['count']", "['w']"]


@pytest.mark.slow
def test_an_fsdp_run_that_loses_a_slice_and_gets_it_back_consumes_every_example_once_and_ends_allclose(
    tmp_path, reference
):
    result = _train(tmp_path / "run", schedule="lose:1@3,restore:1@5")
    events = record.read_events(result.run_dir)
    reasons = [e["reason"] for e in events if e["event"] == "stop"]
    assert "slice_lost" in reasons and "scale_up" in reasons, reasons
    committed = record.committed_step_lines(events)
    assert [e["step"] for e in committed] == list(range(1, STEPS + 1))
    ranges = [tuple(e["examples"]) for e in committed]
    assert ranges == [(i * BATCH, (i + 1) * BATCH) for i in range(STEPS)]
    assert result.summary["examples_consumed"] == STEPS * BATCH
    assert result.shardings["params"]["w"].spec == P("data")
    for name in ("w", "b"):
        np.testing.assert_allclose(result.params[name], reference.params[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_an_fsdp_run_preempted_and_run_again_ends_bitwise_equal_to_the_uninterrupted_one(tmp_path, reference):
    result = _train(tmp_path / "run", schedule="preempt@6")
    events = record.read_events(result.run_dir)
    assert any(e["event"] == "stop" and e["reason"] == "preempted" for e in events)
    assert any(e["event"] == "resume" and e["source"] == "checkpoint" for e in events)
    assert result.summary["state_digest"] == reference.summary["state_digest"]


def test_the_memory_figures_match_the_shardings_the_test_computes(reference):
    memory = reference.summary["memory"]
    assert memory == record.load_summary(reference.run_dir)["memory"]
    leaves = jax.tree.leaves(_abstract_state())
    assert memory["state_bytes"] == sum(_nbytes(x) for x in leaves)
    per_device = sum(_nbytes(x) // PER_SLICE if _split_by_fsdp(x) else _nbytes(x) for x in leaves)
    assert memory["state_bytes_per_device_max"] == per_device
    # The snapshot: sharded leaves as they are; the small ones packed per dtype, padded to a
    # multiple of the slice's devices and split over them.
    groups: dict[str, int] = {}
    for x in leaves:
        if not _split_by_fsdp(x):
            groups[str(x.dtype)] = groups.get(str(x.dtype), 0) + int(np.prod(x.shape, dtype=np.int64))
    packed = sum(-(-size // PER_SLICE) * np.dtype(dtype).itemsize for dtype, size in groups.items())
    sharded = sum(_nbytes(x) // PER_SLICE for x in leaves if _split_by_fsdp(x))
    assert memory["snapshot_host_bytes_per_device_max"] == sharded + packed
    assert memory["snapshot_host_bytes_per_device_max"] <= 1.1 * memory["state_bytes"] / PER_SLICE


@pytest.mark.slow
def test_with_snapshots_off_the_snapshot_host_bytes_are_zero(tmp_path):
    with SimulatedSlices(SLICES, PER_SLICE):
        result = Trainer(**_model(), config=_config(snapshot_every=0), run_dir=tmp_path / "run",
                         train=TrainConfig(sharding="replicated")).fit(2)
    memory = result.summary["memory"]
    assert memory["snapshot_host_bytes_per_device_max"] == 0
    assert memory["state_bytes_per_device_max"] == memory["state_bytes"]  # replicated: whole everywhere
    assert result.shardings["params"]["w"].spec == P()


@pytest.mark.slow
def test_a_model_axis_2_lm_run_from_the_command_line_splits_block_weights_over_model(tmp_path):
    """The recipe's ``model_sharding`` rule reaches the ``Trainer`` as the command line gives
    it, combined with the named ``sharding``; the evaluation split is evaluated on the same
    tensor-parallel layout."""
    parser = argparse.ArgumentParser()
    console.add_options(parser)
    args = parser.parse_args([
        "lm", "--model-axis", "2", "--sharding", "fsdp", "--steps", "3", "--global-batch", "8",
        "--run-dir", str(tmp_path / "run"), "--snapshot-every", "1", "--eval-every", "2",
        "--set", "d_model=32", "--set", "layers=1", "--set", "seq_len=16", "--set", "corpus_chars=5000",
    ])
    plan = planning.plan_run(console.config_of(args))
    assert plan.elastic.model_axis == 2 and plan.train.sharding == "fsdp"
    outcome = execution.execute(plan)
    assert outcome.status == 0 and outcome.result.final_step == 3
    evaluated = outcome.result.summary["eval"]
    assert evaluated["step"] == 2 and 2 < evaluated["metrics"]["loss"] < 4
    block = outcome.result.shardings["params"]["blocks"][0]
    assert block["qkv"].spec == P(None, "model") and block["mlp_in"].spec == P(None, "model")
    assert block["proj"].spec == P("model", None) and block["mlp_out"].spec == P("model", None)
    assert block["qkv"].shard_shape((32, 96)) == (32, 48)
    assert outcome.result.shardings["params"]["embed"].spec == P()  # not a block weight: whole
    mu = outcome.result.shardings["opt_state"][1][0].mu["blocks"][0]  # adamw's moments follow
    assert mu["proj"].spec == P("model", None)
    losses = [e["loss"] for e in record.read_events(outcome.run_dir) if e["event"] == "step"]
    assert len(losses) == 3 and all(np.isfinite(losses))
    memory = outcome.result.summary["memory"]
    assert 0 < memory["state_bytes_per_device_max"] < memory["state_bytes"]


def test_a_sharding_callable_naming_replica_is_refused_before_the_run_directory_is_written(tmp_path):
    def across_slices(path, leaf, mesh):
        return P("replica") if leaf.ndim else P()

    trainer = Trainer(**_model(), config=_config(), run_dir=tmp_path / "run",
                      train=TrainConfig(sharding=across_slices))
    with SimulatedSlices(SLICES, PER_SLICE):
        with pytest.raises(ValueError, match="over 'replica'.*name only 'data' and 'model'"):
            trainer.fit(2)
    assert not (tmp_path / "run" / "events.jsonl").exists()


@pytest.mark.parametrize("sharding", ["zero", 3])
def test_an_unknown_sharding_is_refused_when_its_train_config_is_built(sharding):
    with pytest.raises(ValueError, match=f"sharding={sharding!r} must be one of replicated, fsdp, or a callable"):
        TrainConfig(sharding=sharding)


def test_train_and_report_print_the_memory_figures(reference):
    from elastic_dew.commands.report import report

    memory = reference.summary["memory"]
    shown = record.format_summary(reference.summary)
    line = next(row for row in shown.splitlines() if row.startswith("memory"))
    assert f"{memory['state_bytes'] / 2**20:.2f} MiB" in line
    assert f"{memory['snapshot_host_bytes_per_device_max'] / 2**20:.2f} MiB" in line
    summary, _, table = report(reference.run_dir, timeline=False)
    assert summary["memory"] == memory and line in table
