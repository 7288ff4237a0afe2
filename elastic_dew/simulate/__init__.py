"""Simulated TPU slices on the host's CPU devices: lose, hang, restore, error, preempt and kill, on CPU.

The package by job:

* :mod:`~elastic_dew.simulate.topology`: which CPU devices form which slice, and the
  ``get_slice_to_devices`` seam pathwaysutils asks;
* :mod:`~elastic_dew.simulate.patches`: the read guards on JAX and NumPy and the registry of
  the one active simulator (install/uninstall);
* :mod:`~elastic_dew.simulate.schedule`: the fault grammar, the table of actions, and firing
  a schedule at the elastic layer's phases, or at the step program's dispatches in a loop
  that announces nothing, through the run directory's fault log;
* :mod:`~elastic_dew.simulate.simulator`: :class:`SimulatedSlices`, the context manager that
  puts them together.
"""

from elastic_dew.simulate.schedule import (
    ACTION_TABLE,
    ACTIONS,
    PHASES,
    SLICE_DOWN_CODES,
    Action,
    Fault,
    Schedule,
    check_slices,
    parse_schedule,
    unreachable,
)
from elastic_dew.simulate.simulator import SimulatedSlices
from elastic_dew.simulate.topology import Topology

__all__ = [
    "ACTIONS",
    "ACTION_TABLE",
    "PHASES",
    "SLICE_DOWN_CODES",
    "Action",
    "Fault",
    "Schedule",
    "SimulatedSlices",
    "Topology",
    "check_slices",
    "parse_schedule",
    "unreachable",
]
