"""How the trainer trains: :class:`TrainConfig`, checked once as it is built.

The elastic layer's settings (slices, batch, tiers, retries) are
:class:`~elastic_dew.elastic.config.ElasticConfig`'s; these are the training loop's own:
its log lines, its seed, the state's layout inside a slice, gradient accumulation and
evaluation. Each field is declared once with :func:`~elastic_dew.elastic.config.setting`
(default, help, range, flag), so ``Trainer(train=TrainConfig(...))`` and ``elastic-dew
train``'s options share one default and one check. This module imports no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from elastic_dew.elastic.config import MICROBATCH, SHARDINGS, Bound, check_fields, setting

__all__ = ["TrainConfig"]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training loop's settings.

    Args:
      log_every: steps between the trainer's step log lines.
      seed: the seed of the parameters and of the per-step keys.
      sharding: how the state is laid out inside a slice (:mod:`elastic_dew.elastic.slices.sharding`):
        ``"fsdp"`` (each parameter of at least 16 KiB, and its optimizer moments, split over
        the slice's ``data`` devices along its largest dimension they divide),
        ``"replicated"``, or a callable ``(path, leaf, mesh) -> PartitionSpec`` over ``data``
        and ``model`` (never ``replica``). Across slices the state is always replicated.
      microbatch: examples per data-parallel device per micro-step, or ``None``. A step then
        accumulates gradients over ``per-device batch / microbatch`` micro-steps (a
        ``lax.scan``): the update is the full batch's, and a lost slice under the
        ``constant`` batch policy adds micro-steps instead of memory per device. A slice
        count whose per-device batch it does not divide is refused before the run.
      eval_every: steps between evaluation passes over the trainer's ``eval_dataset`` (the
        two go together); ``None``: no evaluation.
      eval_batch: examples per evaluation batch; ``None``: the elastic config's
        ``global_batch``. It must divide over the data-parallel devices of every reachable
        slice count.

    Raises:
      SettingError: a field outside its declaration
        (:class:`~elastic_dew.elastic.config.SettingError`).
    """

    log_every: int = setting(
        10, "steps between log lines (default {default})", bound=Bound(1, whole=True), flag="--log-every",
        metavar="L",
    )
    seed: int = setting(0, "seed of the parameters and step keys (default {default})", flag="--seed")
    sharding: str | Callable[..., Any] = setting(
        "fsdp",
        "the state inside a slice: fsdp (large parameters and their optimizer moments split over "
        "the slice's data devices) or replicated (whole on every device); always replicated "
        "across slices (default {default})",
        flag="--sharding", choices=SHARDINGS, or_callable=True,
    )
    microbatch: int | None = setting(
        None,
        "examples per data-parallel device per micro-step; the step accumulates gradients over "
        "the per-device batch in micro-steps of M (default: the whole per-device batch at once)",
        bound=MICROBATCH, flag="--microbatch", metavar="M",
    )
    eval_every: int | None = setting(
        None,
        "evaluate the recipe's evaluation split every E steps (eval events in the run record and "
        "TensorBoard; for recipes whose build() returns an eval_dataset: lm, mlp; default: never)",
        bound=Bound(1, none=True, whole=True), flag="--eval-every", metavar="E",
    )
    eval_batch: int | None = setting(None, bound=Bound(1, none=True, whole=True))

    def __post_init__(self) -> None:
        check_fields(self)
