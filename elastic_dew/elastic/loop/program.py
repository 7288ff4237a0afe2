"""What a run's loop takes and gives across its boundary: the model side, the notice, the result.

:class:`Program` is the model side of a run as :class:`~elastic_dew.elastic.loop.protocol.ElasticRun`
needs it; :data:`StepFn` the compiled step it hands out; :class:`Notice` the preemption
notice the loop asks at each step boundary (:class:`~elastic_dew.runtime.PreemptionNotice` is
one), with the parts a notice may add (:class:`WaitingNotice`, :class:`InterruptingNotice`,
:class:`ReceivedNotice`);
:class:`Finished` what a run ends with. Each is a declaration only: this module imports
nothing of the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax

__all__ = ["Program", "StepFn", "Finished", "Notice", "WaitingNotice", "InterruptingNotice", "ReceivedNotice"]

#: A compiled training step: ``step(state, batch) -> (state, metrics)``, ``metrics`` holding ``loss``.
StepFn = Callable[[Any, Any], tuple[Any, dict[str, Any]]]


class Program(Protocol):
    """The model side of a run, as the protocol needs it.

    ``abstract_state(mesh)`` returns the state as ``jax.ShapeDtypeStruct`` leaves carrying
    their target shardings on ``mesh`` (replicated along the replica axis, as the in-memory
    snapshots require). ``init_state(mesh)`` builds a fresh state there. ``compile(mesh,
    global_batch)`` returns a compiled step; the :class:`~elastic_dew.elastic.loop.compiler.StepCompiler`
    caches it per (devices, batch), so a pause-resume attempt on the same slices reuses it.
    ``microbatch`` is the examples per data-parallel device per micro-step of a program that
    accumulates gradients (``None``: it does not): :class:`ElasticRun` refuses, before
    anything runs, a slice count whose per-device batch it does not divide. A run given an
    :class:`~elastic_dew.elastic.loop.evaluation.Evaluation` also needs ``compile_eval(mesh,
    batch_size)`` (see that module). ``metrics`` of a step hold ``loss`` (a scalar array)
    and may hold further scalars: the step line carries them, read with the loss.
    """

    microbatch: int | None

    def abstract_state(self, mesh: jax.sharding.Mesh) -> Any:
        """The state's shapes and target shardings on ``mesh``, computing nothing.

        Args:
            mesh: the attempt's mesh (``replica``, ``data``, ``model``, or the run's ``MeshSpec``'s axes).

        Returns:
            A pytree of ``jax.ShapeDtypeStruct`` carrying their shardings.
        """
        ...

    def init_state(self, mesh: jax.sharding.Mesh) -> Any:
        """A fresh state on ``mesh`` (the run's first step, or no tier holds a state).

        Args:
            mesh: the attempt's mesh.

        Returns:
            The state, laid out as :meth:`abstract_state` says.
        """
        ...

    def compile(self, mesh: jax.sharding.Mesh, global_batch: int) -> StepFn:
        """The compiled training step on ``mesh`` for ``global_batch`` examples.

        Args:
            mesh: the attempt's mesh.
            global_batch: the attempt's global batch (its batch policy's, on its slices).

        Returns:
            ``step(state, batch) -> (state, metrics)``, ``metrics`` holding ``loss``. A
            ``jax.stages.Compiled`` compiled for a mesh of the same shape and axes may be
            loaded onto another mesh's devices in place of compiling for it, so the program
            must depend on the mesh's devices only through their places in it.
        """
        ...


class Finished(NamedTuple):
    """What :meth:`ElasticRun.run` ends with: the final state and its step (it unpacks as
    ``state, step``).

    Args:
        state: the training state after the final step, on the last mesh.
        step: the final step.
    """

    state: Any
    step: int


class Notice(Protocol):
    """A preemption notice as the loop asks it: at each step boundary, whether the run
    should stop after ``step`` (the step every process agreed on has been reached)."""

    def reached(self, step: int) -> bool:
        """Whether the run stops after ``step``.

        Args:
            step: the step just completed.

        Returns:
            Whether to stop (after committing its checkpoint).
        """
        ...


@runtime_checkable
class WaitingNotice(Notice, Protocol):
    """A notice that can also end a recovery: between :meth:`begin_wait` (a slice was lost)
    and :meth:`end_wait` (the next attempt starts) a notice, pending or arriving, ends the
    wait for slices at once instead of at a step boundary a paused run never reaches."""

    def begin_wait(self) -> None:
        """A recovery began: a notice now ends it."""
        ...

    def end_wait(self) -> None:
        """The next attempt started: a notice waits for a step boundary again."""
        ...


@runtime_checkable
class InterruptingNotice(Notice, Protocol):
    """A notice the loop also asks during an evaluation pass, before each batch."""

    def interrupts(self) -> bool:
        """Whether a notice cuts the pass short now.

        Returns:
            Whether to stop the pass (it runs again after the resume).
        """
        ...


@runtime_checkable
class ReceivedNotice(Notice, Protocol):
    """A notice that says when it arrived, so a stop spends on storage only what is left of
    the grace window: ``received`` is its ``time.monotonic()``, or ``None`` before one came."""

    received: float | None
