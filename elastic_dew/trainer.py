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
from elastic_dew.elastic.protocol import ElasticRun
from elastic_dew.elastic.slices import AXES, batch_sharding, mesh_of, replicated
from elastic_dew.observe.sinks import Sinks
from elastic_dew.runtime import Layout, PreemptionNotice

__all__ = ["Trainer", "FitResult"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What ``fit`` ended with: the last completed step, the parameters (as numpy), the summary,
    and the final state's shardings (a tree of ``NamedSharding`` like the state)."""

    final_step: int
    params: Any
    summary: dict
    run_dir: Path
    shardings: Any = None


@dataclasses.dataclass(frozen=True)
class _Micro:
    """A step's micro-steps: ``steps`` of them over ``shards`` data-parallel devices, each
    micro-batch (stacked on a leading micro-step axis) laid out by ``sharding``."""

    steps: int
    shards: int
    sharding: NamedSharding


def _accumulated(loss_fn: Callable, params: Any, batch: Any, key: jax.Array, micro: _Micro) -> tuple[Any, Any]:
    """The loss and gradient of ``batch`` as the mean over ``micro.steps`` micro-batches.

    Each device's rows are split in place (device ``d``'s ``j``-th micro-batch is rows
    ``j*M .. (j+1)*M`` of its own share), so no example moves between devices; a
    ``lax.scan`` runs the micro-steps one after another, so memory holds one micro-batch's
    activations and one running gradient sum. For a loss that is a mean over examples, the
    mean of the micro-steps' gradients is the full batch's gradient. Every micro-step sees
    the step's one ``key``.
    """

    def split(x: jax.Array) -> jax.Array:
        rows = x.reshape(micro.shards, micro.steps, -1, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(rows.reshape(micro.steps, -1, *x.shape[1:]), micro.sharding)

    micro_batches = jax.tree.map(split, batch)
    first = jax.tree.map(lambda x: x[0], micro_batches)
    loss_shape = jax.eval_shape(loss_fn, params, first, key)

    def one(carry: tuple, micro_batch: Any) -> tuple[tuple, None]:
        loss_sum, grad_sum = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, micro_batch, key)
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), None

    zeros = (jnp.zeros(loss_shape.shape, loss_shape.dtype), jax.tree.map(jnp.zeros_like, params))
    (loss_sum, grad_sum), _ = jax.lax.scan(one, zeros, micro_batches)
    return loss_sum / micro.steps, jax.tree.map(lambda g: g / micro.steps, grad_sum)


