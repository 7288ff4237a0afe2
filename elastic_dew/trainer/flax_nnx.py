"""Flax NNX models in the :class:`~elastic_dew.trainer.Trainer`, without glue.

:meth:`Trainer.from_nnx <elastic_dew.trainer.Trainer.from_nnx>` wraps a model here. The
model is split once (``nnx.split(model, nnx.Param, ...)``) into its graph definition and
two pure dicts of arrays: the parameters, which the optimizer updates, and every other
variable (``nnx.BatchStat`` running statistics, ``nnx.Rngs`` keys and counters, caches),
which the forward pass updates. Both are training state (``state["params"]`` and
``state["variables"]``), so snapshots, checkpoints, restores onto another mesh and the
sharding policy treat an NNX model's every collection as they treat parameters.

Inside the compiled step the model is rebuilt with ``nnx.merge`` from the traced arrays,
the user's ``loss(model, batch)`` runs on it, and the variables it changed are split off
again and returned: the merge happens inside the differentiated function, at the trace
level of the step, so NNX's trace checks hold and a ``BatchNorm``'s statistics (or a
``Dropout``'s RNG counter) advance with every step. The graph definition is static; the
training-mode and evaluation-mode graph definitions (``model.train()``/``model.eval()``:
dropout, the running average in batch norm) are taken once each.

Shardings: a variable annotated with ``nnx.with_partitioning`` (its ``out_sharding``
metadata, ``sharding`` in older Flax: names of mesh axes) keeps that spec when it names only ``data`` and ``model``; a named
policy (``fsdp``) then adds ``data`` where the annotation left a dimension free, and a
``sharding`` callable overrides annotations. An annotation naming another axis is refused
with the variable's path. Typed PRNG keys and integer counters are replicated
(:mod:`elastic_dew.elastic.slices.sharding`). A model built here is built with Flax's eager
sharding off: the annotations are kept as metadata and applied on each mesh the run meets.

Needs Flax (the ``flax`` extra); importing this module without it raises ``ImportError``
saying so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec

from elastic_dew.elastic.slices import sharding as shardings
from elastic_dew.elastic.slices.mesh import AXES

try:
    from flax import nnx
except ImportError as error:  # pragma: no cover - the extra is in the test environment
    raise ImportError(
        "Trainer.from_nnx needs Flax: pip install 'elastic-dew[flax]'"
    ) from error

__all__ = ["NnxModel"]

_INSIDE = AXES[1:]  # the axes a slice's state may be split over: data, model


def _pure(state: Any) -> dict:
    return nnx.to_pure_dict(state)



def _split(module: Any) -> tuple[Any, Any, Any]:
    """``nnx.split(module, nnx.Param, ...)``: the module's graph, its parameters, the rest."""
    graph, params, *rest = nnx.split(module, nnx.Param, ...)
    return graph, params, rest[0]

