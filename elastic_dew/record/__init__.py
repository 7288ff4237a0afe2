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

from elastic_dew._deprecation import moved_names
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
    run_events,
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

#: What left the public list in 0.2.0 (what the trainer writes with, and the goodput
#: accounting's own tables), and ``committed_steps``, now named for what it returns: served
#: from here with a warning until 0.3. (``run_events`` warns where it is called.)
__getattr__ = moved_names(__name__, {
    "committed_steps": "elastic_dew.record.goodput.committed_step_lines",
    "CUSTOM_BADPUT_TYPES": "elastic_dew.record.goodput.CUSTOM_BADPUT_TYPES",
    "NOT_APPLICABLE": "elastic_dew.record.goodput.NOT_APPLICABLE",
    "committed_evals": "elastic_dew.record.goodput.committed_evals",
    "as_event": "elastic_dew.record.log.as_event",
    "process_start_time": "elastic_dew.record.log.process_start_time",
    "flatten_params": "elastic_dew.record.params.flatten_params",
    "write_params": "elastic_dew.record.params.write_params",
    "write_summary": "elastic_dew.record.summary.write_summary",
})
