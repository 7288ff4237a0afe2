"""Record a run through ml-goodput-measurement's recorder, for Google's goodput dashboards.

Opt-in (``elastic-dew train --goodput-export``, the ``gke`` extra): :class:`GoodputExport`
receives the run's typed events as they are emitted and writes the entries
ml-goodput-measurement's ``ElasticGoodputRecorder`` writes, to Cloud Logging by default, so
the library's calculator and the goodput dashboards Pathways users already have see an
elastic_dew run like any other. The mapping:

===========================  =============================================================
elastic_dew event            recorder entry
===========================  =============================================================
``start``                    job start at the process's own start (``process_start``)
``step``                     step start (the step's ``wall`` less its ``seconds``), and the
                             active slice count at ``wall``
``resume`` after a stop      elastic wait (``detection`` + ``wait_for_slices``; event type
                             ``slice_down``, or ``scale_up`` for a ``live`` resume), then an
                             elastic reinitialisation (``mesh_and_compile`` + ``restore``),
                             both ending at the resume's ``wall``
first ``fresh`` resume       training preparation (its ``restore``: building the state)
``stop`` with ``done``       job end
===========================  =============================================================

Saves and faults have no recorder entry (the library reads checkpoint time from Orbax's own
logger). Nothing here talks to the network unless no ``cloud_logger`` is given, in which
case the library creates its Cloud Logging client.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from elastic_dew.elastic.events import Event, Resume, Start, Step, Stop, from_json

__all__ = ["GoodputExport"]

log = logging.getLogger(__name__)


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(float(seconds), datetime.timezone.utc)


class GoodputExport:
    """Feed a run's events to ml-goodput-measurement's ``ElasticGoodputRecorder``.

    Arguments:
      job_name: the job's name in the library's entries (the run's name).
      logger_name: the Cloud Logging log to write (default ``goodput_<job_name>``, as
        MaxText names it).
      cloud_logger: an object with the library's logger interface
        (``write_cloud_logging_entry``); ``None`` creates the library's Cloud Logging client.
      total_slices: the allocation's slice count, for the slice-count entries (default: the
        most slices seen active).

    Raises ``ImportError`` naming the extra to install when the library is missing.
    """

    def __init__(
        self,
        job_name: str,
        *,
        logger_name: str | None = None,
        cloud_logger: Any = None,
        total_slices: int | None = None,
    ) -> None:
        if not job_name:
            raise ValueError("GoodputExport needs a job_name (the run's name); got an empty one")
        if total_slices is not None and total_slices < 1:
            raise ValueError(f"total_slices={total_slices} must be >= 1")
        try:
            from ml_goodput_measurement.src.goodput_elastic import ElasticGoodputRecorder
        except ImportError as error:
            raise ImportError(
                "goodput export needs ml-goodput-measurement; install it with "
                "pip install 'elastic-dew[gke]'"
            ) from error
        self.job_name = job_name
        self.logger_name = logger_name or f"goodput_{job_name}"
        self.recorder = ElasticGoodputRecorder(
            job_name, self.logger_name, logging_enabled=True, cloud_logger=cloud_logger
        )
        self._total_slices = total_slices
        self._most_slices = 0
        self._stopped = False  # a stop since this process's last resume
        self._resumed = False  # this process has resumed once

    def __call__(self, event: Event | Mapping[str, Any]) -> None:
        """Record one event (typed, or a run-record line)."""
        if not isinstance(event, Event):
            event = from_json(event)
        rec = self.recorder
        if isinstance(event, Start):
            self._stopped, self._resumed = False, False
            rec.record_job_start_time(_utc(event.process_start))
        elif isinstance(event, Step):
            rec.record_step_start_time(event.step, _utc(event.wall - event.seconds))
            self._most_slices = max(self._most_slices, event.slices)
            total = self._total_slices or self._most_slices
            rec.record_elastic_slice_counts(
                active_slices=event.slices,
                total_slices=max(total, event.slices),
                available_slices=event.slices,
                timestamp=_utc(event.wall),
            )
        elif isinstance(event, Stop):
            self._stopped = True
            if event.reason == "done":
                rec.record_job_end_time(_utc(event.wall))
        elif isinstance(event, Resume):
            self._record_resume(event)

    def _record_resume(self, event: Resume) -> None:
        rec = self.recorder
        d = event.durations
        if self._resumed and self._stopped:
            began = event.wall - sum(d.values())
            waited = d["detection"] + d["wait_for_slices"]
            if event.source == "live":
                waited = sum(d.values())
            kind = "scale_up" if event.source == "live" else "slice_down"
            if waited > 0:
                rec.record_elastic_wait_start_time(kind, _utc(began))
                rec.record_elastic_wait_end_time(kind, _utc(began + waited))
            reinit = d["mesh_and_compile"] + d["restore"]
            if event.source != "live" and reinit > 0:
                rec.record_elastic_reinit_start_time(_utc(event.wall - reinit))
                rec.record_elastic_reinit_end_time(_utc(event.wall))
        elif not self._resumed and event.source == "fresh" and d["restore"] > 0:
            rec.record_training_preparation_start_time(_utc(event.wall - d["restore"]))
            rec.record_training_preparation_end_time(_utc(event.wall))
        self._resumed, self._stopped = True, False

    def close(self) -> None:
        """Block until the recorder's pending writes are committed."""
        self.recorder.flush()