class NnxModel:
    """An NNX module as the trainer's model (see the module).

    ``model``: an ``nnx.Module``, or a callable of an ``nnx.Rngs`` returning one (then the
    module is built from the run's seed, inside ``jax.eval_shape`` for its shapes and inside
    the initialising program for its values, so no copy of it lives on the host).
    ``loss(model, batch)``: the loss, or ``(loss, metrics)``. ``eval_loss``: the same, for
    evaluation passes (``None``: ``loss``). Raises ``TypeError`` for anything else.
    """

    def __init__(self, model: Any, loss: Callable, eval_loss: Callable | None = None, *, seed: int = 0) -> None:
        if not callable(loss):
            raise TypeError(f"loss must be a callable loss(model, batch), not {type(loss).__name__}")
        if eval_loss is not None and not callable(eval_loss):
            raise TypeError(f"eval_loss must be a callable eval_loss(model, batch), not {type(eval_loss).__name__}")
        if isinstance(model, nnx.Module):
            self._build = None
            template = model
        elif callable(model):
            self._build = model
            with _lazy_sharding():
                template = nnx.eval_shape(lambda: self._built(nnx.Rngs(seed)))
        else:
            raise TypeError(
                f"model must be an nnx.Module or a function of an nnx.Rngs that builds one, not "
                f"{type(model).__name__}"
            )
        self._loss, self._eval_loss = loss, eval_loss
        self._module = model if self._build is None else None
        graph, params, rest = _split(template)
        self._train_graph = graph
        self._templates = (params, rest)  # structure and metadata, for merges and annotations
        template.eval()
        self._eval_graph = nnx.split(template, nnx.Param, ...)[0]
        template.train()
        self.annotations = {**_annotations(params), **_annotations(rest)}
        self._has_variables = bool(jax.tree.leaves(_pure(rest)))

    # -- what the trainer's program asks -----------------------------------------------
    def given(self) -> Any:
        """The module's current arrays, for a module given built (``None`` for a builder)."""
        if self._module is None:
            return None
        _, params, rest = _split(self._module)
        return _pure(params), (_pure(rest) if self._has_variables else None)

    def _built(self, rngs: nnx.Rngs) -> Any:
        assert self._build is not None, "only a model function is built"
        module = self._build(rngs)
        if not isinstance(module, nnx.Module):
            raise TypeError(
                f"the model function returned {type(module).__name__}, not an nnx.Module; "
                "give an nnx.Module or a function of an nnx.Rngs that builds one"
            )
        return module

    def init(self, key: jax.Array, given: Any) -> tuple[Any, Any]:
        if given is not None:
            return given
        with _lazy_sharding():
            module = self._built(nnx.Rngs(key))
        _, params, rest = _split(module)
        return _pure(params), (_pure(rest) if self._has_variables else None)

    def _merge(self, graph: Any, params: dict, variables: dict | None) -> Any:
        param_state, rest_state = (jax.tree.map(lambda x: x, t) for t in self._templates)
        nnx.replace_by_pure_dict(param_state, params)
        if variables is not None:
            nnx.replace_by_pure_dict(rest_state, variables)
        return nnx.merge(graph, param_state, rest_state)

    def loss(self, params: dict, variables: dict | None, batch: Any, key: jax.Array, *, train: bool) -> tuple:
        from elastic_dew.trainer.model import split_loss

        del key  # an NNX model draws from its own nnx.Rngs, which are state
        model = self._merge(self._train_graph if train else self._eval_graph, params, variables)
        fn = self._loss if train or self._eval_loss is None else self._eval_loss
        loss, metrics = split_loss(fn(model, batch), "loss" if fn is self._loss else "eval_loss")
        if not train or variables is None:
            return loss, metrics, variables
        _, _, rest = _split(model)
        return loss, metrics, _pure(rest)

    def result(self, params: dict, variables: dict | None) -> Any:
        """The trained module (host arrays), in training mode."""
        return self._merge(self._train_graph, params, variables)

    def policy(self, policy: shardings.Policy) -> shardings.Policy:
        """``policy`` with the variables' own annotations honoured (see the module)."""
        shardings.check_policy(policy)
        if not isinstance(policy, str) or not self.annotations:
            return policy
        annotations = self.annotations

        def annotated(path: tuple, leaf: Any, mesh: jax.sharding.Mesh) -> PartitionSpec:
            base = annotations.get(_key(path), PartitionSpec())
            if policy == "fsdp":
                return shardings.fsdp_spec(path, leaf, mesh, base=base)
            return base

        return annotated


def _lazy_sharding() -> Any:
    """Variables created without applying their annotations (Flax's eager sharding needs a
    mesh at creation; the trainer lays the state out on each mesh it meets, by them)."""
    use = getattr(nnx, "use_eager_sharding", None)
    return use(False) if use is not None else contextlib.nullcontext()


def _key(path: tuple) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)


def _annotations(state: Any) -> dict[tuple, PartitionSpec]:
    """The ``PartitionSpec`` of each annotated variable of ``state``, by its path."""
    out: dict[tuple, PartitionSpec] = {}
    for path, variable in jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]:
        metadata = variable.get_metadata() if hasattr(variable, "get_metadata") else {}
        names = next((metadata[k] for k in ("out_sharding", "sharding_names", "sharding") if metadata.get(k)), None)
        if not names:
            continue
        named = [a for dim in names if dim is not None for a in ((dim,) if isinstance(dim, str) else dim)]
        unknown = [a for a in named if a not in _INSIDE]
        where = jax.tree_util.keystr(path)
        if unknown:
            raise ValueError(
                f"the NNX variable {where} is annotated with sharding {tuple(names)}, which names "
                f"{', '.join(map(repr, unknown))}; elastic_dew's mesh splits a slice's state over "
                f"{' and '.join(map(repr, _INSIDE))} only (replicated across slices): annotate "
                "with those names, or pass sharding= a callable (path, leaf, mesh) -> PartitionSpec"
            )
        out[_key(path)] = PartitionSpec(*names)
    return out
