"""``Trainer.fit``: a model, an optimizer and a dataset, run through the elastic protocol.

The trainer is thin on purpose: it checks its arguments before anything is written, turns
the model (:mod:`~elastic_dew.trainer.model`) and the optimizer into the protocol's
program (:class:`~elastic_dew.trainer.program.ModelProgram`), and runs it with
:class:`~elastic_dew.elastic.loop.protocol.ElasticRun`, whose typed events go to the run record
and the caller's sinks (:class:`~elastic_dew.trainer.recording.Recording`). Everything
about surviving faults is the protocol's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import optax
from jax.sharding import PartitionSpec

from elastic_dew import rundir
from elastic_dew.elastic import events
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.evaluation import Evaluation
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.elastic.slices import sharding as shardings
from elastic_dew.elastic.slices.mesh import mesh_of
from elastic_dew.runtime import Layout, PreemptionNotice
from elastic_dew.train_config import TrainConfig
from elastic_dew.trainer.model import Functional
from elastic_dew.trainer.program import ModelProgram
from elastic_dew.trainer.recording import Recording

__all__ = ["Trainer", "FitResult"]


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What ``fit`` ended with.

    Args:
        final_step: the last completed step.
        params: the final parameters, as numpy arrays.
        summary: the run's summary (``summary.json``'s fields).
        run_dir: the run directory.
        shardings: the final state's shardings (a tree of ``NamedSharding`` like the state).
        model: for a :meth:`Trainer.from_nnx` run the trained ``nnx.Module``, else ``None``.
    """

    final_step: int
    params: Any
    summary: dict
    run_dir: Path
    shardings: Any = None
    model: Any = None


def _train_of(train: TrainConfig | None) -> TrainConfig:
    """``train``, or ``TrainConfig()`` for ``None``."""
    if train is None:
        return TrainConfig()
    if not isinstance(train, TrainConfig):
        raise TypeError(f"train must be a TrainConfig, not {type(train).__name__}")
    return train


