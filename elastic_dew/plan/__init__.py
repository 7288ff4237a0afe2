"""Plan a run at scale: expected goodput and the elastic settings to pick for N slices.

- :mod:`~elastic_dew.plan.inputs`: the run's costs and the cluster, each figure with its
  origin (measured from a run directory, given, or a stated default);
- :mod:`~elastic_dew.plan.policy`: a recovery policy and its settings
  (:class:`PolicySettings`), what the model and its checks take;
- :mod:`~elastic_dew.plan.pool`: the cluster's pool of slices (its rates, the slices down,
  the spares it needs);
- :mod:`~elastic_dew.plan.model`: the analytic model of each policy's goodput and useful
  work, and the cadence and floor it recommends;
- :mod:`~elastic_dew.plan.des`: a discrete-event simulation of the same cluster, the
  model's check;
- :mod:`~elastic_dew.plan.planner`: a whole plan (every policy, with and without spares,
  and over 1 to 10,000 slices);
- :mod:`~elastic_dew.plan.retry`: the retry budget (``max_attempts``,
  ``retry_reset_steps``) that keeps a run of the planned length from giving up;
- :mod:`~elastic_dew.plan.faults`: fault schedules drawn from the cluster's rates, in the
  simulator's grammar (and the compressed cluster they describe), so a plan's prediction
  can be checked on real runs;
- :mod:`~elastic_dew.plan.check`: finished runs' goodput beside the prediction.

``elastic-dew plan`` is its command line.
"""

from __future__ import annotations

from elastic_dew.plan.faults import draw_schedule
from elastic_dew.plan.inputs import Cluster, Costs, measured_costs
from elastic_dew.plan.model import PolicyOutcome, evaluate
from elastic_dew.plan.policy import PolicySettings
from elastic_dew.plan.planner import Plan, PolicyPlan, plan

#: The public names (``docs/api.md``): the plan and what it takes.
__all__ = [
    "Cluster",
    "Costs",
    "measured_costs",
    "plan",
    "Plan",
    "PolicyPlan",
    "evaluate",
    "PolicySettings",
    "PolicyOutcome",
    "draw_schedule",
]
