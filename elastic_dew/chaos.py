"""``python -m elastic_dew.chaos --seed N``: the chaos command's replay entry point.

The harness lives in :mod:`elastic_dew.testing` (scenarios, runner, invariants) and the
command in :mod:`elastic_dew.commands.chaos`; this module keeps the one-line replay command
every failure prints working, and re-exports the harness for code written against it.
"""

from __future__ import annotations

import sys

from elastic_dew.commands.chaos import main
from elastic_dew.testing import (
    DEVICES_PER_SLICE,
    GLOBAL_BATCH,
    MAX_PROCESSES,
    TOLERANCE,
    TOTAL_SLICES,
    Outcome,
    Scenario,
    check,
    committed_checkpoints,
    draw,
    model,
    reference,
    replay_command,
    run,
    run_seed,
)

__all__ = [
    "TOTAL_SLICES",
    "DEVICES_PER_SLICE",
    "GLOBAL_BATCH",
    "TOLERANCE",
    "MAX_PROCESSES",
    "Scenario",
    "Outcome",
    "model",
    "committed_checkpoints",
    "run",
    "reference",
    "run_seed",
    "check",
    "draw",
    "replay_command",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())