class Trainer:
    """Train a model elastically: ``Trainer(...).fit(steps)``.

    Args:
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
        state's layout inside a slice, gradient accumulation, evaluation cadence); ``None``:
        its defaults.
      sinks: callables that each receive every typed event of the run, in order, after
        the run record has it (a progress display, TensorBoard, the goodput export, your
        own); a sink that raises is logged and dropped. Their owner closes them.
      notice: a ``PreemptionNotice``; by default one is created for the duration of ``fit``.
      manager: a pathwaysutils ``Manager`` to use instead of creating one.
      model_sharding: a model's own tensor-parallel rule ``(path, leaf, mesh) ->
        PartitionSpec`` over ``model`` (the ``lm`` recipe's ``build()`` returns one), or
        ``None``. It applies when the config's ``model_axis`` is above 1, and a named
        ``train.sharding`` is laid on top of it (``fsdp`` adds ``data`` on a dimension it left
        free): :func:`~elastic_dew.elastic.slices.sharding.with_model_rule`. A ``sharding``
        callable already decides the ``model`` axis, so the two together are refused.
      on_accepted: called with no argument once the protocol has accepted the slices and
        the batch, just before the run record's first line is written, or ``None``: where
        a caller writes what belongs beside the record (the run writes its identity,
        ``command.json``), so a refused run leaves its directory untouched.
      data_workers: Grain worker processes reading ``dataset`` (0, the default: read in this
        process); see :class:`~elastic_dew.elastic.loop.data.ElasticData`.
      eval_dataset: a ``grain.MapDataset`` of examples to evaluate, or ``None``; it goes
        with ``train.eval_every``. A pass runs after every multiple of it, over the same
        ``len(eval_dataset) // eval_batch`` batches each time, on the current mesh, and is
        an ``eval`` event (:mod:`elastic_dew.elastic.loop.evaluation`).

    Raises:
      TypeError: a keyword that is not one of these parameters, a callable or config of the
        wrong type.
      ValueError: an argument the run cannot use (an empty dataset, a loss of the wrong form,
        ``eval_dataset`` without ``train.eval_every``, ``Layout.host`` with snapshots on, a
        run directory that is not one), refused before anything is written.

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
        train: TrainConfig | None = None,
        layout: Layout | None = None,
        sinks: Sequence[events.Sink] = (),
        notice: PreemptionNotice | None = None,
        manager: Any = None,
        model_sharding: Callable[[tuple, Any, jax.sharding.Mesh], PartitionSpec] | None = None,
        on_accepted: Callable[[], Any] | None = None,
        data_workers: int = 0,
        eval_dataset: Any = None,
    ) -> None:
        train = _train_of(train)
        for name, fn in (("init", init), ("loss", loss), ("eval_loss", eval_loss)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a callable, not {type(fn).__name__}")
        self._configure(Functional(init, loss, eval_loss), locals())

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
        train: TrainConfig | None = None,
        layout: Layout | None = None,
        sinks: Sequence[events.Sink] = (),
        notice: PreemptionNotice | None = None,
        manager: Any = None,
        on_accepted: Callable[[], Any] | None = None,
        data_workers: int = 0,
        eval_dataset: Any = None,
    ) -> Trainer:
        """A ``Trainer`` of a Flax NNX model, with no glue (:mod:`elastic_dew.trainer.flax_nnx`).

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
        Needs the ``flax`` extra.

        Args:
            model: an ``nnx.Module``, or a function of an ``nnx.Rngs`` that builds one.
            loss: ``loss(model, batch)``: the loss, or ``(loss, metrics)``.
            optimizer, dataset, config, run_dir, eval_loss, train, layout, sinks, notice,
              manager, on_accepted, data_workers, eval_dataset: as the constructor's
              (``eval_loss`` takes ``(model, batch)`` like ``loss``). There is no
              ``model_sharding``: annotate the variables (``nnx.with_partitioning``) or give
              ``TrainConfig(sharding=)`` a callable.

        Returns:
            The ``Trainer``; its :meth:`fit` returns a :class:`FitResult` whose ``model`` is
            the trained model.

        Raises:
            TypeError: a keyword that is not one of these parameters, or an argument of the
              wrong type.
            ValueError: an argument the run cannot use (as the constructor's), refused before
              anything is written.
            ImportError: Flax is not installed (the ``flax`` extra).
        """
        from elastic_dew.trainer.flax_nnx import NnxModel

        train = _train_of(train)
        nnx_model = NnxModel(model, loss, eval_loss, seed=train.seed)
        train = dataclasses.replace(train, sharding=nnx_model.policy(train.sharding))
        trainer = cls.__new__(cls)
        trainer._configure(nnx_model, locals())
        return trainer

    def _configure(self, model: Any, given: Mapping[str, Any]) -> None:
        """Check the run's arguments and keep them, for ``model`` (the protocol's view of it).

        ``given`` is the public constructor's own arguments by name (its ``locals()``, with
        ``train`` resolved): the constructor's and :meth:`from_nnx`'s signatures are the one
        declaration of what a run takes, and nothing here lists them again.
        """
        optimizer, dataset, config, run_dir, train = (
            given["optimizer"], given["dataset"], given["config"], given["run_dir"], given["train"]
        )
        layout, data_workers, eval_dataset = given["layout"], given["data_workers"], given["eval_dataset"]
        model_sharding = given.get("model_sharding")  # the constructor's alone
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
        self.sinks = list(given["sinks"])
        self.notice = given["notice"]
        self.manager = given["manager"]
        self.on_accepted = given["on_accepted"]
        self._program = ModelProgram(
            model, optimizer, dataset[0], train.seed, host, shardings.with_model_rule(sharding, model_sharding),
            train.microbatch,
        )
        # A loss of the wrong form is refused here, before any file is written.
        self._program.check_loss(config.global_batch, evaluating=self.evaluation is not None)

    @property
    def program(self) -> ModelProgram:
        """The protocol's :class:`~elastic_dew.elastic.loop.program.Program` that :meth:`fit` runs:
        for driving :class:`~elastic_dew.elastic.loop.protocol.ElasticRun` directly with this
        trainer's model, optimizer, layout and ``train`` settings."""
        return self._program

    def fit(self, steps: int) -> FitResult:
        """Train until ``steps`` steps are complete, resuming the run directory's newest state.

        Args:
            steps: the step to train to (the run's last step, not a count from here).

        Returns:
            The :class:`FitResult`: the last completed step, the parameters, the summary.

        Raises:
            ValueError: ``steps`` below 1, or slices, batch and minimum slice count the
              protocol cannot run (refused before the run directory is written).
            elastic_dew.runtime.Preempted: a preemption notice was honoured (exit 143 when
              uncaught): the checkpoint and data position of its ``step`` are committed, and
              the same command run again resumes there.
            pathwaysutils.elastic.manager.ElasticRuntimeError: the retry policy gave up.
        """
        if steps < 1:
            raise ValueError(f"steps={steps} must be >= 1")
        recording = Recording(self.run_dir, self.sinks, self.train.log_every)
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
            run.sink = recording.open()
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
            recording.close()
        summary = recording.summary(params, memory)
        return FitResult(final_step=step, params=params, summary=summary, run_dir=self.run_dir,
                         shardings=placed, model=model)

