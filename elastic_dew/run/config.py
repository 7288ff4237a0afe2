"""What one run is asked to be: :class:`RunConfig` and its parts, each declared once.

:class:`RunConfig` nests the run's typed parts (the
:class:`~elastic_dew.elastic.config.ElasticConfig`, the
:class:`~elastic_dew.train_config.TrainConfig`, the simulated slices (:class:`SimConfig`) and
the :class:`~elastic_dew.observe.sinks.ObserveOptions`) beside its own fields. Each part
checks its fields as it is built (:func:`~elastic_dew.settings.check_fields`); the command
line offers them as flags (:mod:`elastic_dew.console`); :func:`elastic_dew.run.planning.plan_run` checks
what spans the parts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.observe.sinks import ObserveOptions
from elastic_dew.settings import Bound, check_fields, setting
from elastic_dew.train_config import TrainConfig

__all__ = ["RunConfig", "SimConfig", "DEFAULT_SLICES", "DEFAULT_DEVICES_PER_SLICE"]

#: The simulated slices a run on CPU has unless told (``--slices``).
DEFAULT_SLICES = 4
#: The CPU devices of each simulated slice unless told (``--devices-per-slice``).
DEFAULT_DEVICES_PER_SLICE = 2


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """The simulated slices a run on CPU trains on, and the faults fired at them.

    A run on real slices (``JAX_PLATFORMS=proxy``) takes none: :class:`RunConfig` ``sim``
    given there is refused. ``schedule`` is the fault schedule's text in the simulator's
    grammar (:func:`elastic_dew.simulate.parse_schedule`); :func:`plan` parses it once.

    Args:
        slices: simulated slices.
        devices_per_slice: CPU devices per simulated slice.
        schedule: faults for the simulator, for example ``lose:1@20,restore:1@40,preempt@60``
            or ``lose:3@17,restore:3@+3`` (grammar ``ACTION[:SLICE]@STEP[/PHASE]`` or
            ``ACTION[:SLICE]@+SECONDS[/PHASE]``, ``SECONDS`` after the previous fault fired;
            actions ``lose``, ``restore``, ``hang`` (the slice stops answering), ``suspend``
            and ``wake`` (Pathways' transparent suspend and its end), ``error`` (a runtime
            error that is not a slice loss), ``preempt``, ``kill``). Empty: no faults.

    Raises:
        SettingError: a field outside its declaration.
    """

    slices: int = setting(DEFAULT_SLICES, bound=Bound(1, whole=True))
    devices_per_slice: int = setting(DEFAULT_DEVICES_PER_SLICE, bound=Bound(1, whole=True))
    schedule: str = ""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One training run of a recipe, as the Python API and the command line ask for it.

    Each part checks its own fields as it is built (one
    :class:`~elastic_dew.settings.SettingError`); :func:`plan` checks what spans the
    parts (the batch against every slice count, the schedule against the slices, the run
    directory). The defaults are the command line's:

    - ``steps``: ``None`` is the recipe's (its ``DEFAULTS["steps"]``, else 100);
    - ``elastic``: ``None`` is :class:`ElasticConfig`'s defaults with the recipe's global
      batch (``DEFAULTS["global_batch"]``, else 32); an :class:`ElasticConfig` given is used
      as it is;
    - ``sim``: ``None`` is :class:`SimConfig`'s defaults when simulating; one given on real
      slices is refused;
    - ``overrides``: the recipe's ``build()`` settings (``--set KEY=VALUE``).

    Args:
        recipe: the recipe's name (``lm``, ``mlp``, or one of your own package ``recipes``).
        overrides: the recipe's ``build()`` settings.
        steps: train until this step. ``None``: the recipe's.
        run_dir: the run directory; an existing one is resumed. ``None``: ``runs/NAME``
            for ``name``, else a fresh one.
        name: run in ``runs/NAME``. ``None``: ``$JOBSET_NAME``, else a timestamp.
        elastic: the :class:`ElasticConfig`, or ``None`` for the recipe's defaults.
        train: the :class:`TrainConfig`.
        sim: the :class:`SimConfig`, or ``None``.
        observe: how the run is observed (``ObserveOptions``: logs, TensorBoard, goodput export).

    Raises:
        SettingError: a field outside its declaration.
        TypeError: a part that is not of its type (``elastic`` not an ``ElasticConfig``, ...).
    """

    recipe: str = ""
    overrides: Mapping[str, Any] = setting(factory=dict)
    steps: int | None = setting(None, bound=Bound(1, whole=True))
    run_dir: str | None = None
    name: str | None = None
    elastic: ElasticConfig | None = None
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    sim: SimConfig | None = None
    observe: ObserveOptions = dataclasses.field(default_factory=ObserveOptions)

    def __post_init__(self) -> None:
        check_fields(self)
        for name, kind in (("elastic", ElasticConfig), ("train", TrainConfig), ("sim", SimConfig),
                           ("observe", ObserveOptions)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"RunConfig.{name} must be a {kind.__name__}, not {type(value).__name__}")
