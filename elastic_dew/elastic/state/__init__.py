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

:func:`choose`, the rule of the newest state across the tiers
(:meth:`~elastic_dew.elastic.state.tiers.Tiers.newest`), is defined here, and :class:`Newest` is
what it returns. Nothing else is imported here: ``persistence`` stays cheap to import (the
manifests read it).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Newest", "choose"]

class Newest(NamedTuple):
    """Where the newest complete state is: ``source`` ``"snapshot"``, ``"checkpoint"`` or
    ``"fresh"`` (neither tier holds one), and its ``step`` (``None`` when fresh). It unpacks
    as ``source, step``."""

    source: str
    step: int | None


def choose(snapshot: int | None, checkpoint: int | None) -> Newest:
    """The newest complete state, from the newest ``snapshot`` step landed and the newest
    ``checkpoint`` step committed (``None``: none): on a tie the snapshot wins (it loads from
    host memory, without reading storage); ``("fresh", None)`` when neither is given."""
    if snapshot is not None and (checkpoint is None or snapshot >= checkpoint):
        return Newest("snapshot", snapshot)
    if checkpoint is not None:
        return Newest("checkpoint", checkpoint)
    return Newest("fresh", None)
