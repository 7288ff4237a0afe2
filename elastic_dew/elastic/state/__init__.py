"""The state tiers: tier 1 in host memory, tier 2 in persistent storage, and their cadence.

=====================  ===========================================================
module                 its job
=====================  ===========================================================
``tiers``              ``Tiers``: both tiers of a run as the protocol drives them, their restore
``checkpoint_tier``    tier 2's half of ``Tiers``: its cadence, the final and preemption saves; ``timed_save``
``snapshots``          tier 1: ``Snapshots`` in pinned host memory (Orbax ``Snapshotter``)
``packing``            the leaf-packing codec the snapshots use; typed keys as key data
``checkpoints``        tier 2: ``Checkpoints``, over Orbax's manager of one of two kinds
``commit``             ``Checkpoints``' save in flight and its commit, each storage call bounded
``orbax_kind``         the ``orbax`` kind: Orbax's ``CheckpointManager``'s items, saves, refusals
``multi_tier``         the ``multi_tier`` kind: Orbax's replicator manager, initialised per devices
``save_precompiler``   a layout's first Orbax save precompiled in a background thread
``meta``               the JSON ``meta`` saved beside the state, for both tiers
``persistence``        where tier 2 may write under Pathways persistence
=====================  ===========================================================

:func:`newest`, the choice of the newest state across the tiers, is defined here (its
rule, :func:`choose`), and :class:`Newest` is what it returns. Nothing else is imported here: ``persistence`` stays
cheap to import (the manifests read it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the tiers themselves import JAX and Orbax; the rule needs neither
    from elastic_dew.elastic.state.checkpoints import Checkpoints
    from elastic_dew.elastic.state.snapshots import Snapshots

__all__ = ["Newest", "newest", "choose"]

class Newest(NamedTuple):
    """Where the newest complete state is: ``source`` ``"snapshot"``, ``"checkpoint"`` or
    ``"fresh"`` (neither tier holds one), and its ``step`` (``None`` when fresh). It unpacks
    as ``source, step``."""

    source: str
    step: int | None


def newest(snapshots: Snapshots | None, checkpoints: Checkpoints | None) -> Newest:
    """The newest complete state across tiers: ``Newest("snapshot"|"checkpoint"|"fresh", step)``.

    A snapshot counts once it has landed in host memory (this joins the one in flight); a
    checkpoint counts once committed. On a tie the snapshot wins: it loads from host
    memory, without reading storage. ``("fresh", None)`` when neither tier holds a state.

    Args:
        snapshots: tier 1, or ``None``.
        checkpoints: tier 2, or ``None``.

    Returns:
        The :class:`Newest` ``(source, step)``.
    """
    snapshot = snapshots.latest_step() if snapshots is not None else None
    checkpoint = checkpoints.latest_step() if checkpoints is not None else None
    return choose(snapshot, checkpoint)


def choose(snapshot: int | None, checkpoint: int | None) -> Newest:
    """The rule of :func:`newest` over steps already known: the newest ``snapshot`` step
    landed and the newest ``checkpoint`` step committed (``None``: none)."""
    if snapshot is not None and (checkpoint is None or snapshot >= checkpoint):
        return Newest("snapshot", snapshot)
    if checkpoint is not None:
        return Newest("checkpoint", checkpoint)
    return Newest("fresh", None)
