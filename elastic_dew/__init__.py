"""elastic_dew: JAX training that survives TPU slice loss and preemption on Pathways.

The package is layered, and data flows one way: :mod:`elastic_dew.runtime` prepares the
process; :mod:`elastic_dew.elastic` holds slices, meshes, state tiers, elastic data and the
one stop/resume protocol; :mod:`elastic_dew.trainer` runs that protocol for a model; the
recipes run the trainer. :mod:`elastic_dew.simulate` runs all of it on CPU with faults.

Heavy imports (JAX) are deferred, so ``import elastic_dew`` stays cheap for the launcher
and the Kubernetes renderer.
"""

from __future__ import annotations

#: The installed version of elastic_dew (as in its package metadata).
__version__ = "0.2.0"

__all__ = ["Trainer", "TrainConfig", "__version__"]


def __getattr__(name: str):
    if name == "Trainer":
        from elastic_dew.trainer import Trainer

        return Trainer
    if name == "TrainConfig":
        from elastic_dew.train_config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module 'elastic_dew' has no attribute {name!r}")
