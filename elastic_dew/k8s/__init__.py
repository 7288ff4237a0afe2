"""Kubernetes manifests for elastic Pathways training on GKE.

``JobSetParams`` + ``jobset()`` build the elastic training JobSet; ``priority_class()`` and
``checkpoint_configuration()`` the one-time cluster objects for hot swap and multi-tier
checkpointing; ``dump()`` writes them as deterministic YAML. ``elastic_dew.k8s.validate``
checks manifests against the JobSet CRD and Kubernetes' schemas. A parameter that cannot work
is refused with an :class:`~elastic_dew.settings.SettingError`. Nothing here imports JAX.
"""

from elastic_dew.k8s.params import KNOWN_RECIPES, PROXY_FLAG_SPELLINGS, JobSetParams
from elastic_dew.k8s.cluster import checkpoint_configuration, priority_class
from elastic_dew.k8s.render import jobset
from elastic_dew.k8s.tpus import TPU_TYPES, TpuType, lookup_tpu_type
from elastic_dew.k8s.yaml_text import dump

#: The public names (``docs/api.md``): a JobSet rendered from its parameters. The tables behind
#: them (``KNOWN_RECIPES``, ``PROXY_FLAG_SPELLINGS``, ``TPU_TYPES``, ``TpuType``,
#: ``lookup_tpu_type``) and the manifests' parts
#: (``priority_class``, ``checkpoint_configuration``) stay importable here but may change.
__all__ = [
    "JobSetParams",
    "jobset",
    "dump",
]

