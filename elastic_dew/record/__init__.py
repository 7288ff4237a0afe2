"""The run record: ``events.jsonl``, ``summary.json``, ``final_params.npz`` and ``timeline.png``.

Other tools read these files, so their keys are a contract (see ``docs/trainer.md``). One
module per job:

- :mod:`~elastic_dew.record.log`: the append-only ``events.jsonl`` writer
  (:class:`RunRecord`) and its readers, typed through :mod:`elastic_dew.elastic.events`;
- :mod:`~elastic_dew.record.goodput`: the commit rule of step lines and the goodput/badput
  summary;
- :mod:`~elastic_dew.record.params`: the final parameters' file and digest;
- :mod:`~elastic_dew.record.summary`: ``summary.json``;
- :mod:`~elastic_dew.record.timeline`: the timeline picture;
- :mod:`~elastic_dew.record.text`: the summary as a text table.

The run directory's file names and the simulator's fault log are
:mod:`elastic_dew.rundir`'s; they are re-exported here for the callers that name them
through the record.
"""

from __future__ import annotations

from elastic_dew.rundir import (
    EVENTS_FILE,
    FAULTS_FILE,
    PARAMS_FILE,
    SUMMARY_FILE,
    TIMELINE_FILE,
    read_faults,
)
from elastic_dew.record.goodput import (
    BADPUT_CATEGORIES,
    Goodput,
    account,
    committed_step_lines,
    summarize,
)
from elastic_dew.record.log import (
    RunRecord,
    as_events,
    read_events,
)
from elastic_dew.record.params import load_params, state_digest
from elastic_dew.record.summary import load_summary
from elastic_dew.record.text import format_summary
from elastic_dew.record.timeline import draw_timeline

__all__ = [
    "RunRecord",
    "read_events",
    "read_faults",
    "as_events",
    "committed_step_lines",
    "summarize",
    "Goodput",
    "account",
    "BADPUT_CATEGORIES",
    "load_summary",
    "load_params",
    "state_digest",
    "format_summary",
    "draw_timeline",
    "EVENTS_FILE",
    "SUMMARY_FILE",
    "PARAMS_FILE",
    "TIMELINE_FILE",
    "FAULTS_FILE",
]
