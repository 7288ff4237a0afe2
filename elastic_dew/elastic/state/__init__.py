"""The state tiers: tier 1 in host memory, tier 2 in persistent storage, and their cadence.

=====================  ===========================================================
module                 its job
=====================  ===========================================================
``tiers``              ``Tiers``: each tier's save cadence, the final and preemption saves
``newest``             the newest complete state across the tiers
``snapshots``          tier 1: ``Snapshots`` in pinned host memory (Orbax ``Snapshotter``)
``packing``            the leaf-packing codec the snapshots use
``checkpoints``        tier 2: ``Checkpoints``, over one of two backends
``backend``            the ``Backend`` protocol both tier-2 backends implement
``orbax_backend``      the ``orbax`` backend: Orbax's ``CheckpointManager``
``multi_tier``         the ``multi_tier`` backend: Orbax's replicator manager
``save_precompiler``   a layout's first Orbax save precompiled in a background thread
``meta``               the JSON ``meta`` saved beside the state, for both tiers
``persistence``        where tier 2 may write under Pathways persistence
=====================  ===========================================================

Nothing is imported here: ``persistence`` stays cheap to import (the manifests read it).
"""
