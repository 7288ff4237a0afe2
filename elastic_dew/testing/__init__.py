"""The chaos harness: faulted scenarios, their runner, and the invariants they must keep.

A test support package, not part of training: the fault-matrix and chaos tests and the
``chaos`` command (:mod:`elastic_dew.commands.chaos`) import it.

* :mod:`~elastic_dew.testing.scenarios`: :class:`Scenario`, the model it trains, and
  :func:`draw` (a random scenario from a seed) with its :func:`replay_command`;
* :mod:`~elastic_dew.testing.runner`: :func:`run` (train a scenario, restarting after each
  preemption), :func:`reference` (the failure-free run) and :func:`run_seed`;
* :mod:`~elastic_dew.testing.outcome`: :class:`ScenarioOutcome`, what a run left behind, and
  :func:`committed_checkpoints`;
* :mod:`~elastic_dew.testing.invariants`: :func:`check`, every broken invariant of a run.
"""

from elastic_dew.testing.invariants import check
from elastic_dew.testing.outcome import ScenarioOutcome, committed_checkpoints
from elastic_dew.testing.runner import reference, run, run_seed
from elastic_dew.testing.scenarios import (
    DEVICES_PER_SLICE,
    GLOBAL_BATCH,
    MAX_PROCESSES,
    TOLERANCE,
    TOTAL_SLICES,
    Scenario,
    draw,
    model,
    replay_command,
)

#: The public names (``docs/api.md``): a scenario, its run, its reference and its check. The
#: harness's constants and helpers stay importable here but may change.
__all__ = [
    "Scenario",
    "ScenarioOutcome",
    "run",
    "reference",
    "check",
    "draw",
    "replay_command",
]
