"""One training run of a recipe: configured, planned once, checked once, executed once.

A :class:`RunConfig` is what a user asks for, one typed part each: the recipe and its
``build()`` overrides, the :class:`~elastic_dew.elastic.config.ElasticConfig`, the
:class:`~elastic_dew.train_config.TrainConfig`, the simulated slices and their fault schedule
(:class:`SimConfig`), the observability options and where the run lives. Each part checks
its own fields as it is built; :func:`plan_run` checks what spans them and decides the run,
touching nothing: the recipe module, the batch against every slice count, the schedule
against the slices, the run directory and its identity (through :mod:`elastic_dew.rundir`,
whose identity includes the fault schedule, so resuming with another ``--schedule`` is
refused). :func:`main` plans, prepares the process (the simulated host
device count must be set before JAX's backend opens) and executes the plan, returning the
exit status: 0, :data:`~elastic_dew.runtime.PREEMPTED_EXIT` (143) after a preemption, and
:data:`USAGE_EXIT` (2) for a bad argument.

On CPU (``JAX_PLATFORMS`` unset or ``cpu``) the slices are simulated: the run trains inside
:class:`~elastic_dew.simulate.SimulatedSlices`, which fires the schedule's faults and records
them in the run directory's fault log, so the same run started again after exit 143 or a kill
resumes and does not fire them again. Under Pathways (``JAX_PLATFORMS=proxy``) the
allocation's real slices are used, and simulator settings are refused.

The run directory is ``run_dir``, else ``runs/NAME`` with NAME from ``name``, else
``$JOBSET_NAME`` (a restarted pod re-uses its run), else a timestamp (refused if that
directory exists). It is a local directory: a URL is refused (mount the bucket).

The package by job: :mod:`~elastic_dew.run.config` (the configuration and its parts),
:mod:`~elastic_dew.run.planning` (:func:`plan_run` and what a planned run decides),
:mod:`~elastic_dew.run.execution` (:func:`execute` and :func:`main`),
:mod:`~elastic_dew.run.recipes` (the recipe registry), :mod:`~elastic_dew.run.exits` (the
exit statuses and :class:`UsageError`); this module holds only the package's names.

This module never prints: how a run is shown (progress, log routing, the summary, the
wording of a refusal) is the caller's :class:`Display` (:mod:`elastic_dew.console` for a
terminal). The command line and the recipes' ``main`` both come here.
"""

from __future__ import annotations

from elastic_dew.run.config import RunConfig, SimConfig
from elastic_dew.run.execution import main
from elastic_dew.run.exits import FAILED_EXIT, USAGE_EXIT, UsageError
from elastic_dew.run.recipes import available_recipes

__all__ = [
    "RunConfig",
    "SimConfig",
    "main",
    "UsageError",
    "available_recipes",
    "USAGE_EXIT",
    "FAILED_EXIT",
]
