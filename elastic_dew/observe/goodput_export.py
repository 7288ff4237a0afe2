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
``step``                     step start (the step's ``wall`` less its ``seconds``), the
                             active slice count at ``wall``, a custom badput event
                             ``data_loading_sync`` as long as the step's ``data_seconds``,
                             and custom badput events for the time since the previous
                             step's end (below)
``save``                     a custom badput event ``unproductive_checkpoint_save_time``
                             over the save; the saves after a process's last step, when it
                             stops ``done``, as one Orbax save-statistics entry per step
``eval``                     a custom badput event ``eval_step`` over the pass (the type
                             MaxText records its evaluation loop under)
``resume`` after a stop      elastic wait (``detection`` + ``wait_for_slices``; event type
                             ``slice_down``, or ``scale_up`` for a ``live`` resume), then an
                             elastic reinitialisation (``mesh_and_compile`` + ``restore``),
                             both ending at the resume's ``wall``
first ``fresh`` resume       training preparation (its ``restore``: building the state)
``stop`` ``preempted``       a step start for the step after the stopped one, at the stop
                             (the in-flight step the stop dropped), then job end
``stop`` ``done``            job end, at the stop
:meth:`~GoodputExport.close` job end, now, for a process that recorded none since its
                             start (it failed: an error not retried, or retries exhausted)
===========================  =============================================================

Why these entries. The library's calculator (``goodput.py``,
``_get_current_productive_and_unproductive_time``) measures each step from its start to the
next step's start, and takes out of that span only the custom badput events that lie wholly
inside it. elastic_dew's productive time is a committed step's ``seconds`` less its
``data_seconds`` (``docs/trainer.md``), so everything else between two step starts is
written as a custom badput event: the data wait (placed at the step's start: the library
uses only its length and the step it lies in), each save, and the rest of the time from one
step's end to the next one's start (type ``between_steps``: host time, and a resume within
the process when the run did not step back). Saves are custom events rather than Orbax's
save entries because the library's checkpoint calculator averages the entries that share a
step (``checkpoint_badput_calculator.py``, ``calculate_save_operation_...``: it takes them
for the hosts of one save) and subtracts the total from all productive time, also for saves
of steps that a later process re-did, whose time its wasted progress already counts. The
saves after the last step are the exception: the library counts the time from the last
step start to the job end as productive without looking at custom events, and takes only
Orbax's save entries out of it.

The library finds a disruption only where a step is recorded twice. A graceful preemption
checkpoints the stopped step and the re-run starts at the next one, so the export records
the next step's start at the stop: the re-run records that step again, and the library
counts the time from the stop to the re-run's job start as
``infrastructure_recovery_from_disruption``, as elastic_dew does.

Two rules of the library remain that no entry can match without misstating the run (see
``docs/observability.md``): it takes the excess of each segment's first step over the
segment's average step as program start-up, and it counts the last step up to the job end.

Every process records a job end however it ends, so the library never reads a process that
has exited as one still running. Faults have no entry. Nothing here talks to the network
unless no ``cloud_logger`` is given, in which case the library creates its Cloud Logging
client.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from elastic_dew._compat import goodput as goodput_private
from elastic_dew.elastic.events import Eval, Event, Resume, Save, Start, Step, Stop
from elastic_dew.observe.extras import require

__all__ = ["BETWEEN_STEPS", "DATA_WAIT", "EVAL", "SAVE", "GoodputExport"]

log = logging.getLogger(__name__)

#: Custom badput event types the export writes (the first two are elastic_dew's categories).
DATA_WAIT = "data_loading_sync"
SAVE = "unproductive_checkpoint_save_time"
BETWEEN_STEPS = "between_steps"
EVAL = "eval_step"


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(float(seconds), datetime.timezone.utc)