class _Program:
    """The protocol's view of one model: state shapes, fresh state, compiled steps."""

    def __init__(self, init, loss, optimizer, example, seed: int, host_parts: frozenset[str],
                 policy: shardings.Policy = "fsdp", microbatch: int | None = None):
        self._policy = policy
        self.microbatch = microbatch  # the protocol checks it against every slice count
        self._init_params = init
        self._loss = loss
        self._optimizer = optimizer
        self._example = example
        self._seed = seed
        self._host_parts = host_parts

    def _init(self, key: jax.Array) -> dict:
        params_key, rng = jax.random.split(key)
        params = self._init_params(params_key)
        return {"params": params, "opt_state": self._optimizer.init(params), "rng": rng}

    def _key(self) -> jax.Array:
        return jax.random.PRNGKey(self._seed)

    def state_shardings(self, mesh: jax.sharding.Mesh) -> Any:
        """The state's shardings on ``mesh``: the policy's inside a slice, replicated across."""
        return shardings.state_shardings(self._policy, jax.eval_shape(self._init, self._key()), mesh)

    def abstract_state(self, mesh: jax.sharding.Mesh) -> Any:
        return jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            jax.eval_shape(self._init, self._key()),
            self.state_shardings(mesh),
        )

    def init_state(self, mesh: jax.sharding.Mesh) -> Any:
        return jax.jit(self._init, out_shardings=self.state_shardings(mesh))(self._key())

    def _train_step(self, state: dict, batch: Any, micro: _Micro | None = None) -> tuple[dict, dict]:
        rng, key = jax.random.split(state["rng"])
        if micro is None:
            loss, grads = jax.value_and_grad(self._loss)(state["params"], batch, key)
        else:
            loss, grads = _accumulated(self._loss, state["params"], batch, key, micro)
        updates, opt_state = self._optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "rng": rng}, {"loss": loss}

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
        in_batch = batch_sharding(mesh)
        abstract_batch = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((global_batch, *np.shape(x)), np.asarray(x).dtype, sharding=in_batch),
            self._example,
        )
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
      loss: ``loss(params, batch, key) -> scalar``; ``batch`` is the dataset's example
        structure with a leading global-batch axis.
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
      log_every: steps between the trainer's step log lines.
      seed: the seed of parameters and of the per-step keys.
      sinks: callables that each receive every typed event of the run, in order, after
        the run record has it (a progress display, TensorBoard, the goodput export, your
        own); a sink that raises is logged and dropped. Their owner closes them.
      notice: a ``PreemptionNotice``; by default one is created for the duration of ``fit``.
      manager: a pathwaysutils ``Manager`` to use instead of creating one.
      sharding: how the state is laid out inside a slice (:mod:`elastic_dew.elastic.sharding`):
        ``"fsdp"`` (default: each parameter of at least 16 KiB, and its optimizer moments,
        split over the slice's ``data`` devices along its largest dimension they divide),
        ``"replicated"``, or a callable ``(path, leaf, mesh) -> PartitionSpec`` over ``data``
        and ``model`` (never ``replica``). Across slices the state is always replicated.
      model_sharding: a model's own tensor-parallel rule ``(path, leaf, mesh) ->
        PartitionSpec`` over ``model`` (the ``lm`` recipe's ``build()`` returns one), or
        ``None``. It applies when the config's ``model_axis`` is above 1, and a named
        ``sharding`` is laid on top of it (``fsdp`` adds ``data`` on a dimension it left
        free): :func:`~elastic_dew.elastic.sharding.with_model_rule`. A ``sharding``
        callable already decides the ``model`` axis, so the two together are refused.
      microbatch: examples per data-parallel device per micro-step, or ``None``. A step
        then accumulates gradients over ``per-device batch / microbatch`` micro-steps (a
        ``lax.scan``): the update is the full batch's, and a lost slice under the
        ``constant`` batch policy adds micro-steps instead of memory per device. A
        slice count whose per-device batch it does not divide is refused before the run.
      identity: the run's identity (``command.json``, :func:`elastic_dew.rundir.write_identity`),
        or ``None`` to write none. It is written once the protocol has accepted the slices
        and the batch, beside the run record's first line, so a refused run leaves its
        directory untouched.
      data_workers: Grain worker processes reading ``dataset`` (0, the default: read in this
        process); see :class:`~elastic_dew.elastic.data.ElasticData`.
    """

    def __init__(
        self,
        *,
        init: Callable[[jax.Array], Any],
        loss: Callable[[Any, Any, jax.Array], jax.Array],
        optimizer: optax.GradientTransformation,
        dataset: Any,
        config: ElasticConfig,
        run_dir: str | os.PathLike,
        layout: Layout | None = None,
        log_every: int = 10,
        seed: int = 0,
        sinks: Sequence[events.Sink] = (),
        notice: PreemptionNotice | None = None,
        manager: Any = None,
        sharding: shardings.Policy = "fsdp",
        model_sharding: Callable[[tuple, Any, jax.sharding.Mesh], PartitionSpec] | None = None,
        microbatch: int | None = None,
        identity: Mapping[str, Any] | None = None,
        data_workers: int = 0,
    ) -> None:
        shardings.check_policy(sharding)
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
        if microbatch is not None and (
            not isinstance(microbatch, int) or isinstance(microbatch, bool) or microbatch < 1
        ):
            raise ValueError(
                f"microbatch={microbatch!r} must be an int >= 1 (examples per data-parallel device "
                "per micro-step), or None for no accumulation"
            )
        if not isinstance(config, ElasticConfig):
            raise TypeError(f"config must be an ElasticConfig, not {type(config).__name__}")
        if log_every < 1:
            raise ValueError(f"log_every={log_every} must be >= 1 step")
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
        self.run_dir = Path(run_dir)
        rundir.check(self.run_dir)  # the one rule; refused before anything is written
        if config.checkpoint_dir is None:  # the one default (ElasticConfig.checkpoint_dir_for)
            config = dataclasses.replace(config, checkpoint_dir=config.checkpoint_dir_for(self.run_dir))
        self.config = config
        self.dataset = dataset
        self.log_every = log_every
        self.sinks = list(sinks)
        self.notice = notice
        self.manager = manager
        self.identity = dict(identity) if identity is not None else None
        self._program = _Program(
            init, loss, optimizer, dataset[0], seed, host, shardings.with_model_rule(sharding, model_sharding), microbatch
        )

    def _log_line(self, event: events.Event) -> None:
        """The trainer's own log lines: a step every ``log_every``, each stop and resume."""
        if isinstance(event, events.Step):
            if event.step % self.log_every == 0:
                logger.info("step %d loss %.4f on %d slices", event.step, event.loss, event.slices)
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
            )
            # A sharding callable that cannot lay the state out is refused here, on the
            # mesh of every slice, before the run directory is written.
            manager = run.manager
            devices = [d for i in sorted(manager.slice_to_devices) for d in manager.slice_to_devices[i]]
            self._program.abstract_state(mesh_of(devices, manager.total_slice_count, self.config.model_axis or 1))
            if self.identity is not None:
                rundir.write_identity(self.run_dir, self.identity)
            record = RunRecord(self.run_dir)
            run.emit = stream = Sinks([*self.sinks, self._log_line], required=[record])
            stream(start)
            state, step = run.run(steps)
            params = jax.device_get(state["params"])
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
            if record is not None:
                record.close()
        summary = write_summary(self.run_dir, record.events(), params, memory=memory)
        return FitResult(final_step=step, params=params, summary=summary, run_dir=self.run_dir, shardings=placed)
