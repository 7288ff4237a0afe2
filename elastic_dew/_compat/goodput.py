"""ml-goodput-measurement's private names elastic_dew uses (read against 0.2.3).

The goodput export writes Orbax-shaped save entries into the recorder's own Cloud Logging
log (where the library's checkpoint calculator reads them). When the caller hands the
export a logger, the export writes through that one (public); only when the library made
its own Cloud Logging client is that client read from the recorder.
"""

from __future__ import annotations

from typing import Any

from elastic_dew._compat import Private

__all__ = ["PRIVATE", "cloud_logger_of"]

_CLOUD_LOGGER = Private(
    "ml-goodput-measurement",
    "ml_goodput_measurement.src.goodput:GoodputRecorder._cloud_logger",
    why="the Cloud Logging client a recorder made for itself (cloud_logger=None), the log "
    "its checkpoint calculator reads save entries from",
    instead="a recorder method that records an Orbax save entry, or a public accessor of its logger",
    probe=lambda: _recorder(),
)

PRIVATE: tuple[Private, ...] = (_CLOUD_LOGGER,)


def _recorder() -> Any:
    from ml_goodput_measurement.src.goodput import GoodputRecorder

    return GoodputRecorder("canary", "canary", logging_enabled=False)


def cloud_logger_of(recorder: Any) -> Any:
    """The logger ``recorder`` writes to (``None`` when its logging is off)."""
    return getattr(recorder, _CLOUD_LOGGER.name, None)
