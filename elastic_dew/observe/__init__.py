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

from elastic_dew._lazy import lazy_exports

#: The public names (``docs/api.md``), each from the module that holds it, imported when
#: first asked for.
_HOMES = {
    "ObserveOptions": "sinks",
    "TensorBoardSink": "tensorboard",
    "GoodputExport": "goodput_export",
    "setup_logging": "logs",
}

__all__ = list(_HOMES)


__getattr__ = lazy_exports(__name__, _HOMES)
