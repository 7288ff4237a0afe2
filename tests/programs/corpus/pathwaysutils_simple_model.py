"""pathwaysutils' own elastic workload (``pathwaysutils.extras.simple_model``), as its docstrings drive it.

Schedules: lose:2@3,restore:2@5; lose:1@2,lose:2@4; hang:1@3,lose:1@+2; preempt@4

The workload of ``tests/programs/simple_model_elastic.py`` (one ``Manager``, the workload's
in-memory snapshot restored at the start of an attempt, ``ScaleUpSignalError`` at a step
boundary once a slice is back), with ``minimum_slice_count=1`` and a short poll interval. It
imports nothing of elastic_dew.

    python pathwaysutils_simple_model.py [--steps N]

Prints ``done`` at the end.
"""

import argparse
import os
import sys

import pathwaysutils

pathwaysutils.initialize()  # before the first JAX call: on Pathways it registers the backend
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from simple_model_elastic import main as run  # noqa: E402 - the workload beside this directory


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    run(args.steps, 1, 0.05)


if __name__ == "__main__":
    main()
