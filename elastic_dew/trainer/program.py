"""The protocol's program of one model and optimizer: :class:`ModelProgram`.

The training state is ``{"params", "opt_state", "rng"}``, plus ``"variables"`` for a model
that carries variables besides its parameters. It is replicated across slices (the
``replica`` axis), which is what the in-memory snapshots need: every slice holds a whole
copy. Inside a slice it is laid out by the ``sharding`` policy
(:mod:`elastic_dew.elastic.slices.sharding`): ``fsdp`` by default, each large parameter and its
optimizer moments split over the slice's ``data`` devices. A step's gradient is one
batch's (:func:`grad`) or, with a ``microbatch``, the mean of its micro-steps'
(:func:`accumulated`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from elastic_dew.elastic.slices import sharding as shardings
from elastic_dew.elastic.slices.mesh import AXES, batch_sharding, micro_steps, replicated

__all__ = ["ModelProgram", "Micro", "grad", "accumulated"]


@dataclasses.dataclass(frozen=True)
class Micro:
    """A step's micro-steps: ``steps`` of them over ``shards`` data-parallel devices, each
    micro-batch (stacked on a leading micro-step axis) laid out by ``sharding``."""

    steps: int
    shards: int
    sharding: NamedSharding



def grad(model: Any, params: Any, variables: Any, batch: Any, key: jax.Array) -> tuple:
    """``(loss, metrics, variables), grads`` of one batch."""

    def objective(p: Any) -> tuple:
        loss, metrics, new_variables = model.loss(p, variables, batch, key, train=True)
        return loss, (metrics, new_variables)

    (loss, (metrics, new_variables)), grads = jax.value_and_grad(objective, has_aux=True)(params)
    return (loss, metrics, new_variables), grads


def accumulated(model: Any, params: Any, variables: Any, batch: Any, key: jax.Array, micro: Micro) -> tuple:
    """The loss, metrics and gradient of ``batch`` as means over ``micro.steps`` micro-batches.

    Each device's rows are split in place (device ``d``'s ``j``-th micro-batch is rows
    ``j*M .. (j+1)*M`` of its own share), so no example moves between devices; a
    ``lax.scan`` runs the micro-steps one after another, so memory holds one micro-batch's
    activations and one running gradient sum. For a loss that is a mean over examples, the
    mean of the micro-steps' gradients is the full batch's gradient. Every micro-step sees
    the step's one key; the model's other variables (batch statistics) are carried from
    one micro-step to the next.
    """

    def split(x: jax.Array) -> jax.Array:
        rows = x.reshape(micro.shards, micro.steps, -1, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(rows.reshape(micro.steps, -1, *x.shape[1:]), micro.sharding)

    micro_batches = jax.tree.map(split, batch)
    first = jax.tree.map(lambda x: x[0], micro_batches)
    (loss_shape, metric_shapes, _), _ = jax.eval_shape(functools.partial(grad, model), params, variables, first, key)

    def one(carry: tuple, micro_batch: Any) -> tuple[tuple, None]:
        loss_sum, metric_sum, grad_sum, variables = carry
        (loss, metrics, variables), grads = grad(model, params, variables, micro_batch, key)
        return (
            loss_sum + loss,
            jax.tree.map(jnp.add, metric_sum, metrics),
            jax.tree.map(jnp.add, grad_sum, grads),
            variables,
        ), None

    zeros = (
        jnp.zeros(loss_shape.shape, loss_shape.dtype),
        jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metric_shapes),
        jax.tree.map(jnp.zeros_like, params),
        variables,
    )
    (loss_sum, metric_sum, grad_sum, variables), _ = jax.lax.scan(one, zeros, micro_batches)
    mean = lambda x: x / micro.steps  # noqa: E731
    return (mean(loss_sum), jax.tree.map(mean, metric_sum), variables), jax.tree.map(mean, grad_sum)


class ModelProgram:
    """The protocol's :class:`~elastic_dew.elastic.loop.program.Program` of one model and optimizer:
    state shapes and shardings, fresh state, compiled train and evaluation steps.

    ``example`` is one example of the dataset (the batch's structure without its leading
    axis); ``host_parts`` are the state parts a ``Layout`` keeps in pinned host memory
    between steps; ``policy`` lays the state out inside a slice
    (:mod:`elastic_dew.elastic.slices.sharding`); ``microbatch`` is ``TrainConfig.microbatch``.

    The state is ``{"params", "opt_state", "rng"}``, plus ``"variables"`` when the model
    carries variables other than its parameters (an NNX model's batch statistics and RNG
    streams): they are updated by the step, not by the optimizer.

    Args:
        model: the model (:mod:`elastic_dew.trainer.model`'s interface: a functional model or
            an NNX one).
        optimizer: an ``optax.GradientTransformation``.
        example: one example of the dataset.
        seed: the seed of the parameters and the step keys.
        host_parts: the state parts kept in pinned host memory between steps.
        policy: the layout inside a slice (``fsdp``, ``replicated`` or a callable).
        microbatch: examples per data-parallel device per micro-step, or ``None``.
    """

    def __init__(self, model: Any, optimizer: optax.GradientTransformation, example: Any, seed: int = 0,
                 host_parts: frozenset[str] = frozenset(), policy: shardings.Policy = "fsdp",
                 microbatch: int | None = None) -> None:
        self._policy = policy
        self.microbatch = microbatch  # the protocol checks it against every slice count
        self.model = model
        self._optimizer = optimizer
        self._example = example
        self._seed = seed
        self._host_parts = host_parts
        self._given = model.given()
        # The model's init is traced once for the state's shapes; the shardings and abstract
        # state once per mesh (the loop, the precompiler and the tiers each ask for them).
        self._traced = threading.RLock()
        self._shapes: Any = None
        self._per_mesh: dict[jax.sharding.Mesh, tuple[Any, Any]] = {}

    def _init(self, key: jax.Array, given: Any) -> dict:
        params_key, rng = jax.random.split(key)
        params, variables = self.model.init(params_key, given)
        state = {"params": params, "opt_state": self._optimizer.init(params), "rng": rng}
        if variables is not None:
            state["variables"] = variables
        return state

    def _key(self) -> jax.Array:
        return jax.random.PRNGKey(self._seed)

    def check_loss(self, global_batch: int, *, evaluating: bool) -> None:
        """Trace the model's loss once on abstract values (and its evaluation loss too when
        ``evaluating``), so a loss of the wrong form raises here, before any file is
        written: ``TypeError`` from :func:`~elastic_dew.trainer.model.split_loss`.

        Args:
            global_batch: the batch the trace uses.
            evaluating: whether the evaluation loss is traced too.

        Raises:
            TypeError: a loss of the wrong form (from ``split_loss``).
        """
        shapes = self.shapes()
        batch = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((global_batch, *np.shape(x)), np.asarray(x).dtype), self._example
        )
        for train in (True, False) if evaluating else (True,):
            jax.eval_shape(
                lambda p, v, b, k, train=train: self.model.loss(p, v, b, k, train=train),
                shapes["params"], shapes.get("variables"), batch, self._key(),
            )

    def shapes(self) -> Any:
        """The state's shapes and dtypes (no shardings).

        The model's init is traced once per program; each call returns a fresh copy of the
        tree (its leaves are immutable).

        Returns:
            A pytree of ``jax.ShapeDtypeStruct``.
        """
        with self._traced:
            if self._shapes is None:
                self._shapes = jax.eval_shape(self._init, self._key(), self._given)
        return jax.tree.map(lambda x: x, self._shapes)

    def _on_mesh(self, mesh: jax.sharding.Mesh) -> tuple[Any, Any]:
        """The state's shardings and abstract state on ``mesh``, worked out once per mesh."""
        with self._traced:
            if mesh not in self._per_mesh:
                shapes = self.shapes()
                variables = shapes.pop("variables", None)
                out = shardings.state_shardings(self._policy, shapes, mesh)
                if variables is not None:
                    specs = shardings.param_specs(self._policy, variables, mesh)
                    out["variables"] = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                                                    is_leaf=lambda x: isinstance(x, PartitionSpec))
                abstract = jax.tree.map(
                    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), self.shapes(), out
                )
                self._per_mesh[mesh] = (out, abstract)
            return self._per_mesh[mesh]

    def state_shardings(self, mesh: jax.sharding.Mesh) -> Any:
        """The state's shardings on ``mesh``: the policy's inside a slice, replicated across.

        The model's other variables take the policy as the parameters do.

        Args:
            mesh: the attempt's mesh.

        Returns:
            A pytree of ``NamedSharding`` like the state.
        """
        return jax.tree.map(lambda x: x, self._on_mesh(mesh)[0])

    def abstract_state(self, mesh: jax.sharding.Mesh) -> Any:
        """The state's shapes and target shardings on ``mesh`` (:meth:`Program.abstract_state`).

        Args:
            mesh: the attempt's mesh.

        Returns:
            A pytree of ``jax.ShapeDtypeStruct`` carrying their shardings.
        """
        return jax.tree.map(lambda x: x, self._on_mesh(mesh)[1])

    def init_state(self, mesh: jax.sharding.Mesh) -> Any:
        """A fresh state on ``mesh``, from the seed (:meth:`Program.init_state`).

        Args:
            mesh: the attempt's mesh.

        Returns:
            The state.
        """
        return jax.jit(self._init, out_shardings=self.state_shardings(mesh))(self._key(), self._given)

    def _train_step(self, state: dict, batch: Any, micro: Micro | None = None) -> tuple[dict, dict]:
        rng, key = jax.random.split(state["rng"])
        variables = state.get("variables")
        if micro is None:
            (loss, metrics, variables), grads = grad(self.model, state["params"], variables, batch, key)
        else:
            (loss, metrics, variables), grads = accumulated(self.model, state["params"], variables, batch, key, micro)
        updates, opt_state = self._optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        new_state = {"params": params, "opt_state": opt_state, "rng": rng}
        if variables is not None:
            new_state["variables"] = variables
        return new_state, {"loss": loss, **metrics}

    def _eval_metrics(self, state: dict, batch: Any) -> dict:
        key = jax.random.fold_in(jax.random.PRNGKey(self._seed), 0x0E7A1)  # one fixed key for every pass
        loss, metrics, _ = self.model.loss(state["params"], state.get("variables"), batch, key, train=False)
        return {"loss": jnp.asarray(loss, jnp.float32), **metrics}

    def compile_eval(self, mesh: jax.sharding.Mesh, batch_size: int):
        """``(sums, state, batch) -> sums`` for :mod:`elastic_dew.elastic.loop.evaluation`: the
        loss and metrics of one batch (the model in evaluation mode, one fixed key) added to
        ``sums`` (zeros for a pass's first batch), one compiled program per mesh.

        Args:
            mesh: the attempt's mesh.
            batch_size: the evaluation batch.

        Returns:
            The compiled evaluation step.
        """
        rep = replicated(mesh)
        abstract_state = self.abstract_state(mesh)
        abstract_batch = self._abstract_batch(mesh, batch_size)
        sums_shape = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep),
            jax.eval_shape(self._eval_metrics, abstract_state, abstract_batch),
        )

        def add(sums: dict, state: dict, batch: Any) -> dict:
            return jax.tree.map(jnp.add, sums, self._eval_metrics(state, batch))

        compiled = jax.jit(add, out_shardings=rep).lower(sums_shape, abstract_state, abstract_batch).compile()
        on_device = self._on_device(mesh)

        def eval_fn(sums: dict | None, state: dict, batch: Any) -> dict:
            if sums is None:
                sums = jax.tree.map(lambda x: jax.device_put(np.zeros(x.shape, x.dtype), rep), sums_shape)
            return compiled(sums, on_device(state), batch)

        return eval_fn

    def _on_device(self, mesh: jax.sharding.Mesh) -> Callable[[dict], dict]:
        """Moves the parts a ``Layout`` keeps in host memory onto the devices (identity
        without host parts)."""
        if not self._host_parts:
            return lambda state: state
        state_sharding = self.state_shardings(mesh)
        parts = self._host_parts
        return lambda state: {k: jax.device_put(v, state_sharding[k]) if k in parts else v for k, v in state.items()}

    def _abstract_batch(self, mesh: jax.sharding.Mesh, global_batch: int) -> Any:
        in_batch = batch_sharding(mesh)
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((global_batch, *np.shape(x)), np.asarray(x).dtype, sharding=in_batch),
            self._example,
        )

    def _micro(self, mesh: jax.sharding.Mesh, global_batch: int) -> Micro | None:
        """How ``global_batch`` splits into micro-steps on ``mesh`` (``None``: no accumulation)."""
        if self.microbatch is None:
            return None
        steps, shards = micro_steps(global_batch, mesh, self.microbatch)
        return Micro(steps, shards, NamedSharding(mesh, PartitionSpec(None, AXES[:2])))

    def compile(self, mesh: jax.sharding.Mesh, global_batch: int):
        """The compiled training step on ``mesh`` (:meth:`Program.compile`).

        Args:
            mesh: the attempt's mesh.
            global_batch: the attempt's global batch.

        Returns:
            ``step(state, batch) -> (state, metrics)``.
        """
        state_sharding = self.state_shardings(mesh)
        abstract_batch = self._abstract_batch(mesh, global_batch)
        train_step = functools.partial(self._train_step, micro=self._micro(mesh, global_batch))
        compiled = (
            jax.jit(train_step, out_shardings=(state_sharding, replicated(mesh)))
            .lower(self.abstract_state(mesh), abstract_batch)
            .compile()
        )
        if not self._host_parts:
            return compiled
        host = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), state_sharding)
        parts = self._host_parts

        def step(state: dict, batch: Any) -> tuple[dict, dict]:
            # The parts the Layout names live in host memory between steps.
            on_device = {k: jax.device_put(v, state_sharding[k]) if k in parts else v for k, v in state.items()}
            new_state, metrics = compiled(on_device, batch)
            return {k: jax.device_put(v, host[k]) if k in parts else v for k, v in new_state.items()}, metrics

        return step

