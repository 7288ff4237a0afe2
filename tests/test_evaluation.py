"""Evaluation passes inside the protocol (``Trainer(eval_dataset=, train=TrainConfig(eval_every=))``): on the
current mesh, off the training data position, through a slice loss and a real SIGTERM."""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from elastic_dew import Trainer, TrainConfig
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.record import committed_step_lines, read_events
from elastic_dew.record.goodput import committed_evals
from elastic_dew.runtime import Preempted
from elastic_dew.simulate import SimulatedSlices

BATCH = 24


def _examples(n: int, seed: int) -> grain.MapDataset:
    xs = np.random.default_rng(seed).normal(size=(n, 3)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5], np.float32) + 0.3).astype(np.float32)
    return grain.MapDataset.range(n).map(lambda i: {"x": xs[i], "y": ys[i]})


def _trainer(run_dir, eval_every=3, eval_batch=None, **overrides) -> Trainer:
    def init(key):
        return {"w": jax.random.normal(key, (3,)) * 0.1, "b": jnp.zeros(())}

    def loss(params, batch, key):
        del key
        error = batch["x"] @ params["w"] + params["b"] - batch["y"]
        return jnp.mean(error**2), {"mae": jnp.mean(jnp.abs(error))}

    arguments = dict(
        init=init, loss=loss, optimizer=optax.sgd(0.1), dataset=_examples(512, 1),
        config=ElasticConfig(minimum_slice_count=1, poll_interval=0.05, timeout=60, global_batch=BATCH,
                             snapshot_every=2, checkpoint_every=4),
        run_dir=run_dir, eval_dataset=_examples(60, 2),
    )
    arguments.update(overrides)
    arguments["train"] = TrainConfig(eval_every=eval_every, eval_batch=eval_batch)
    return Trainer(**arguments)


def _evals(run_dir) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == "eval"]


def test_an_evaluation_interrupted_by_a_slice_loss_runs_again_after_the_resume_and_is_recorded_once(tmp_path):
    run = tmp_path / "run"
    with SimulatedSlices(4, 2, schedule="lose:3@3/eval", fault_log=run / "faults.jsonl"):
        result = _trainer(run).fit(7)
    lines = read_events(run)
    kinds = [(e["event"], e.get("reason") or e.get("source"), e["step"]) for e in lines if e["event"] != "start"
             and e["event"] not in ("save", "fault")]
    lost = kinds.index(("stop", "slice_lost", 3))
    assert ("eval", None, 3) not in kinds[:lost]  # the interrupted pass left no line
    assert [e["step"] for e in _evals(run)] == [3, 6]  # ... and ran again once the run got back to step 3
    assert [e.step for e in committed_evals(lines)] == [3, 6]
    (after_loss, later) = _evals(run)
    assert after_loss["slices"] == 3 and after_loss["batches"] == 2 and after_loss["examples_evaluated"] == 48
    assert set(after_loss["metrics"]) == {"loss", "mae"} and later["metrics"]["loss"] < after_loss["metrics"]["loss"]
    # The training data position never moved for it: every example once, in order.
    assert [e["examples"] for e in committed_step_lines(lines)] == [[BATCH * i, BATCH * (i + 1)] for i in range(7)]
    summary = result.summary
    assert summary["eval"] == {"step": 6, "metrics": later["metrics"]}
    seconds = sum(e["seconds"] for e in _evals(run))
    assert summary["custom_badput"] == {"eval_step": pytest.approx(seconds, abs=1e-5)}
    assert summary["badput"]["custom_badput_events"] == pytest.approx(seconds, abs=1e-5)


def test_a_preemption_during_an_evaluation_stops_at_once_and_the_resumed_run_evaluates_that_step_first(tmp_path):
    """The SIGTERM lands in the pass of step 3 (``preempt@3/eval``): the stop does not wait
    for the pass, its checkpoint owes it, and the re-run evaluates step 3 before step 4,
    through a slice lost during that owed pass too (``lose:3@3/eval`` in the re-run)."""
    run = tmp_path / "run"
    with SimulatedSlices(4, 2, schedule="preempt@3/eval", fault_log=run / "faults.jsonl"):
        with pytest.raises(Preempted) as stopped:
            _trainer(run).fit(4)
    assert stopped.value.step == 3 and not _evals(run)  # the pass cut short left no line
    with SimulatedSlices(4, 2, schedule="lose:3@3/eval", fault_log=run / "faults-rerun.jsonl"):
        _trainer(run).fit(4)
    kinds = [(e["event"], e.get("reason") or e.get("source"), e["step"]) for e in read_events(run)
             if e["event"] in ("eval", "step", "stop", "resume")]
    stop = kinds.index(("stop", "preempted", 3))
    assert kinds[stop + 1:] == [
        ("resume", "checkpoint", 4), ("stop", "slice_lost", 3),
        ("resume", "checkpoint", 4), ("eval", None, 3), ("step", None, 4), ("stop", "done", 4),
    ]
    assert [e["slices"] for e in _evals(run)] == [3]  # on the mesh of the attempt that ran it
    assert [e.step for e in committed_evals(read_events(run))] == [3]


def test_an_evaluation_pass_gives_the_same_metrics_on_any_slice_count(tmp_path):
    """The same batches each time, the metrics a mean over them: only float sums differ
    (a learning rate of 0 keeps the state, so every pass evaluates the same parameters)."""
    with SimulatedSlices(4, 2, schedule="lose:3@2", fault_log=tmp_path / "run" / "faults.jsonl"):
        _trainer(tmp_path / "run", optimizer=optax.sgd(0.0), eval_every=1).fit(2)
    evals = _evals(tmp_path / "run")
    assert {e["slices"] for e in evals} == {4, 3}
    for other in evals[1:]:
        assert other["metrics"] == pytest.approx(evals[0]["metrics"], rel=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(eval_every=None), "eval_dataset and TrainConfig.eval_every go together"),
        (dict(eval_every=0), "eval_every=0 must be a whole number >= 1"),
        (dict(eval_batch=16), "evaluation batch of 16 examples cannot be split over the 6 data-parallel devices"),
        (dict(eval_dataset=_examples(10, 2)), "the evaluation set has 10 examples, fewer than one"),
    ],
)
def test_an_evaluation_that_cannot_run_is_refused_before_anything_is_written(tmp_path, overrides, message):
    with SimulatedSlices(4, 2):
        with pytest.raises(ValueError, match=message):
            _trainer(tmp_path / "run", **overrides).fit(2)
    assert not (tmp_path / "run").exists()
