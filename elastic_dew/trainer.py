"""``Trainer.fit``: a model, an optimizer and a dataset, run through the elastic protocol.

The trainer is thin on purpose: it turns ordinary JAX pytree functions (``init(key) ->
params`` and ``loss(params, batch, key) -> scalar``; a Flax model works through the same
two functions) and an Optax optimizer into the :class:`~elastic_dew.elastic.protocol.Program`
the protocol runs, and feeds the protocol's typed events to one stream
(:class:`~elastic_dew.observe.sinks.Sinks`): the run record (:mod:`elastic_dew.record`)
first, then the caller's sinks. Everything about surviving faults is the protocol's.

The training state is ``{"params", "opt_state", "rng"}``. It is replicated across slices
(the ``replica`` axis), which is what the in-memory snapshots need: every slice holds a whole
copy. Inside a slice it is laid out by the ``sharding`` policy
(:mod:`elastic_dew.elastic.sharding`): ``fsdp`` by default, each large parameter and its
optimizer moments split over the slice's ``data`` devices.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from elastic_dew import rundir
from elastic_dew.elastic import events
from elastic_dew.elastic import sharding as shardings
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.data import ElasticData
from elastic_dew.elastic.evaluation import Evaluation
from elastic_dew.elastic.protocol import ElasticRun
from elastic_dew.elastic.slices import AXES, batch_sharding, mesh_of, replicated
from elastic_dew.observe.sinks import Sinks
from elastic_dew.runtime import Layout, PreemptionNotice
from elastic_dew.train_config import TrainConfig

__all__ = ["Trainer", "TrainConfig", "FitResult"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What ``fit`` ended with: the last completed step, the parameters (as numpy), the summary,
    the final state's shardings (a tree of ``NamedSharding`` like the state), and for a
    :meth:`Trainer.from_nnx` run the trained ``nnx.Module`` (``None`` otherwise)."""

    final_step: int
    params: Any
    summary: dict
    run_dir: Path
    shardings: Any = None
    model: Any = None


@dataclasses.dataclass(frozen=True)
class _Micro:
    """A step's micro-steps: ``steps`` of them over ``shards`` data-parallel devices, each
    micro-batch (stacked on a leading micro-step axis) laid out by ``sharding``."""

    steps: int
    shards: int
    sharding: NamedSharding


def split_loss(out: Any, where: str = "the loss function") -> tuple[jax.Array, dict[str, jax.Array]]:
    """``(loss, metrics)`` of a loss function's output: a scalar, or a scalar and a dict of
    scalars. Raises ``TypeError`` (at trace time) naming the form for anything else."""
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


