"""Evaluation passes inside the protocol: a fixed set of batches, on the current mesh, through faults.

An :class:`Evaluation` runs every ``every`` steps, at the step boundary right after the step
is read and before that step's saves, over the same batches each time: the evaluation set
cut into ``len(dataset) // batch_size`` batches of ``batch_size`` examples (a remainder is
left out, the same one whatever the mesh). Each batch is split over the mesh's ``(replica,
data)`` devices as a training batch is, the state stays where training holds it, and the
per-batch metrics are summed on the devices by one compiled program per mesh, so a pass
costs one host read at its end (within the step deadline, like a step). The metrics are the
means over the batches: for a loss that is a mean over examples, the mean over the examples
evaluated, whatever the slice count (up to the order of the float sums).

A pass never touches the training data position: it reads its own dataset by index. A
slice lost during a pass surfaces at its read, inside the protocol's retry, like a lost step:
the attempt unwinds without emitting anything, the run resumes from the newest saved state,
and when it reaches the step again the pass runs again; the record holds the one pass that
finished. A preemption notice that arrives during a pass (the ``interrupted`` callable the
protocol passes, asked before each batch and before the read) cuts it short the same way:
:meth:`Evaluation.run` returns ``None`` with nothing emitted, the protocol writes the
preemption checkpoint of the pass's step marked :data:`EVALUATION_OWED_KEY` in its meta, and the run that
resumes from it runs the pass first, on its own mesh, before any step. Each evaluated step
keeps one ``eval`` line, the pass that finished.

The model side is the program's ``compile_eval(mesh, batch_size)``: a function
``(sums, state, batch) -> sums`` that adds one batch's metrics (a dict of scalars that holds
``loss``) to ``sums`` (``None`` for the first batch of a pass), built from programs
compiled with ``jit(...).lower(...).compile()`` so that the simulator sees them as it sees a
step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from elastic_dew.elastic import hooks
from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.events import Eval
from elastic_dew.elastic.slices.mesh import MeshSpec, batch_sharding, check_eval_batch

__all__ = ["EVALUATION_OWED_KEY", "Evaluation", "EvalFn"]

logger = logging.getLogger(__name__)

#: ``eval_fn(sums, state, batch) -> sums``: one batch's metrics added to the running sums
#: (``sums`` is ``None`` for a pass's first batch).
EvalFn = Callable[[dict | None, Any, Any], dict]

#: The key of a saved state's meta (``True``) that says the evaluation pass of its step was
#: cut short by a preemption and is owed: the run that resumes from it runs the pass first.
EVALUATION_OWED_KEY = "evaluation_owed"


class Evaluation:
    """An evaluation set and how often :class:`~elastic_dew.elastic.ElasticRun` evaluates it
    (its ``evaluation=``); the program then also has ``compile_eval(mesh, batch_size)``.

    Args:
        dataset: a ``grain.MapDataset`` (or any sequence) of examples with the training
            examples' structure.
        every: steps between passes (a pass after every step that is a multiple of it).
        batch_size: examples per batch; ``None``: the configuration's ``global_batch``.

    Raises:
        ValueError: an ``every`` or ``batch_size`` below 1 (a set smaller than one batch is
            refused by :meth:`check`, as the run is built).
    """

    def __init__(self, dataset: Any, every: int, batch_size: int | None = None) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"eval_every={every!r} must be an int >= 1 (steps between evaluations)")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"eval batch_size={batch_size!r} must be an int >= 1, or None")
        self.dataset = dataset
        self.every = every
        self.batch_size = batch_size
        self._compiled: dict[tuple, EvalFn] = {}

    def _size(self, config: ElasticConfig) -> int:
        """The examples per batch under ``config``."""
        return self.batch_size if self.batch_size is not None else config.global_batch

    def _batches(self, config: ElasticConfig) -> int:
        """How many batches a pass runs."""
        return len(self.dataset) // self._size(config)

    def check(self, config: ElasticConfig, total_slices: int, devices_per_slice: int,
              mesh_spec: MeshSpec | None = None) -> None:
        """Refuse, before anything runs, a set smaller than a batch, or a batch that some
        reachable slice count's data-parallel devices cannot divide (the evaluation batch is
        fixed: it does not follow the batch policy).

        Args:
            config: the run's configuration.
            total_slices: the allocation's slices.
            devices_per_slice: devices in each slice.
            mesh_spec: the run's mesh, ``None`` for the default axes.

        Raises:
            ValueError: the set is smaller than a batch, or a batch does not divide.
        """
        size = self._size(config)
        if self._batches(config) < 1:
            raise ValueError(
                f"the evaluation set has {len(self.dataset)} examples, fewer than one evaluation "
                f"batch of {size}; give a larger eval_dataset or a smaller eval batch"
            )
        check_eval_batch(size, config, total_slices, devices_per_slice, mesh_spec)

    def due(self, step: int) -> bool:
        """Whether a pass follows ``step``.

        Args:
            step: the step just completed.

        Returns:
            Whether ``step`` is a positive multiple of ``every``.
        """
        return step > 0 and step % self.every == 0

    def _eval_fn(self, program: Any, mesh: jax.sharding.Mesh, size: int) -> EvalFn:
        key = (tuple(d.id for d in mesh.devices.flat), mesh.devices.shape, size)
        if key not in self._compiled:
            self._compiled[key] = program.compile_eval(mesh, size)
        return self._compiled[key]

    def run(
        self,
        program: Any,
        config: ElasticConfig,
        mesh: jax.sharding.Mesh,
        state: Any,
        step: int,
        slices: int,
        read: Callable[[Callable[[], Any], int, Callable[[], bool] | None], Any],
        interrupted: Callable[[], bool] = lambda: False,
        batch_axes: tuple[str, ...] | None = None,
    ) -> Eval | None:
        """One pass over the set on ``mesh`` from ``state`` (the state after ``step``), as the
        protocol runs it.

        Raises what a lost or hung slice raises (at the read), with nothing emitted.

        Args:
            program: the run's program (its ``compile_eval(mesh, batch_size)``).
            config: the run's configuration.
            mesh: the attempt's mesh.
            state: the state after ``step``.
            step: the step evaluated.
            slices: the active slices.
            read: the protocol's bounded read (``StepDeadline.read``).
            interrupted: asked before each batch and before the read: when it says yes (a
                preemption notice), the pass stops there.
            batch_axes: the axes a batch is split over (the run's ``MeshSpec``; ``None``: the default).

        Returns:
            The pass's :class:`~elastic_dew.elastic.events.Eval`, or ``None`` when ``interrupted`` cut it short.
        """
        started = time.monotonic()
        size = self._size(config)
        count = self._batches(config)
        eval_fn = self._eval_fn(program, mesh, size)
        in_batch = batch_sharding(mesh, batch_axes)
        sums = None
        for index in range(count):
            if interrupted():
                return None
            batch = _stack([self.dataset[i] for i in range(index * size, (index + 1) * size)])
            sums = eval_fn(sums, state, jax.device_put(batch, in_batch))
        hooks.phase("eval", step)
        if interrupted():
            return None
        assert sums is not None, "an evaluation set has at least one batch (Evaluation.check)"
        ready = getattr(sums.get("loss"), "is_ready", None)
        totals = read(lambda: jax.device_get(sums), step, ready)
        metrics = {name: float(value) / count for name, value in totals.items()}
        seconds = time.monotonic() - started
        logger.info("evaluation after step %d: %s", step, ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        return Eval(step=step, slices=slices, metrics=metrics, batches=count, examples_evaluated=count * size, seconds=seconds)


def _stack(examples: list) -> Any:
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *examples)
