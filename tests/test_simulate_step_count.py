"""Step counting in loops that announce nothing, shaped as real trainers are: smaller programs
dispatched around the training step (an initialiser, a data generator, a metrics program, an
evaluation step) count no step, so a step-keyed fault fires at that training step.

The loops import nothing of elastic_dew and run under pathwaysutils' real
``Manager.elastic_retry``; :class:`SimulatedSlices` stands in for TPU slices on the test
process's 8 CPU devices (conftest).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.elastic import manager

from elastic_dew.simulate import SimulatedSlices

pytestmark = pytest.mark.libraries  # the simulator's patches

FEATURES = 64
BATCH = 8


def _trainer(elastic_manager: manager.Manager, steps: int, record: list, *, evaluate_every: int = 0):
    """A trainer's loop on synthetic data: an initialiser, then per step a jitted data
    generator, the training step, a metrics program and, every ``evaluate_every`` steps, an
    evaluation step; a read of the loss each step."""

    @elastic_manager.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=30)
    def loop():
        devices = [d for i in sorted(elastic_manager.active_slice_indices)
                   for d in elastic_manager.slice_to_devices[i]]
        mesh = Mesh(np.asarray(devices), ("data",))
        replicated = NamedSharding(mesh, PartitionSpec())
        rows = NamedSharding(mesh, PartitionSpec("data"))

        def init(key):
            return {"w": jax.random.normal(key, (FEATURES, FEATURES)), "m": jnp.zeros((FEATURES, FEATURES))}

        def synthetic_batch(key):
            return jax.random.normal(key, (BATCH * len(devices), FEATURES))

        def train_step(state, batch):
            loss, grad = jax.value_and_grad(lambda w: jnp.mean((batch @ w) ** 2))(state["w"])
            m = 0.9 * state["m"] + grad
            return {"w": state["w"] - 0.01 * m, "m": m}, loss

        def eval_step(state, batch):
            return jnp.mean((batch @ state["w"]) ** 2)

        state = jax.jit(init, out_shardings=replicated)(jax.random.PRNGKey(0))
        generate = jax.jit(synthetic_batch, out_shardings=rows)
        step_fn = jax.jit(train_step, out_shardings=(replicated, replicated), donate_argnums=0)
        metrics = jax.jit(lambda loss: {"loss": loss, "perplexity": jnp.exp(loss)})
        evaluate = jax.jit(eval_step)
        record.append(("attempt", elastic_manager.active_slice_count))
        for step in range(1, steps + 1):
            batch = generate(jax.random.PRNGKey(step))
            state, loss = step_fn(state, batch)
            shown = metrics(loss)
            if evaluate_every and step % evaluate_every == 0:
                float(evaluate(state, batch))
            float(shown["loss"])
            record.append(("step", step))
        return state

    return loop()


@pytest.mark.parametrize("evaluate_every", [0, 2], ids=["data, step, metrics", "data, step, metrics, eval"])
def test_a_trainer_dispatching_programs_around_its_step_counts_one_step_per_training_step(evaluate_every):
    record: list = []
    with SimulatedSlices(4, 2) as sim:
        _trainer(manager.Manager(), 6, record, evaluate_every=evaluate_every)
    assert sim.steps == 6


@pytest.mark.parametrize("evaluate_every", [0, 2], ids=["data, step, metrics", "data, step, metrics, eval"])
def test_a_step_keyed_loss_fires_at_that_training_step_of_such_a_trainer(evaluate_every):
    record: list = []
    with SimulatedSlices(4, 2, schedule="lose:1@5") as sim:
        _trainer(manager.Manager(), 6, record, evaluate_every=evaluate_every)
    steps = [r[1] if r[0] == "step" else r for r in record]
    # Step 5's loss is never read: the attempt ends after step 4, the next runs all 6 on 3 slices.
    assert steps == [("attempt", 4), 1, 2, 3, 4, ("attempt", 3), 1, 2, 3, 4, 5, 6]
    assert sim.steps == 11 and sim.unfired == ()


@pytest.mark.slow
def test_when_the_step_rule_finds_no_step_the_verdict_says_so_and_names_step_function(tmp_path):
    """A program that ran to its end without a dispatch the rule takes for a step (its state
    never goes through a program of its own) gets its step-keyed faults reported never fired
    with the cause and the fix: name the step function."""
    import json
    import subprocess
    import sys

    program = tmp_path / "no_step.py"
    program.write_text("import jax.numpy as jnp\nfor _ in range(5):\n    float(jnp.ones(4).sum())\nprint('done')\n")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "simulate", "--slices", "2", "--devices-per-slice", "2",
         "--schedule", "lose:1@2", "--report", str(report), "--run-dir", str(tmp_path / "run"), "--",
         sys.executable, str(program)], capture_output=True, text=True, timeout=300)
    verdict = json.loads(report.read_text())
    assert verdict["never_fired"] == ["lose:1@2/step"] and verdict["exit"] == 1
    assert "no dispatch was found to be the loop's step" in verdict["never_cause"]
    assert "NEVER FIRED lose:1@2/step (no dispatch was found" in done.stderr
    assert "--step-function NAME" in done.stderr
