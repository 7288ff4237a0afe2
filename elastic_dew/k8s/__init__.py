"""Kubernetes manifests for elastic Pathways training on GKE.

``JobSetParams`` + ``jobset()`` build the elastic training JobSet; :mod:`~elastic_dew.k8s.cluster`
the one-time cluster objects for hot swap and multi-tier
checkpointing; ``dump()`` writes them as deterministic YAML. ``elastic_dew.k8s.validate``
checks manifests against the JobSet CRD and Kubernetes' schemas. A parameter that cannot work
is refused with an :class:`~elastic_dew.settings.SettingError`. Nothing here imports JAX.
"""

from elastic_dew.k8s.params import JobSetParams
from elastic_dew.k8s.render import jobset
from elastic_dew.k8s.yaml_text import dump

#: The public names (``docs/api.md``): a JobSet rendered from its parameters.
__all__ = [
    "JobSetParams",
    "jobset",
    "dump",
]

