"""``lm``: a small decoder-only transformer language model, in plain JAX.

Characters of the synthetic corpus in :mod:`elastic_dew.recipes.data` are the tokens; ``data=DIR`` trains
on text files tokenized the same way into ArrayRecord shards instead (``elastic-dew data
prepare``, :mod:`elastic_dew.recipes.data.files`), and ``data_workers=N`` reads them through ``N`` Grain
worker processes. The model is a
GPT-style stack (token and learned position embeddings, pre-norm blocks of causal
multi-head attention and a GELU MLP, a final norm, the output tied to the token embedding)
written over ordinary pytrees, so it needs nothing beyond JAX and Optax, and the same file
runs on simulated CPU slices and on real slices under Pathways (``JAX_PLATFORMS=proxy``).

With the defaults the loss falls from about 3.3 (a uniform guess over the 30 characters)
to below 1.5 within a few hundred steps on a laptop CPU.

Tensor parallelism: with ``--model-axis N`` above 1, :func:`model_sharding` splits each
block's weights over the ``model`` axis the Megatron way: the matrices that go in
(``qkv``, ``mlp_in``) by columns, the ones that come out (``proj``, ``mlp_out``) by rows, so
each ``model`` device computes its share of the heads and of the MLP. ``fsdp`` then splits
what is left over ``data``. ``compute_dtype="bfloat16"`` computes in bfloat16 while the
parameters (the master weights the optimizer updates) stay float32.

Run it with ``elastic-dew train lm`` or ``python -m elastic_dew.recipes.lm`` (same options).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from elastic_dew.settings import Bound, check_fields, setting
from elastic_dew.recipes._common import make_config
from elastic_dew.recipes.data import VOCABULARY, corpus, encode

__all__ = ["LMConfig", "DEFAULTS", "build", "forward", "next_token_loss", "optimizer", "model_sharding", "main"]

#: Training settings this recipe runs well with; ``elastic-dew train lm`` uses them unless told otherwise.
DEFAULTS = {"steps": 300, "global_batch": 48}


_COUNT = Bound(1, whole=True)


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The model, the optimizer and the data of the recipe; ``build(**overrides)`` sets any field."""

    seq_len: int = setting(64, bound=_COUNT)
    d_model: int = setting(64, bound=_COUNT)
    heads: int = setting(4, bound=_COUNT)
    layers: int = setting(2, bound=_COUNT)
    mlp_ratio: int = setting(4, bound=_COUNT)
    learning_rate: float = setting(3e-3, bound=Bound(0, strict=True))
    warmup_steps: int = setting(20, bound=Bound(0, whole=True))
    corpus_chars: int = setting(200_000, bound=_COUNT)
    examples: int = setting(1_000_000, bound=_COUNT)
    stride: int = setting(37, bound=_COUNT)
    #: the share of the corpus held out for evaluation, below 1
    eval_fraction: float = setting(0.1, bound=Bound(0, strict=True))
    eval_examples: int = setting(192, bound=_COUNT)
    compute_dtype: str = setting("float32", choices=("float32", "bfloat16"))
    #: a directory from ``elastic-dew data prepare`` ("": the synthetic corpus)
    data: str = ""
    #: Grain worker processes reading the data (0: read in the training process)
    data_workers: int = setting(0, bound=Bound(0, whole=True))

    def __post_init__(self) -> None:
        if not isinstance(self.data, str):
            raise ValueError(f"data={self.data!r} must be a directory (from `elastic-dew data prepare`)")
        check_fields(self)  # SettingError for a field outside its bound or choices
        problems = []
        if self.d_model % self.heads:
            problems.append(f"d_model={self.d_model} must be divisible by heads={self.heads}")
        if not self.eval_fraction < 1:
            problems.append(f"eval_fraction={self.eval_fraction} must be below 1")
        elif self.corpus_chars - _held_out(self) <= self.seq_len + 1:
            problems.append(
                f"corpus_chars={self.corpus_chars} less its evaluation split ({_held_out(self)} "
                f"characters) must exceed seq_len + 1 = {self.seq_len + 1}"
            )
        if problems:
            raise ValueError("invalid lm recipe settings: " + "; ".join(problems))


def _held_out(cfg: LMConfig) -> int:
    """The characters at the corpus's end kept for evaluation."""
    return int(cfg.corpus_chars * cfg.eval_fraction)


def _windows(tokens: np.ndarray, seq_len: int, stride: int, examples: int) -> Any:
    """Example ``i``: ``seq_len + 1`` tokens of the corpus starting at ``i * stride`` (wrapping)."""
    import grain  # here, not at the top: the model and its optimizer need no data pipeline

    starts = len(tokens) - seq_len
    return grain.MapDataset.range(examples).map(
        lambda i: {"tokens": tokens[(i * stride) % starts : (i * stride) % starts + seq_len + 1]})


def _dense(key: jax.Array, fan_in: int, fan_out: int) -> jax.Array:
    return jax.random.normal(key, (fan_in, fan_out), jnp.float32) * 0.02


def init_params(key: jax.Array, cfg: LMConfig) -> dict:
    """Parameters as a pytree of ``float32`` arrays."""
    vocab, d = len(VOCABULARY), cfg.d_model
    keys = iter(jax.random.split(key, 2 + 4 * cfg.layers))
    # Residual projections are scaled down with depth, as in GPT-2.
    residual_scale = 1.0 / math.sqrt(2 * cfg.layers)
    blocks = []
    for _ in range(cfg.layers):
        blocks.append({
            "norm1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "qkv": _dense(next(keys), d, 3 * d),
            "proj": _dense(next(keys), d, d) * residual_scale,
            "norm2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
            "mlp_in": _dense(next(keys), d, cfg.mlp_ratio * d),
            "mlp_out": _dense(next(keys), cfg.mlp_ratio * d, d) * residual_scale,
        })
    return {
        "embed": _dense(next(keys), vocab, d),
        "position": _dense(next(keys), cfg.seq_len, d),
        "blocks": blocks,
        "norm_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
    }


