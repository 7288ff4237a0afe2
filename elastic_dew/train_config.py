"""How the trainer trains: :class:`TrainConfig`, checked once as it is built.

The elastic layer's settings (slices, batch, tiers, retries) are
:class:`~elastic_dew.elastic.config.ElasticConfig`'s; these are the training loop's own:
its log lines, its seed, the state's layout inside a slice, gradient accumulation and
evaluation. Each field is declared once with :func:`~elastic_dew.settings.setting` (default,
range), so ``Trainer(train=TrainConfig(...))`` and ``elastic-dew train``'s options share one
default and one check. This module imports no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from elastic_dew.elastic.config import MICROBATCH, SHARDINGS
from elastic_dew.settings import Bound, check_fields, setting

__all__ = ["TrainConfig"]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training loop's settings.

    Args:
      log_every: steps between the trainer's step log lines.
      seed: the seed of the parameters and of the per-step keys.
      sharding: the state inside a slice: ``fsdp`` (each parameter of at least 16 KiB, and
        its optimizer moments, split over the slice's ``data`` devices along its largest
        dimension they divide) or ``replicated`` (whole on every device); always replicated
        across slices. From Python also a callable ``(path, leaf, mesh) -> PartitionSpec``
        over ``data`` and ``model``, never ``replica``
        (:mod:`elastic_dew.elastic.slices.sharding`).
      microbatch: examples per data-parallel device per micro-step; the step accumulates
        gradients over the per-device batch in micro-steps of this many (a ``lax.scan``), so
        the update is the full batch's. ``None``: the whole per-device batch at once. Under
        the ``constant`` batch policy a lost slice adds micro-steps instead of memory per
        device. A slice count whose per-device batch it does not divide is refused before
        the run.
      eval_every: steps between evaluation passes over the evaluation split (the trainer's
        ``eval_dataset``, a recipe's when its ``build()`` returns one: ``lm``, ``mlp``),
        each an ``eval`` event in the run record and TensorBoard. ``None``: no evaluation.
        The two go together: each needs the other.
      eval_batch: examples per evaluation batch; ``None``: the elastic config's
        ``global_batch``. It must divide over the data-parallel devices of every reachable
        slice count.

    Raises:
      SettingError: a field outside its declaration
        (:class:`~elastic_dew.settings.SettingError`).
    """

    log_every: int = setting(10, bound=Bound(1, whole=True))
    seed: int = 0
    sharding: str | Callable[..., Any] = setting("fsdp", choices=SHARDINGS, or_callable=True)
    microbatch: int | None = setting(None, bound=MICROBATCH)
    eval_every: int | None = setting(None, bound=Bound(1, none=True, whole=True))
    eval_batch: int | None = setting(None, bound=Bound(1, none=True, whole=True))

    def __post_init__(self) -> None:
        check_fields(self)
