"""The TPU types a Pathways JobSet can ask GKE for, and the topologies each one has.

One row per TPU generation: the GKE node labels a worker pod selects
(``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``), the
machine type of its nodes, how many chips each host (each worker pod) holds, and the
``--instance_type`` prefix the Pathways resource manager expects. The topologies are the
multi-host-capable slice shapes GKE documents for each type ("Plan TPUs in GKE"); Pathways
runs one ``pathways-worker`` pod per host, so every shape here is built of 4-chip hosts.

A type may also be spelt as gcloud and xpk spell an accelerator, ``TYPE-N`` (``v6e-16``,
``v5p-8``, ``tpu7x-128``): N counts chips for v5e and v6e and TensorCores (two per chip) for
v4, v5p and tpu7x, so it fixes the slice's chip count and, with the tables here, its topology.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["TpuType", "TPU_TYPES", "lookup_tpu_type", "parse_tpu_type"]


@dataclass(frozen=True)
class TpuType:
    """One TPU generation as GKE and Pathways name it."""

    name: str
    gke_accelerator: str
    machine_type: str
    pathways_instance: str
    topologies: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    #: Every multi-host shape here is built of 4-chip hosts (one worker pod each).
    chips_per_host: int = 4
    #: What the N of a ``TYPE-N`` name counts per chip: 1 (chips) or 2 (TensorCores).
    cores_per_chip: int = 1

    def chips(self, topology: str) -> int:
        """Chips in one slice of ``topology`` (the product of its dimensions)."""
        return math.prod(int(d) for d in topology.split("x"))

    def hosts(self, topology: str) -> int:
        """Worker pods (TPU VMs) in one slice of ``topology``."""
        return max(1, self.chips(topology) // self.chips_per_host)

    def instance_type(self, topology: str) -> str:
        """The resource manager's ``--instance_type`` value, e.g. ``tpuv6e:4x4``."""
        return f"{self.pathways_instance}:{topology}"

    def topology_for(self, size: int) -> str | None:
        """The topology of a ``TYPE-size`` slice (size in the unit of ``cores_per_chip``), else None."""
        if size % self.cores_per_chip:
            return None
        chips = size // self.cores_per_chip
        return next((t for t in self.topologies if self.chips(t) == chips), None)

    def sized_name(self, topology: str) -> str:
        """gcloud's and xpk's name of one slice, e.g. ``v6e-16`` for v6e 4x4."""
        return f"{self.name}-{self.chips(topology) * self.cores_per_chip}"


_2D = ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

TPU_TYPES: dict[str, TpuType] = {
    t.name: t
    for t in (
        TpuType(
            name="v4",
            gke_accelerator="tpu-v4-podslice",
            machine_type="ct4p-hightpu-4t",
            pathways_instance="tpuv4",
            topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8",
                        "8x8x8", "8x8x12", "8x8x16", "8x16x16"),
            cores_per_chip=2,
        ),
        TpuType(
            name="v5e",
            aliases=("v5litepod", "v5lite"),
            gke_accelerator="tpu-v5-lite-podslice",
            machine_type="ct5lp-hightpu-4t",
            pathways_instance="tpuv5e",
            topologies=_2D,
        ),
        TpuType(
            name="v5p",
            gke_accelerator="tpu-v5p-slice",
            machine_type="ct5p-hightpu-4t",
            pathways_instance="tpuv5",
            topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8",
                        "8x8x8", "8x8x16", "8x16x16", "16x16x16", "16x16x24"),
            cores_per_chip=2,
        ),
        TpuType(
            name="v6e",
            aliases=("trillium",),
            gke_accelerator="tpu-v6e-slice",
            machine_type="ct6e-standard-4t",
            pathways_instance="tpuv6e",
            topologies=_2D,
        ),
        TpuType(
            # Ironwood: pathwaysutils' generator maps tpu7x to accelerator, instance type and
            # machine type tpu7x / tpu7x / tpu7x-standard-4t.
            name="tpu7x",
            aliases=("ironwood",),
            gke_accelerator="tpu7x",
            machine_type="tpu7x-standard-4t",
            pathways_instance="tpu7x",
            topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8",
                        "8x8x8", "8x8x16", "8x16x16"),
            cores_per_chip=2,
        ),
    )
}

_SIZED = re.compile(r"^(?P<type>[a-z0-9]+?)-(?P<size>[0-9]+)$")


def _by_name(key: str) -> TpuType | None:
    return next((t for t in TPU_TYPES.values() if key == t.name or key in t.aliases), None)


def parse_tpu_type(name: str) -> tuple[TpuType, int | None] | None:
    """``(type, size)`` for ``v6e`` (size None) or ``v6e-16`` (size 16), else None."""
    key = name.strip().lower()
    t = _by_name(key)
    if t is not None:
        return t, None
    m = _SIZED.match(key)
    if m is None or (t := _by_name(m["type"])) is None:
        return None
    return t, int(m["size"])


def lookup_tpu_type(name: str) -> TpuType | None:
    """The TPU type called ``name``, one of its aliases, or a sized name such as ``v6e-16``
    (case-insensitive), else None."""
    parsed = parse_tpu_type(name)
    return parsed[0] if parsed else None


def by_accelerator(gke_accelerator: str) -> TpuType | None:
    """The TPU type whose GKE accelerator label is ``gke_accelerator``, else None."""
    return next((t for t in TPU_TYPES.values() if t.gke_accelerator == gke_accelerator), None)
