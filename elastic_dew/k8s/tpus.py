"""The TPU types a Pathways JobSet can ask GKE for, and the topologies each one has.

One row per TPU generation: the GKE node labels a worker pod selects
(``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``), the
machine type of its nodes, how many chips each host (each worker pod) holds, and the
``--instance_type`` prefix the Pathways resource manager expects. The topologies are the
multi-host-capable slice shapes GKE documents for each type ("Plan TPUs in GKE"); Pathways
runs one ``pathways-worker`` pod per host, so every shape here is built of 4-chip hosts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["TpuType", "TPU_TYPES", "lookup_tpu_type"]


@dataclass(frozen=True)
class TpuType:
    """One TPU generation as GKE and Pathways name it."""

    name: str
    aliases: tuple[str, ...]
    gke_accelerator: str
    machine_type: str
    pathways_instance: str
    chips_per_host: int
    topologies: tuple[str, ...]

    def chips(self, topology: str) -> int:
        """Chips in one slice of ``topology`` (the product of its dimensions)."""
        return math.prod(int(d) for d in topology.split("x"))

    def hosts(self, topology: str) -> int:
        """Worker pods (TPU VMs) in one slice of ``topology``."""
        return max(1, self.chips(topology) // self.chips_per_host)

    def instance_type(self, topology: str) -> str:
        """The resource manager's ``--instance_type`` value, e.g. ``tpuv6e:4x4``."""
        return f"{self.pathways_instance}:{topology}"


_2D = ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

TPU_TYPES: dict[str, TpuType] = {
    t.name: t
    for t in (
        TpuType(
            name="v4",
            aliases=(),
            gke_accelerator="tpu-v4-podslice",
            machine_type="ct4p-hightpu-4t",
            pathways_instance="tpuv4",
            chips_per_host=4,
            topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8",
                        "8x8x8", "8x8x12", "8x8x16", "8x16x16"),
        ),
        TpuType(
            name="v5e",
            aliases=("v5litepod", "v5lite"),
            gke_accelerator="tpu-v5-lite-podslice",
            machine_type="ct5lp-hightpu-4t",
            pathways_instance="tpuv5e",
            chips_per_host=4,
            topologies=_2D,
        ),
        TpuType(
            name="v5p",
            aliases=(),
            gke_accelerator="tpu-v5p-slice",
            machine_type="ct5p-hightpu-4t",
            pathways_instance="tpuv5",
            chips_per_host=4,
            topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8",
                        "8x8x8", "8x8x16", "8x16x16", "16x16x16", "16x16x24"),
        ),
        TpuType(
            name="v6e",
            aliases=("trillium",),
            gke_accelerator="tpu-v6e-slice",
            machine_type="ct6e-standard-4t",
            pathways_instance="tpuv6e",
            chips_per_host=4,
            topologies=_2D,
        ),
    )
}


def lookup_tpu_type(name: str) -> TpuType | None:
    """The TPU type called ``name`` or one of its aliases (case-insensitive), else None."""
    key = name.strip().lower()
    for t in TPU_TYPES.values():
        if key == t.name or key in t.aliases:
            return t
    return None


def by_accelerator(gke_accelerator: str) -> TpuType | None:
    """The TPU type whose GKE accelerator label is ``gke_accelerator``, else None."""
    return next((t for t in TPU_TYPES.values() if t.gke_accelerator == gke_accelerator), None)
