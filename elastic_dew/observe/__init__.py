"""Observability: the sinks that show a run to the tools its users already have.

Each module here consumes the run's typed events (:mod:`elastic_dew.elastic.events`) and
has one job (goodput itself is the run record's, :mod:`elastic_dew.record.goodput`):
:mod:`~elastic_dew.observe.goodput_export` records the run through
ml-goodput-measurement's recorder (the ``gke`` extra), :mod:`~elastic_dew.observe.tensorboard`
writes TensorBoard event files (the ``observe`` extra), :mod:`~elastic_dew.observe.logs`
formats log records as Cloud Logging JSON lines, and the progress display is a tqdm bar on a
terminal (:mod:`~elastic_dew.observe.progress_bar`) and log lines elsewhere
(:mod:`~elastic_dew.observe.progress`). The optional libraries are
imported only by the module that needs them, so importing this package costs nothing; its
public names (the sinks a caller gives ``Trainer(sinks=...)``: TensorBoard and the goodput
export; the observability options; the log setup) are imported from their modules when first asked for.
"""

import importlib
from typing import Any

#: The public names (``docs/api.md``), each from the module that holds it, imported when
#: first asked for.
_HOMES = {
    "ObserveOptions": "elastic_dew.observe.sinks",
    "TensorBoardSink": "elastic_dew.observe.tensorboard",
    "GoodputExport": "elastic_dew.observe.goodput_export",
    "setup_logging": "elastic_dew.observe.logs",
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'elastic_dew.observe' has no attribute {name!r}")

