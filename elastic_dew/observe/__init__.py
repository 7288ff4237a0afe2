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

from elastic_dew._deprecation import moved_names

#: The public names (``docs/api.md``), each from the module that holds it, imported when
#: first asked for.
_HOMES = {
    "ObserveOptions": "elastic_dew.observe.sinks",
    "TensorBoardSink": "elastic_dew.observe.tensorboard",
    "GoodputExport": "elastic_dew.observe.goodput_export",
    "setup_logging": "elastic_dew.observe.logs",
}

__all__ = list(_HOMES)


def _lazy(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'elastic_dew.observe' has no attribute {name!r}")


#: What left the public list in 0.2.0 (the terminal's progress display and the JSON log
#: format, which ``setup_logging`` chooses), served from here with a warning until 0.3.
__getattr__ = moved_names(__name__, {
    "Progress": "elastic_dew.observe.progress.Progress",
    "ProgressBar": "elastic_dew.observe.progress_bar.ProgressBar",
    "JsonFormatter": "elastic_dew.observe.logs.JsonFormatter",
}, fallback=_lazy)
