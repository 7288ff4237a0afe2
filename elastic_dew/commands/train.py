"""``elastic-dew train RECIPE``: train a recipe elastically, on simulated or real slices.

The command is the terminal face of :mod:`elastic_dew.run`, which plans, checks and
executes the run: this module declares the options (built by :mod:`elastic_dew.console`
from the settings' own metadata), parses them, and hands the run to the library. On CPU
the slices are simulated and ``--schedule`` fires faults; under Pathways
(``JAX_PLATFORMS=proxy``) the allocation's real slices are used. Every argument is checked
before anything is touched; a bad one is an error naming the fix, with exit status 2. A
preemption ends the command with ``PREEMPTED_EXIT`` (143); the same command run again
resumes the run.
"""

from __future__ import annotations

import argparse

from elastic_dew import console
from elastic_dew import run as runs
from elastic_dew.run import planning

__all__ = ["configure", "run", "plan", "PROG"]

PROG = "elastic-dew train"


def configure(parser: argparse.ArgumentParser) -> None:
    """The ``train`` options."""
    console.add_options(parser)


def plan(args: argparse.Namespace) -> planning.RunPlan:
    """The checked run that parsed options ask for, touching nothing (raises ``UsageError``)."""
    return planning.plan_run(console.config_of(args))


def run(args: argparse.Namespace) -> int:
    """The ``elastic-dew train`` command: plan once, prepare the process, train; the exit status."""
    return console.train(args, PROG)
