"""One attempt's device-side world, and a step in flight, as the loop holds them.

An :class:`Attempt` is what one ``elastic_retry`` attempt of
:class:`~elastic_dew.elastic.loop.protocol.ElasticRun` works on: its mesh, batch, compiled step
and state. Only the attempt's own frame holds it, so when the attempt unwinds (a lost slice)
its arrays go with it, before the next attempt starts (the guide's warning about references
kept in globals and callbacks). An :class:`InFlight` is a dispatched step whose result has not
been read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from elastic_dew.elastic.deadline import StepDeadline
from elastic_dew.elastic.loop.program import StepFn
from elastic_dew.elastic.slices.mesh import batch_sharding

__all__ = ["Attempt", "InFlight"]


@dataclasses.dataclass(eq=False)
class Attempt:
    """One attempt's device-side world: its mesh, batch, compiled step and state.

    Only the attempt's own frame holds this object, so when the attempt unwinds (a lost
    slice) its arrays go with it. ``step`` is the last completed step (its result read),
    ``state`` that step's state and ``data`` the data position after it: what a snapshot,
    a checkpoint or a scale-up of ``step`` takes, whatever step is in flight.
    """

    mesh: jax.sharding.Mesh
    batch_size: int
    step_fn: StepFn
    state: Any
    step: int
    data: dict | None = None
    #: Whether the restored state's evaluation pass was cut short by a preemption (its
    #: meta's :data:`~elastic_dew.elastic.loop.evaluation.EVALUATION_OWED_KEY`): the attempt runs it first.
    owed: bool = False
    #: The axes a batch is split over (the run's :class:`~elastic_dew.elastic.MeshSpec`; ``None``: the default).
    batch_axes: tuple[str, ...] | None = None
    in_batch: jax.sharding.NamedSharding = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.in_batch = batch_sharding(self.mesh, self.batch_axes)


@dataclasses.dataclass(eq=False)
class InFlight:
    """A dispatched step whose result has not been read: its state, metrics and data range.

    ``data`` is the data position after the step; ``data_seconds`` the time the loop
    waited for its batch (0 when the step before it was still computing as the read ended).
    """

    step: int
    state: Any
    metrics: dict
    examples: tuple[int, int]
    data: dict
    data_seconds: float

    def wait(self, deadline: StepDeadline) -> Callable[[], None]:
        """The wait for this step's state, within ``deadline``, that a save runs before its
        clock starts (:mod:`~elastic_dew.elastic.state.tiers`)."""
        state, step = self.state, self.step
        ready = getattr(next(iter(jax.tree.leaves(state)), None), "is_ready", None)
        return lambda: deadline.read(lambda: jax.block_until_ready(state), step, ready=ready)
