"""The choice of the newest state across the two tiers on resume.

Tier 1, :class:`~elastic_dew.elastic.state.snapshots.Snapshots`, keeps the state in pinned host
memory on every slice (fast, survives the loss of some slices, not of the process). Tier 2,
:class:`~elastic_dew.elastic.state.checkpoints.Checkpoints`, writes it to persistent storage
(survives anything, slower). Both carry the same ``meta`` (step, data position, ...) with the
arrays, so whichever tier a resume uses, the data pipeline continues from the same place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the tiers themselves import JAX and Orbax; the rule needs neither
    from elastic_dew.elastic.state.checkpoints import Checkpoints
    from elastic_dew.elastic.state.snapshots import Snapshots

__all__ = ["newest"]


def newest(
    snapshots: Snapshots | None, checkpoints: Checkpoints | None
) -> tuple[str, int | None]:
    """The newest complete state across tiers: ``("snapshot"|"checkpoint"|"fresh", step)``.

    A snapshot counts once it has landed in host memory (this joins the one in flight); a
    checkpoint counts once committed. On a tie the snapshot wins: it loads from host
    memory, without reading storage. ``("fresh", None)`` when neither tier holds a state.

    Args:
        snapshots: tier 1, or ``None``.
        checkpoints: tier 2, or ``None``.

    Returns:
        ``(source, step)``.
    """
    snapshot = snapshots.latest_step() if snapshots is not None else None
    checkpoint = checkpoints.latest_step() if checkpoints is not None else None
    if snapshot is not None and (checkpoint is None or snapshot >= checkpoint):
        return "snapshot", snapshot
    if checkpoint is not None:
        return "checkpoint", checkpoint
    return "fresh", None
