"""The trainer: a model, an optimizer and a dataset, trained through the elastic protocol.

One module per job:

- :mod:`~elastic_dew.trainer.fit`: :class:`Trainer` (its arguments, checked before anything
  is written, and ``fit``) and :class:`FitResult`;
- :mod:`~elastic_dew.trainer.model`: the model interface and the functional model
  (``init``/``loss``), with :func:`split_loss`, the one reading of a loss's output;
- :mod:`~elastic_dew.trainer.program`: :class:`ModelProgram`, the protocol's program of a
  model and an optimizer (state, shardings, compiled steps, gradient accumulation);
- :mod:`~elastic_dew.trainer.recording`: the run record of one ``fit`` (its event stream,
  log lines and summary);
- :mod:`~elastic_dew.trainer.flax_nnx`: ``Trainer.from_nnx``'s adapter of a Flax NNX model
  (imported only when it is used: Flax is an extra).
"""

from __future__ import annotations

from elastic_dew.train_config import TrainConfig
from elastic_dew.trainer.fit import FitResult, Trainer

__all__ = ["Trainer", "TrainConfig", "FitResult"]
