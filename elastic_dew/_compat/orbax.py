"""Orbax's private names elastic_dew uses (read against orbax-checkpoint 0.12.8).

Nothing here imports Orbax until a name is used.
"""

from __future__ import annotations

from elastic_dew._compat import Private

__all__ = ["MTC_COLOCATED_PYTHON", "PRIVATE"]

MTC_COLOCATED_PYTHON = Private(
    "orbax-checkpoint",
    "orbax.checkpoint.experimental.emergency.multi_tier_checkpointing.initialization:colocated_python",
    why="multi-tier initialisation calls colocated_python.colocated_python(...) through this "
    "module attribute; the simulator's replicator stand-in rebinds it to run the function "
    "once per simulated worker",
    instead="an initialisation that takes the colocated runner as a parameter",
)

PRIVATE: tuple[Private, ...] = (MTC_COLOCATED_PYTHON,)