class _Functional:
    """The functional model: ``init(key) -> params`` and ``loss(params, batch, key)``.

    A model (this one, or :mod:`elastic_dew.flax_nnx`'s) gives :class:`_Program` its
    parameters, the other variables it carries (``None`` here) and a loss that returns
    ``(loss, metrics, variables)``; ``train`` is ``False`` in evaluation passes.
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


def _grad(model: Any, params: Any, variables: Any, batch: Any, key: jax.Array) -> tuple:
    """``(loss, metrics, variables), grads`` of one batch."""

    def objective(p: Any) -> tuple:
        loss, metrics, new_variables = model.loss(p, variables, batch, key, train=True)
        return loss, (metrics, new_variables)

    (loss, (metrics, new_variables)), grads = jax.value_and_grad(objective, has_aux=True)(params)
    return (loss, metrics, new_variables), grads


def _accumulated(model: Any, params: Any, variables: Any, batch: Any, key: jax.Array, micro: _Micro) -> tuple:
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
    (loss_shape, metric_shapes, _), _ = jax.eval_shape(functools.partial(_grad, model), params, variables, first, key)

    def one(carry: tuple, micro_batch: Any) -> tuple[tuple, None]:
        loss_sum, metric_sum, grad_sum, variables = carry
        (loss, metrics, variables), grads = _grad(model, params, variables, micro_batch, key)
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


class _Program:
    """The protocol's view of one model: state shapes, fresh state, compiled steps.

    The state is ``{"params", "opt_state", "rng"}``, plus ``"variables"`` when the model
    carries variables other than its parameters (an NNX model's batch statistics and RNG
    streams): they are updated by the step, not by the optimizer.
    """

    def __init__(self, model, optimizer, example, seed: int, host_parts: frozenset[str],
                 policy: shardings.Policy = "fsdp", microbatch: int | None = None):
        self._policy = policy
        self.microbatch = microbatch  # the protocol checks it against every slice count
        self.model = model
        self._optimizer = optimizer
        self._example = example
        self._seed = seed
        self._host_parts = host_parts
        self._given = model.given()

    def _init(self, key: jax.Array, given: Any) -> dict:
        params_key, rng = jax.random.split(key)
        params, variables = self.model.init(params_key, given)
        state = {"params": params, "opt_state": self._optimizer.init(params), "rng": rng}
        if variables is not None:
            state["variables"] = variables
        return state

    def _key(self) -> jax.Array:
        return jax.random.PRNGKey(self._seed)

    def shapes(self) -> Any:
        """The state's shapes and dtypes (no shardings)."""
        return jax.eval_shape(self._init, self._key(), self._given)

    def state_shardings(self, mesh: jax.sharding.Mesh) -> Any:
        """The state's shardings on ``mesh``: the policy's inside a slice, replicated across.

        The model's other variables take the policy as the parameters do.
        """
        shapes = self.shapes()
        variables = shapes.pop("variables", None)
        out = shardings.state_shardings(self._policy, shapes, mesh)
        if variables is not None:
            specs = shardings.param_specs(self._policy, variables, mesh)
            out["variables"] = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                                            is_leaf=lambda x: isinstance(x, PartitionSpec))
        return out

    def abstract_state(self, mesh: jax.sharding.Mesh) -> Any:
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            self.shapes(),
            self.state_shardings(mesh),
        )

    def init_state(self, mesh: jax.sharding.Mesh) -> Any:
        return jax.jit(self._init, out_shardings=self.state_shardings(mesh))(self._key(), self._given)

    def _train_step(self, state: dict, batch: Any, micro: _Micro | None = None) -> tuple[dict, dict]:
        rng, key = jax.random.split(state["rng"])
        variables = state.get("variables")
        if micro is None:
            (loss, metrics, variables), grads = _grad(self.model, state["params"], variables, batch, key)
        else:
            (loss, metrics, variables), grads = _accumulated(self.model, state["params"], variables, batch, key, micro)
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
        """``(sums, state, batch) -> sums`` for :mod:`elastic_dew.elastic.evaluation`: the
        loss and metrics of one batch (the model in evaluation mode, one fixed key) added to
        ``sums`` (zeros for a pass's first batch), one compiled program per mesh."""
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

    def _micro(self, mesh: jax.sharding.Mesh, global_batch: int) -> _Micro | None:
        """How ``global_batch`` splits into micro-steps on ``mesh`` (``None``: no accumulation)."""
        if self.microbatch is None:
            return None
        shards = mesh.shape[AXES[0]] * mesh.shape[AXES[1]]
        per_device = global_batch // shards
        if per_device % self.microbatch:  # ElasticRun refuses this up front; a direct caller is told here
            raise ValueError(
                f"microbatch={self.microbatch} does not divide the per-device batch of {per_device} "
                f"(global batch {global_batch} over {shards} data-parallel devices)"
            )
        return _Micro(per_device // self.microbatch, shards, NamedSharding(mesh, PartitionSpec(None, AXES[:2])))

    def compile(self, mesh: jax.sharding.Mesh, global_batch: int):
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


class Trainer:
    """Train a model elastically: ``Trainer(...).fit(steps)``.

    Arguments:
      init: ``init(key) -> params``, any pytree of arrays.
      loss: ``loss(params, batch, key)`` returning the loss (a scalar) or ``(loss,
        metrics)``, ``metrics`` a dict of scalars; ``batch`` is the dataset's example
        structure with a leading global-batch axis. Metrics are averaged over the step like
        the loss (over its micro-steps), read with it (one step behind) and written to the
        step lines, the log, the progress display and TensorBoard. A loss of any other form
        is refused when the ``Trainer`` is built, before anything is written.
      eval_loss: the loss (same signature and forms) an evaluation pass computes; ``None``:
        ``loss`` itself. Evaluation passes call it with one fixed key.
      optimizer: an ``optax.GradientTransformation``.
      dataset: a ``grain.MapDataset`` of examples (pytrees of numpy arrays), finite and
        deterministic; the elastic layer batches it and keeps its position.
      config: the :class:`~elastic_dew.elastic.config.ElasticConfig`. Its
        ``checkpoint_dir`` defaults to ``RUN_DIR/checkpoints`` (the workers' multi-tier
        directory for ``multi_tier``: :meth:`~elastic_dew.elastic.config.ElasticConfig.checkpoint_dir_for`).
      run_dir: the run directory: run record, checkpoints, final parameters.
      layout: the same :class:`~elastic_dew.runtime.Layout` given to ``prepare_process``.
        Host-owned parts live in pinned host memory between steps; in-memory snapshots need
        the state replicated on the slices' mesh, so ``Layout(host=...)`` requires
        ``snapshot_every=0`` (persistent checkpoints still protect the run).
      train: the :class:`~elastic_dew.train_config.TrainConfig` (log lines, seed, the
        state's layout inside a slice, gradient accumulation, evaluation cadence).
      sinks: callables that each receive every typed event of the run, in order, after
        the run record has it (a progress display, TensorBoard, the goodput export, your
        own); a sink that raises is logged and dropped. Their owner closes them.
      notice: a ``PreemptionNotice``; by default one is created for the duration of ``fit``.
      manager: a pathwaysutils ``Manager`` to use instead of creating one.
      model_sharding: a model's own tensor-parallel rule ``(path, leaf, mesh) ->
        PartitionSpec`` over ``model`` (the ``lm`` recipe's ``build()`` returns one), or
        ``None``. It applies when the config's ``model_axis`` is above 1, and a named
        ``train.sharding`` is laid on top of it (``fsdp`` adds ``data`` on a dimension it left
        free): :func:`~elastic_dew.elastic.sharding.with_model_rule`. A ``sharding``
        callable already decides the ``model`` axis, so the two together are refused.
      on_accepted: called with no argument once the protocol has accepted the slices and
        the batch, just before the run record's first line is written, or ``None``: where
        a caller writes what belongs beside the record (the run writes its identity,
        ``command.json``), so a refused run leaves its directory untouched.
      data_workers: Grain worker processes reading ``dataset`` (0, the default: read in this
        process); see :class:`~elastic_dew.elastic.data.ElasticData`.
      eval_dataset: a ``grain.MapDataset`` of examples to evaluate, or ``None``; it goes
        with ``train.eval_every``. A pass runs after every multiple of it, over the same
        ``len(eval_dataset) // eval_batch`` batches each time, on the current mesh, and is
        an ``eval`` event (:mod:`elastic_dew.elastic.evaluation`).

    :meth:`from_nnx` builds a ``Trainer`` from a Flax NNX model.
    """

    def __init__(
        self,
        *,
        init: Callable[[jax.Array], Any],
        loss: Callable[[Any, Any, jax.Array], Any],
        optimizer: optax.GradientTransformation,
        dataset: Any,
        config: ElasticConfig,
        run_dir: str | os.PathLike,
        eval_loss: Callable[[Any, Any, jax.Array], Any] | None = None,
        **options: Any,
    ) -> None:
        for name, fn in (("init", init), ("loss", loss), ("eval_loss", eval_loss)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable, not {type(fn).__name__}")
        self._configure(_Functional(init, loss, eval_loss), optimizer=optimizer, dataset=dataset,
                        config=config, run_dir=run_dir, **options)

    @classmethod
    def from_nnx(
        cls,
        model: Any,
        loss: Callable[[Any, Any], Any],
        *,
        optimizer: optax.GradientTransformation,
        dataset: Any,
        config: ElasticConfig,
        run_dir: str | os.PathLike,
        eval_loss: Callable[[Any, Any], Any] | None = None,
        **options: Any,
    ) -> Trainer:
        """A ``Trainer`` of a Flax NNX model, with no glue (:mod:`elastic_dew.flax_nnx`).

        ``model`` is an ``nnx.Module``, or a function of an ``nnx.Rngs`` that builds one
        (called with ``nnx.Rngs(seed)``-derived keys). ``loss(model, batch)`` returns the
        loss or ``(loss, metrics)``, as NNX code is written; it runs with the model in
        training mode, and evaluation passes with it in evaluation mode (``model.eval()``:
        dropout off, batch statistics read). Every variable the model holds (parameters,
        batch statistics, RNG streams, caches) is training state: snapshotted,
        checkpointed, restored onto any mesh and laid out by ``sharding`` (each
        ``nnx.Param`` and other variable alike; a variable's own ``sharding`` annotation
        over ``data``/``model`` is kept, and ``fsdp`` adds ``data`` where it left a
        dimension free). Only ``nnx.Param`` variables are differentiated and optimized.
        ``FitResult.model`` is the trained model. The other arguments are the
        constructor's. Needs the ``flax`` extra.
        """
        from elastic_dew.flax_nnx import NnxModel

        trainer = cls.__new__(cls)
        train = options.get("train", TrainConfig())
        nnx_model = NnxModel(model, loss, eval_loss, seed=train.seed)
        if "model_sharding" in options:
            raise TypeError(
                "from_nnx takes no model_sharding: annotate the variables (nnx.with_partitioning) "
                "or give TrainConfig(sharding=) a callable"
            )
        options["train"] = dataclasses.replace(train, sharding=nnx_model.policy(train.sharding))
        trainer._configure(nnx_model, optimizer=optimizer, dataset=dataset, config=config,
                           run_dir=run_dir, **options)
        return trainer

    def _configure(
        self,
        model: Any,
        *,
        optimizer: optax.GradientTransformation,
        dataset: Any,
        config: ElasticConfig,
        run_dir: str | os.PathLike,
        train: TrainConfig = TrainConfig(),
        layout: Layout | None = None,
        sinks: Sequence[events.Sink] = (),
        notice: PreemptionNotice | None = None,
        manager: Any = None,
        model_sharding: Callable[[tuple, Any, jax.sharding.Mesh], PartitionSpec] | None = None,
        on_accepted: Callable[[], Any] | None = None,
        data_workers: int = 0,
        eval_dataset: Any = None,
    ) -> None:
        if not isinstance(train, TrainConfig):
            raise TypeError(f"train must be a TrainConfig, not {type(train).__name__}")
        sharding = train.sharding
        if model_sharding is not None and not callable(model_sharding):
            raise TypeError(
                f"model_sharding must be a callable (path, leaf, mesh) -> PartitionSpec over "
                f"'model', or None, not {type(model_sharding).__name__}"
            )
        if model_sharding is not None and not isinstance(sharding, str):
            raise ValueError(
                "model_sharding combines with a named sharding (replicated or fsdp), but "
                "sharding is a callable, which already decides the 'model' axis; give "
                "sharding='fsdp' (or 'replicated') with model_sharding, or fold the model rule "
                "into your callable and drop model_sharding"
            )
        if not isinstance(config, ElasticConfig):
            raise TypeError(f"config must be an ElasticConfig, not {type(config).__name__}")
        # Layout itself refuses parts other than params and opt_state.
        host = frozenset(layout.host) if layout is not None else frozenset()
        if host and config.snapshot_every:
            raise ValueError(
                f"Layout(host={sorted(host)}) keeps those state parts in host memory, but the "
                "in-memory snapshots need the whole state replicated on the slices' mesh; set "
                "snapshot_every=0 (persistent checkpoints still protect the run) or drop Layout.host"
            )
        if len(dataset) < 1:
            raise ValueError("the dataset is empty; give a MapDataset with at least one example")
        if not isinstance(data_workers, int) or isinstance(data_workers, bool) or data_workers < 0:
            raise ValueError(f"data_workers={data_workers!r} must be an int >= 0 (Grain worker processes)")
        self.data_workers = data_workers
        if (eval_dataset is None) != (train.eval_every is None):
            raise ValueError(
                "eval_dataset and TrainConfig.eval_every go together: give both (a MapDataset and "
                "the steps between evaluations) or neither"
            )
        self.evaluation = (
            None if eval_dataset is None else Evaluation(eval_dataset, train.eval_every, train.eval_batch)
        )
        self.run_dir = Path(run_dir)
        rundir.check(self.run_dir)  # the one rule; refused before anything is written
        self.config = config
        self.dataset = dataset
        self.train = train
        self.sinks = list(sinks)
        self.notice = notice
        self.manager = manager
        self.on_accepted = on_accepted
        self._program = _Program(
            model, optimizer, dataset[0], train.seed, host, shardings.with_model_rule(sharding, model_sharding),
            train.microbatch,
        )
        self._check_loss(config)

    def _check_loss(self, config: ElasticConfig) -> None:
        """Trace the loss once on abstract values, so a loss of the wrong form is refused
        here, before any file is written (``split_loss`` says what is wrong)."""
        program = self._program
        shapes = program.shapes()
        batch = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((config.global_batch, *np.shape(x)), np.asarray(x).dtype),
            program._example,
        )
        for train in (True, False) if self.evaluation is not None else (True,):
            jax.eval_shape(
                lambda p, v, b, k, train=train: program.model.loss(p, v, b, k, train=train),
                shapes["params"], shapes.get("variables"), batch, program._key(),
            )

    def _log_line(self, event: events.Event) -> None:
        """The trainer's own log lines: a step every ``train.log_every``, each stop and resume."""
        if isinstance(event, events.Step):
            if event.step % self.train.log_every == 0:
                extra = "".join(f" {name} {value:.4g}" for name, value in event.metrics.items())
                logger.info("step %d loss %.4f%s on %d slices", event.step, event.loss, extra, event.slices)
        elif isinstance(event, (events.Stop, events.Resume)):
            logger.info("%s", {k: v for k, v in event.to_json().items() if k != "wall"})

    def fit(self, steps: int) -> FitResult:
        """Train until ``steps`` steps are complete, resuming the run directory's newest state.

        Raises ``Preempted(step)`` (exit 143 when uncaught) once a preemption notice has been
        honoured: the checkpoint and data position of ``step`` are committed, and the same
        command run again resumes there.
        """
        if steps < 1:
            raise ValueError(f"steps={steps} must be >= 1")
        from elastic_dew.record import RunRecord, process_start_time, write_summary

        start = events.Start(process_start=process_start_time(), pid=os.getpid())
        record: RunRecord | None = None
        stream: Sinks | None = None
        notice = self.notice if self.notice is not None else PreemptionNotice()
        try:
            # The protocol refuses slices, batch and minimum slice count that cannot work as
            # it is built; the run directory is written only once it has accepted them.
            run = ElasticRun(
                self._program,
                ElasticData(self.dataset, workers=self.data_workers),
                self.config,
                notice=notice,
                manager=self.manager,
                run_name=self.run_dir.name,
                evaluation=self.evaluation,
                run_dir=self.run_dir,  # tier 2's default directory (ElasticConfig.checkpoint_dir_for)
            )
            # A sharding callable that cannot lay the state out is refused here, on the
            # mesh of every slice, before the run directory is written.
            manager = run.manager
            devices = [d for i in sorted(manager.slice_to_devices) for d in manager.slice_to_devices[i]]
            self._program.abstract_state(mesh_of(devices, manager.total_slice_count, self.config.model_axis or 1))
            if self.on_accepted is not None:
                self.on_accepted()
            record = RunRecord(self.run_dir)
            run.emit = stream = Sinks([*self.sinks, self._log_line], required=[record])
            stream(start)
            state, step = run.run(steps)
            params = jax.device_get(state["params"])
            model = self._program.model.result(params, jax.device_get(state.get("variables")))
            placed = jax.tree.map(lambda a: a.sharding, state)
            memory = {
                "state_bytes": shardings.state_bytes(state),
                "state_bytes_per_device_max": shardings.bytes_per_device_max(state),
                "snapshot_host_bytes_per_device_max": (
                    run.snapshots.host_bytes_per_device if run.snapshots is not None else 0
                ),
            }
            del state
        finally:
            if self.notice is None:
                notice.close()
            if stream is not None:
                stream.end()
            if record is not None:
                record.close()
        summary = write_summary(self.run_dir, record.events(), params, memory=memory)
        return FitResult(final_step=step, params=params, summary=summary, run_dir=self.run_dir,
                         shardings=placed, model=model)