def _norm(x: jax.Array, p: dict) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def _attention(x: jax.Array, block: dict, heads: int) -> jax.Array:
    batch, length, d = x.shape
    q, k, v = jnp.split(x @ block["qkv"], 3, axis=-1)
    split = lambda t: t.reshape(batch, length, heads, d // heads)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((length, length), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return mixed.reshape(batch, length, d) @ block["proj"]


#: How each block weight is split over ``model``: column-split in, row-split out.
_MODEL_SPLIT = {"qkv": (None, "model"), "mlp_in": (None, "model"), "proj": ("model", None), "mlp_out": ("model", None)}


def model_sharding(path: tuple, leaf: jax.ShapeDtypeStruct, mesh: jax.sharding.Mesh) -> jax.sharding.PartitionSpec:
    """The ``model``-axis split of parameter ``path`` (a block's weight matrices; the rest whole).

    A weight whose split dimension the ``model`` axis does not divide stays whole, so any
    ``d_model`` trains; ``fsdp`` adds ``data`` on a free dimension
    (:func:`elastic_dew.elastic.slices.sharding.with_model_rule`).
    """
    P = jax.sharding.PartitionSpec
    name = getattr(path[-1], "key", None) if path else None
    blocks = len(path) == 3 and getattr(path[0], "key", None) == "blocks"
    split = _MODEL_SPLIT.get(name) if name is not None and blocks else None
    if split is None:
        return P()
    dim = split.index("model")
    return P(*split) if leaf.shape[dim] % mesh.shape["model"] == 0 else P()


def forward(params: dict, tokens: jax.Array, cfg: LMConfig) -> jax.Array:
    """Next-token logits ``[batch, length, vocab]`` for ``tokens`` ``[batch, length]``.

    Computed in ``cfg.compute_dtype``; the logits are float32 for the loss.
    """
    params = jax.tree.map(lambda p: p.astype(cfg.compute_dtype), params)
    length = tokens.shape[1]
    x = params["embed"][tokens] + params["position"][:length]
    for block in params["blocks"]:
        x = x + _attention(_norm(x, block["norm1"]), block, cfg.heads)
        h = jax.nn.gelu(_norm(x, block["norm2"]) @ block["mlp_in"])
        x = x + h @ block["mlp_out"]
    return (_norm(x, params["norm_f"]) @ params["embed"].T).astype(jnp.float32)


def next_token_loss(params: dict, tokens: jax.Array, cfg: LMConfig) -> jax.Array:
    """The mean cross-entropy of predicting each of ``tokens[:, 1:]`` from the tokens before it."""
    logits = forward(params, tokens[:, :-1], cfg)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def optimizer(cfg: LMConfig) -> optax.GradientTransformation:
    """AdamW with a linear warm-up to ``cfg.learning_rate``, gradients clipped to a global norm of 1."""
    schedule = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def build(**overrides) -> dict:
    """The recipe's parts: ``init``, ``loss``, ``optimizer``, ``dataset``, ``eval_dataset`` (up to
    ``eval_examples`` windows of the corpus's last ``eval_fraction``, which training never
    sees; ``None`` with ``data=DIR``), ``model_sharding`` and ``data_workers``.

    ``overrides`` set :class:`LMConfig` fields (``d_model=128``, ``layers=4``, ...); with
    ``data=DIR`` the examples are the prepared files' and ``seq_len`` is theirs.
    """
    data = overrides.get("data")
    if data:
        from elastic_dew.recipes.data.files import load

        dataset, manifest = load(data)
        if overrides.get("seq_len", manifest["seq_len"]) != manifest["seq_len"]:
            raise ValueError(
                f"seq_len={overrides['seq_len']} differs from the seq_len={manifest['seq_len']} "
                f"{data} was prepared with; drop seq_len or prepare the data again"
            )
        overrides = {**overrides, "seq_len": manifest["seq_len"]}
    cfg = make_config(LMConfig, overrides, "lm")
    eval_dataset = None
    if not data:
        tokens = encode(corpus(cfg.corpus_chars))
        # The corpus's end (eval_fraction of it) is the evaluation split: never trained on.
        cut = len(tokens) - _held_out(cfg)
        train, held_out = tokens[:cut], tokens[cut:]
        dataset = _windows(train, cfg.seq_len, cfg.stride, cfg.examples)
        windows = min(cfg.eval_examples, len(held_out) // (cfg.seq_len + 1))
        eval_dataset = _windows(held_out, cfg.seq_len, cfg.seq_len + 1, windows)

    def init(key: jax.Array) -> dict:
        return init_params(key, cfg)

    def loss(params: dict, batch: dict, key: jax.Array) -> jax.Array:
        del key  # no dropout: the model is deterministic given its parameters
        return next_token_loss(params, batch["tokens"], cfg)

    return {
        "init": init, "loss": loss, "optimizer": optimizer(cfg), "dataset": dataset,
        "eval_dataset": eval_dataset, "model_sharding": model_sharding, "data_workers": cfg.data_workers,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m elastic_dew.recipes.lm [train options]``: the same as ``elastic-dew train lm``."""
    from elastic_dew import console
    from elastic_dew.runtime import install_exit_hook

    install_exit_hook()  # program start: an uncaught Preempted exits 143
    # Plans the run, prepares the process (XLA flags before the backend opens), trains.
    return console.main("lm", build, argv)


if __name__ == "__main__":
    sys.exit(main())
