"""Kubernetes manifests for elastic Pathways training on GKE.

``JobSetParams`` + ``jobset()`` build the elastic training JobSet; ``priority_class()`` and
``checkpoint_configuration()`` the one-time cluster objects for hot swap and multi-tier
checkpointing; ``dump()`` writes them as deterministic YAML. ``elastic_dew.k8s.validate``
checks manifests against the JobSet CRD and Kubernetes' schemas. Nothing here imports JAX.
"""

from elastic_dew.k8s.params import KNOWN_RECIPES, PROXY_FLAG_SPELLINGS, JobSetParams, ParameterError
from elastic_dew.k8s.render import checkpoint_configuration, dump, jobset, priority_class
from elastic_dew.k8s.tpus import TPU_TYPES, TpuType, lookup_tpu_type

__all__ = [
    "KNOWN_RECIPES",
    "PROXY_FLAG_SPELLINGS",
    "JobSetParams",
    "ParameterError",
    "TPU_TYPES",
    "TpuType",
    "lookup_tpu_type",
    "jobset",
    "priority_class",
    "checkpoint_configuration",
    "dump",
]
