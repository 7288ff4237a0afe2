"""The model interface the trainer's program runs, and its functional model.

A model gives :class:`~elastic_dew.trainer.program.ModelProgram` five things:

- ``given()``: the parameters and other variables the model already holds, or ``None``
  (``init`` then builds them from a key);
- ``init(key, given) -> (params, variables)``: ``variables`` are what the model carries
  besides its parameters (an NNX model's batch statistics and RNG streams), or ``None``;
- ``loss(params, variables, batch, key, *, train) -> (loss, metrics, variables)``: one
  batch's scalar loss, its metrics (a dict of scalars, :func:`split_loss`) and the updated
  variables; ``train`` is ``False`` in evaluation passes;
- ``result(params, variables)``: what ``FitResult.model`` holds (``None`` for a model that
  is its functions);
- ``annotations``: the variables' own sharding annotations, or ``None``.

:class:`Functional` is the model of ``Trainer(init=, loss=)``;
:class:`elastic_dew.trainer.flax_nnx.NnxModel` is the one of ``Trainer.from_nnx``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Functional", "split_loss"]


def split_loss(out: Any, where: str = "the loss function") -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(loss, metrics)`` of a loss function's output: a scalar, or a scalar and a dict of
    scalars.

    Args:
        out: what the loss function returned.
        where: how an error names the loss function.

    Returns:
        The loss and its metrics (``{}`` when it returned none).

    Raises:
        TypeError: (at trace time) any other form, naming the form it has."""
    if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], Mapping):
        loss, metrics = out
    elif isinstance(out, (tuple, list)):
        raise TypeError(
            f"{where} returned a {type(out).__name__} of {len(out)} items; return the loss (a "
            "scalar) or (loss, metrics) with metrics a dict of scalars, e.g. "
            "return loss, {'accuracy': acc}"
        )
    else:
        loss, metrics = out, {}
    if not hasattr(loss, "shape") or tuple(np.shape(loss)) != ():
        shape = tuple(np.shape(loss)) if hasattr(loss, "shape") else type(loss).__name__
        raise TypeError(
            f"{where} returned a loss of shape {shape}, not a scalar: gradients need one number. "
            "Reduce it (jnp.mean over the batch), and return anything else as (loss, metrics) "
            "with metrics a dict of scalars"
        )
    bad = {k: tuple(np.shape(v)) for k, v in metrics.items() if tuple(np.shape(v)) != ()}
    if bad or not all(isinstance(k, str) for k in metrics):
        raise TypeError(
            f"{where}'s metrics must be a dict of scalars with str names (averaged over the step "
            f"like the loss); got {bad or sorted(map(repr, metrics))}: reduce each to a scalar"
        )
    if "loss" in metrics:
        raise TypeError(f"{where}'s metrics name 'loss', which is the loss itself; rename that metric")
    return loss, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


class Functional:
    """The functional model: ``init(key) -> params`` and ``loss(params, batch, key)``.

    It carries no variables besides its parameters (``given``, ``init``'s second item and
    ``result`` are ``None``) and has no sharding annotations; ``eval_loss`` (``None``: the
    loss itself) is what an evaluation pass (``train=False``) computes.
    """

    annotations = None

    def __init__(self, init: Callable, loss: Callable, eval_loss: Callable | None = None) -> None:
        self._init, self._loss, self._eval_loss = init, loss, eval_loss

    def given(self) -> Any:
        return None

    def init(self, key: jax.Array, given: Any) -> tuple[Any, None]:
        del given
        return self._init(key), None

    def loss(self, params: Any, variables: Any, batch: Any, key: jax.Array, *, train: bool) -> tuple:
        fn = self._loss if train or self._eval_loss is None else self._eval_loss
        loss, metrics = split_loss(fn(params, batch, key), "loss" if fn is self._loss else "eval_loss")
        return loss, metrics, variables

    def result(self, params: Any, variables: Any) -> Any:
        return None

