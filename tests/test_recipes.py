"""The recipes as plain JAX: their parts have the promised shapes and a jitted loop learns.

These run each recipe's ``init``, ``loss`` and ``optimizer`` in an ordinary single-device
training loop, without the elastic layer, so a failure here is the model's, not the
protocol's.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import optax
import pytest

from elastic_dew.recipes import lm, mlp
from elastic_dew.recipes.data import VOCABULARY, corpus, decode, encode


def _train(parts: dict, steps: int, batch: int) -> list[float]:
    """Plain jitted SGD loop over consecutive batches of the recipe's dataset."""
    optimizer = parts["optimizer"]
    params = jax.jit(parts["init"])(jax.random.PRNGKey(0))
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, batch, key):
        loss, grads = jax.value_and_grad(parts["loss"])(params, batch, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    dataset, losses = parts["dataset"], []
    for i in range(steps):
        examples = [dataset[j] for j in range(i * batch, (i + 1) * batch)]
        stacked = jax.tree.map(lambda *xs: np.stack(xs), *examples)
        params, opt_state, loss = step(params, opt_state, stacked, jax.random.PRNGKey(i))
        losses.append(float(loss))
    return losses


def test_the_corpus_is_the_same_text_on_every_build_and_uses_only_its_vocabulary():
    text = corpus(5000)
    assert text == corpus(5000) and len(text) == 5000
    assert corpus(5000, seed=1) != text
    assert set(text) <= set(VOCABULARY)
    assert decode(encode(text)) == text
    with pytest.raises(ValueError, match="'#' is not in the corpus vocabulary"):
        encode("a#b")


def test_lm_examples_are_windows_of_the_corpus_one_token_longer_than_the_context():
    parts = lm.build(seq_len=16, corpus_chars=1000, examples=50)
    dataset = parts["dataset"]
    assert len(dataset) == 50
    example = dataset[3]
    assert example["tokens"].shape == (17,) and example["tokens"].dtype == np.int32
    assert decode(example["tokens"]) in corpus(1000)
    assert {"init", "loss", "optimizer", "dataset", "eval_dataset", "model_sharding", "data_workers"} == set(parts)
    assert parts["data_workers"] == 0


def test_lms_evaluation_split_is_the_corpus_end_that_training_never_reads():
    parts = lm.build(seq_len=16, corpus_chars=1000, examples=500)
    # What Trainer(**parts) and the train command take from the recipe.
    assert set(parts) == {"init", "loss", "optimizer", "dataset", "eval_dataset", "model_sharding", "data_workers"}
    text = corpus(1000)
    held_out = text[900:]  # eval_fraction 0.1
    evaluated = [decode(parts["eval_dataset"][i]["tokens"]) for i in range(len(parts["eval_dataset"]))]
    assert len(evaluated) == 100 // 17 and all(window in held_out for window in evaluated)
    trained = {decode(parts["dataset"][i]["tokens"]) for i in range(500)}
    assert all(window in text[:900] for window in trained)


#: The small ``lm`` the model tests share: its parameters are initialised once, and its
#: forward pass and loss compiled once per dtype, for every test that reads them.
SMALL = dict(seq_len=16, d_model=32, heads=2, layers=1, corpus_chars=2000)
_forward = jax.jit(lm.forward, static_argnums=2)


@pytest.fixture(scope="module")
def small_lm() -> dict:
    """The small ``lm``'s config, untrained parameters, a batch of 8 windows of the corpus,
    and the recipe's loss and gradients on that batch computed in each dtype."""
    parts = lm.build(**SMALL)
    tokens = np.stack([parts["dataset"][i]["tokens"] for i in range(8)])
    params = jax.jit(parts["init"])(jax.random.PRNGKey(0))
    losses = {}
    for dtype in ("float32", "bfloat16"):
        loss = lm.build(**SMALL, compute_dtype=dtype)["loss"]
        losses[dtype] = jax.jit(jax.value_and_grad(loss))(params, {"tokens": tokens}, jax.random.PRNGKey(1))
    return {"cfg": lm.LMConfig(**SMALL), "params": params, "tokens": tokens, "losses": losses}


def test_lm_logits_cover_the_vocabulary_and_the_untrained_loss_is_a_uniform_guess(small_lm):
    logits = _forward(small_lm["params"], small_lm["tokens"][:, :-1], small_lm["cfg"])
    assert logits.shape == (8, 16, len(VOCABULARY))
    loss, _ = small_lm["losses"]["float32"]
    assert abs(float(loss) - math.log(len(VOCABULARY))) < 0.2


def test_lm_attention_is_causal_so_later_tokens_never_change_earlier_logits(small_lm):
    tokens = small_lm["tokens"][:, :-1]
    changed = tokens.copy()
    changed[0, 10:] = (changed[0, 10:] + 1) % len(VOCABULARY)
    a = _forward(small_lm["params"], tokens, small_lm["cfg"])
    b = _forward(small_lm["params"], changed, small_lm["cfg"])
    np.testing.assert_allclose(a[0, :10], b[0, :10], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[0, 10:], b[0, 10:])
    np.testing.assert_array_equal(a[1:], b[1:])  # the other windows are untouched


def test_lm_loss_goes_down_visibly_in_a_plain_jitted_loop():
    losses = _train(lm.build(seq_len=16, d_model=32, heads=2, layers=1), steps=80, batch=16)
    assert losses[0] > 3.0
    assert np.mean(losses[-10:]) < 0.75 * losses[0]


def test_mlp_loss_goes_down_in_a_plain_jitted_loop():
    losses = _train(mlp.build(), steps=60, batch=24)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:3])


def test_mlp_examples_are_fixed_numbers_with_the_configured_shapes():
    a, b = mlp.build()["dataset"], mlp.build()["dataset"]
    assert len(a) == mlp.MLPConfig().examples
    assert a[5]["x"].shape == (8,) and a[5]["y"].shape == (1,)
    np.testing.assert_array_equal(a[5]["x"], b[5]["x"])


@pytest.mark.parametrize(
    ("recipe", "overrides", "message"),
    [
        (lm, {"d_model": 30, "heads": 4}, "d_model=30 must be divisible by heads=4"),
        (lm, {"depth": 3}, "no setting depth; its settings are seq_len"),
        (mlp, {"learning_rate": 0}, "learning_rate=0 must be > 0"),
        (mlp, {"hiden": 3}, "no setting hiden"),
    ],
)
def test_bad_recipe_settings_are_refused_with_the_fix(recipe, overrides, message):
    with pytest.raises(ValueError, match=message):
        recipe.build(**overrides)


def test_every_recipe_declares_the_training_defaults_the_train_command_uses():
    for recipe in (lm, mlp):
        assert recipe.DEFAULTS["steps"] >= 1
        # Divisible by every data-parallel width from 1 to 4 slices of 2 devices.
        assert all(recipe.DEFAULTS["global_batch"] % (2 * s) == 0 for s in range(1, 5))


def test_lm_in_bfloat16_keeps_float32_master_weights_and_a_float32_loss_near_the_float32_one(small_lm):
    losses = {}
    for dtype, (loss, grads) in small_lm["losses"].items():
        assert loss.dtype == np.float32
        assert {str(g.dtype) for g in jax.tree.leaves(grads)} == {"float32"}  # master weights stay float32
        losses[dtype] = float(loss)
    assert losses["bfloat16"] != losses["float32"]  # it did compute in bfloat16
    assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.02)
