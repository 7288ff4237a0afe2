"""``mlp``: a small multilayer perceptron on a synthetic regression task, for tests and quick checks.

The data are 16384 fixed examples ``x -> y`` with ``y = tanh(x W) v`` plus a little noise,
drawn once from a seeded generator, so every machine trains on the same numbers; the
evaluation split (``--eval-every``) is 1152 more of them, drawn apart. The model
is ``8 -> 32 -> 1`` with a tanh hidden layer, trained by plain SGD, whose updates are a
smooth function of the gradients: runs on different meshes stay ``allclose``.

Run it with ``elastic-dew train mlp`` or ``python -m elastic_dew.recipes.mlp`` (same options).
"""

from __future__ import annotations

import dataclasses
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax

from elastic_dew.settings import Bound, check_fields, setting
from elastic_dew.recipes._common import make_config

__all__ = ["MLPConfig", "DEFAULTS", "build", "make_data", "make_eval_data", "main"]

#: Training settings this recipe runs well with; ``elastic-dew train mlp`` uses them unless told otherwise.
DEFAULTS = {"steps": 40, "global_batch": 24}


_COUNT = Bound(1, whole=True)


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """The model, the optimizer and the data; ``build(**overrides)`` sets any field."""

    inputs: int = setting(8, bound=_COUNT)
    hidden: int = setting(32, bound=_COUNT)
    examples: int = setting(16384, bound=_COUNT)
    eval_examples: int = setting(1152, bound=_COUNT)
    learning_rate: float = setting(0.05, bound=Bound(0, strict=True))
    noise: float = setting(0.01, bound=Bound(0))
    data_seed: int = 1234

    def __post_init__(self) -> None:
        check_fields(self)  # SettingError for a field outside its bound


def _draw(cfg: MLPConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(cfg.data_seed)
    x = rng.standard_normal((cfg.examples, cfg.inputs)).astype(np.float32)
    w = rng.standard_normal((cfg.inputs, cfg.hidden)).astype(np.float32) / np.sqrt(cfg.inputs)
    v = rng.standard_normal((cfg.hidden, 1)).astype(np.float32) / np.sqrt(cfg.hidden)
    y = np.tanh(x @ w) @ v + cfg.noise * rng.standard_normal((cfg.examples, 1)).astype(np.float32)
    return x, y.astype(np.float32), w, v


def make_data(cfg: MLPConfig) -> tuple[np.ndarray, np.ndarray]:
    """The fixed regression data: ``x`` ``[examples, inputs]`` and ``y`` ``[examples, 1]``."""
    x, y, _, _ = _draw(cfg)
    return x, y


def make_eval_data(cfg: MLPConfig) -> tuple[np.ndarray, np.ndarray]:
    """The evaluation split: ``eval_examples`` more examples of the same function, drawn from
    a generator of their own (the training data do not depend on their number)."""
    _, _, w, v = _draw(cfg)
    rng = np.random.default_rng([cfg.data_seed, 1])
    x = rng.standard_normal((cfg.eval_examples, cfg.inputs)).astype(np.float32)
    y = np.tanh(x @ w) @ v + cfg.noise * rng.standard_normal((cfg.eval_examples, 1)).astype(np.float32)
    return x, y.astype(np.float32)


def _examples(x: np.ndarray, y: np.ndarray) -> grain.MapDataset:
    return grain.MapDataset.range(len(x)).map(lambda i: {"x": x[i], "y": y[i]})


def build(**overrides) -> dict:
    """The recipe's parts: ``init``, ``loss``, ``optimizer``, ``dataset`` and ``eval_dataset``.

    ``overrides`` set :class:`MLPConfig` fields (``hidden=64``, ``learning_rate=0.1``, ...).
    """
    cfg = make_config(MLPConfig, overrides, "mlp")
    x, y = make_data(cfg)

    def init(key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        return {
            "hidden": {
                "w": jax.random.normal(k1, (cfg.inputs, cfg.hidden)) / jnp.sqrt(cfg.inputs),
                "b": jnp.zeros(cfg.hidden),
            },
            "out": {
                "w": jax.random.normal(k2, (cfg.hidden, 1)) / jnp.sqrt(cfg.hidden),
                "b": jnp.zeros(1),
            },
        }

    def loss(params: dict, batch: dict, key: jax.Array) -> jax.Array:
        del key  # deterministic model
        h = jnp.tanh(batch["x"] @ params["hidden"]["w"] + params["hidden"]["b"])
        prediction = h @ params["out"]["w"] + params["out"]["b"]
        return jnp.mean((prediction - batch["y"]) ** 2)

    return {
        "init": init,
        "loss": loss,
        "optimizer": optax.sgd(cfg.learning_rate),
        "dataset": _examples(x, y),
        "eval_dataset": _examples(*make_eval_data(cfg)),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m elastic_dew.recipes.mlp [train options]``: the same as ``elastic-dew train mlp``."""
    from elastic_dew import console
    from elastic_dew.runtime import install_exit_hook

    install_exit_hook()  # program start: an uncaught Preempted exits 143
    # Plans the run, prepares the process (XLA flags before the backend opens), trains.
    return console.main("mlp", build, argv)


if __name__ == "__main__":
    sys.exit(main())
