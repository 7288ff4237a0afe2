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
``stop`` with ``done`` or    job end, at the stop
``preempted``
:meth:`~GoodputExport.close` job end, now, for a process that recorded none since its
                             start (it failed: an error not retried, or retries exhausted)
===========================  =============================================================

Every process records a job end however it ends, so the library never reads a process that
has exited as one still running. The library's calculator takes the job's span from the
earliest job start to the *latest* job end, and counts the time from the last step start to
that end as productive only because the end says the job completed: a preempted process's
end is therefore superseded once the re-run records its own start, steps and end, and the
re-done steps and the gap are then badput as usual. Between the two processes the library
reads the job as ended at the preemption, as it would any job that stopped there.

Saves are written as the entries Orbax's step-statistics logger writes for a blocking
checkpoint save (``event_type`` ``save``, the step, ``checkpoint_manager_blocking_duration_secs``),
which the library's checkpoint calculator reads from the same log and takes out of productive
time. The library averages entries with the same step (it takes them for the hosts of one
save), so the saves of one step (a snapshot and a checkpoint) are summed into one entry,
written when the next event arrives. Faults have no entry. Nothing here talks to the network unless no ``cloud_logger`` is given, in which
case the library creates its Cloud Logging client.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from elastic_dew.elastic.events import Event, Resume, Save, Start, Step, Stop, from_json

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
        self._open = False  # a job start with no job end recorded after it
        self._save: tuple[int, float, float] | None = None  # step, began, seconds: unwritten

    def __call__(self, event: Event | Mapping[str, Any]) -> None:
        """Record one event (typed, or a run-record line)."""
        if not isinstance(event, Event):
            event = from_json(event)
        rec = self.recorder
        if isinstance(event, Save):
            self._add_save(event)
            return
        self._write_save()
        if isinstance(event, Start):
            self._stopped, self._resumed, self._open = False, False, True
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
            if event.reason in ("done", "preempted"):  # the process ends here
                rec.record_job_end_time(_utc(event.wall))
                self._open = False
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

    def _add_save(self, event: Save) -> None:
        if self._save is not None and self._save[0] != event.step:
            self._write_save()
        if self._save is None:
            self._save = (event.step, event.wall - event.seconds, 0.0)
        step, began, seconds = self._save
        self._save = (step, began, seconds + float(event.seconds))

    def _write_save(self) -> None:
        """Write the pending saves as one Orbax save-statistics entry (see the module)."""
        if self._save is None:
            return
        step, began, seconds = self._save
        self._save = None
        logger = self.recorder._cloud_logger  # the recorder's own log, where the calculator reads
        if logger is None:
            return
        logger.write_cloud_logging_entry({
            "job_name": self.job_name,
            # The first key with "time" in its name is the entry's timestamp to the library.
            "checkpoint_manager_blocking_start_time": began,
            "event_type": "save",
            "step": str(step),
            "directory": "",
            "checkpoint_manager_blocking_duration_secs": seconds,
            "checkpointer_blocking_duration_secs": seconds,
            "wait_for_prev_duration_secs": 0.0,
            "get_old_steps_duration_secs": 0.0,
        })

    def close(self) -> None:
        """Record the job end of a process that ended without a ``done`` or ``preempted``
        stop (it failed), then block until the recorder's pending writes are committed."""
        self._write_save()
        if self._open:
            self.recorder.record_job_end_time(datetime.datetime.now(datetime.timezone.utc))
            self._open = False
        self.recorder.flush()
