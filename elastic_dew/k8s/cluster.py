"""The one-time cluster objects an elastic Pathways run needs beside its JobSet.

:func:`priority_class` is the PriorityClass hot swap schedules by (the guide's
``high-prior-job``); :func:`checkpoint_configuration` is GKE's ``CheckpointConfiguration``
for multi-tier checkpointing on one TPU machine type.
"""

from __future__ import annotations

from typing import Any

from elastic_dew.k8s.params import parse_bucket

__all__ = ["priority_class", "checkpoint_configuration"]


def priority_class(name: str, value: int, description: str) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1`` PriorityClass, as the guide's ``high-prior-job``."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": False,
        "description": description,
    }


def checkpoint_configuration(
    name: str, bucket: str, machine_type: str, in_memory_size: str
) -> dict[str, Any]:
    """GKE's ``CheckpointConfiguration`` for multi-tier checkpointing on one TPU machine type.

    ``bucket`` is ``gs://BUCKET`` (a bucket with hierarchical namespace); the resource names
    the bare bucket. The node selector picks the TPU nodes that get the in-memory CSI volume.
    """
    bucket_name, _ = parse_bucket("bucket", bucket)
    return {
        "apiVersion": "checkpointing.gke.io/v1",
        "kind": "CheckpointConfiguration",
        "metadata": {"name": name},
        "spec": {
            "cloudStorageBucketName": bucket_name,
            "nodeSelector": {"node.kubernetes.io/instance-type": machine_type},
            "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
            "inMemoryVolumeSize": in_memory_size,
            "gcsFuseMountOptions": [
                "implicit-dirs",
                "metadata-cache:negative-ttl-secs:0",
                "metadata-cache:ttl-secs:-1",
                "metadata-cache:stat-cache-max-size-mb:-1",
                "metadata-cache:type-cache-max-size-mb:-1",
                "file-system:kernel-list-cache-ttl-secs:0",
                "read_ahead_kb=1024",
                "write:enable-streaming-writes:true",
            ],
        },
    }