class GoodputExport:
    """Feed a run's events to ml-goodput-measurement's ``ElasticGoodputRecorder``.

    Args:
      job_name: the job's name in the library's entries (the run's name).
      logger_name: the Cloud Logging log to write (default ``goodput_<job_name>``, as
        MaxText names it).
      cloud_logger: an object with the library's logger interface
        (``write_cloud_logging_entry``); ``None`` creates the library's Cloud Logging client.
      total_slices: the allocation's slice count, for the slice-count entries (default: the
        most slices seen active).

    Raises:
      ImportError: the library is missing (naming the extra that installs it).
      ValueError: an empty ``job_name``, or ``total_slices`` below 1.
    """

    name = "goodput export"

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
        ElasticGoodputRecorder = require(
            "goodput export", "ml_goodput_measurement", "ml_goodput_measurement.src.goodput_elastic"
        ).ElasticGoodputRecorder
        self.job_name = job_name
        self.logger_name = logger_name or f"goodput_{job_name}"
        self.recorder = ElasticGoodputRecorder(
            job_name, self.logger_name, logging_enabled=True, cloud_logger=cloud_logger
        )
        # The recorder's log, where the library's checkpoint calculator reads save entries:
        # the one given, else the Cloud Logging client the recorder made.
        self._cloud_logger = cloud_logger if cloud_logger is not None else goodput_private.cloud_logger_of(self.recorder)
        self._total_slices = total_slices
        self._most_slices = 0
        self._stopped = False  # a stop since this process's last resume
        self._resumed = False  # this process has resumed once
        self._open = False  # a job start with no job end recorded after it
        self._step_end: float | None = None  # the wall of this process's last step
        self._last_step: int | None = None
        self._saves: list[Save] = []  # since this process's last step: not yet written
        self._evals: list[Eval] = []  # likewise

    def __call__(self, event: Event) -> None:
        """Record one event."""
        rec = self.recorder
        if isinstance(event, Save):
            self._saves.append(event)
        elif isinstance(event, Eval):
            self._evals.append(event)
        elif isinstance(event, Start):
            self._end_between_steps(None)
            self._stopped, self._resumed, self._open = False, False, True
            self._step_end, self._last_step = None, None
            rec.record_job_start_time(_utc(event.process_start))
        elif isinstance(event, Step):
            began = event.wall - event.seconds
            self._end_between_steps(began)
            rec.record_step_start_time(event.step, _utc(began))
            data = min(float(event.data_seconds), float(event.seconds))
            if data > 0:
                self._custom(DATA_WAIT, began, began + data)
            self._step_end, self._last_step = event.wall, event.step
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
            if event.reason == "preempted":
                self._end_between_steps(event.wall)
                if self._last_step is not None:
                    rec.record_step_start_time(self._last_step + 1, _utc(event.wall))
            elif event.reason == "done":
                self._write_orbax_saves()
            if event.reason in ("done", "preempted"):  # the process ends here
                rec.record_job_end_time(_utc(event.wall))
                self._open = False
        elif isinstance(event, Resume):
            self._record_resume(event)

    def _custom(self, kind: str, began: float, ended: float) -> None:
        if ended > began:
            self.recorder.record_custom_badput_event_start_time(_utc(began), kind)
            self.recorder.record_custom_badput_event_end_time(_utc(ended), kind)

    def _end_between_steps(self, until: float | None) -> None:
        """Write the pending saves and evaluation passes, and the rest of the time from the
        last step's end to ``until`` (the next step's start; ``None``: none follows), as
        custom events."""
        at = self._step_end
        pending = [(SAVE, save) for save in self._saves] + [(EVAL, e) for e in self._evals]
        for kind, done in sorted(pending, key=lambda item: item[1].wall):
            began = done.wall - float(done.seconds)
            if at is not None and until is not None:
                began = max(began, at)
                if began > at:
                    self._custom(BETWEEN_STEPS, at, min(began, until))
            ended = done.wall if until is None else min(done.wall, until)
            self._custom(kind, began, ended)
            at = ended if at is None else max(at, ended)
        self._saves, self._evals = [], []
        if at is not None and until is not None:
            self._custom(BETWEEN_STEPS, at, until)
        self._step_end = None

    def _write_orbax_saves(self) -> None:
        """Write the saves after the last step as Orbax save-statistics entries, one per
        step (see the module)."""
        logger = self._cloud_logger
        by_step: dict[int, tuple[float, float]] = {}
        for save in self._saves:
            began, seconds = by_step.get(save.step, (save.wall - save.seconds, 0.0))
            by_step[save.step] = (min(began, save.wall - save.seconds), seconds + float(save.seconds))
        self._saves = []
        self._step_end = None
        if logger is None:
            return
        for step, (began, seconds) in by_step.items():
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

    def close(self, summary: Mapping[str, Any] | None = None) -> None:
        """Record the job end of a process that ended without a ``done`` or ``preempted``
        stop (it failed), then block until the recorder's pending writes are committed.

        ``summary`` is taken, as every sink's ``close`` takes it, and not needed here.

        Args:
            summary: the run's summary, or ``None``.
        """
        self._end_between_steps(None)
        if self._open:
            self.recorder.record_job_end_time(datetime.datetime.now(datetime.timezone.utc))
            self._open = False
        self.recorder.flush()
