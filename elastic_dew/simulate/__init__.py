"""Simulated TPU slices on the host's CPU devices: lose, hang, restore, error, preempt and kill, on CPU.

The package by job:

* :mod:`~elastic_dew.simulate.topology`: which CPU devices form which slice, and the
  ``get_slice_to_devices`` seam pathwaysutils asks;
* :mod:`~elastic_dew.simulate.patches`: the read guards on JAX and NumPy and the registry of
  the one active simulator (install/uninstall);
* :mod:`~elastic_dew.simulate.schedule`: the fault grammar, the table of actions, and firing
  a schedule at the elastic layer's phases, or at the step function's dispatches in a loop
  that announces nothing, through the run directory's fault log;
* :mod:`~elastic_dew.simulate.simulator`: :class:`SimulatedSlices`, the context manager that
  puts them together;
* :mod:`~elastic_dew.simulate.launcher`: a program run unmodified under the simulator (the
  child of ``elastic-dew simulate``);
* :mod:`~elastic_dew.simulate.watch`: what the program does with its state (its Orbax,
  pathwaysutils and JAX calls, the arrays alive), recorded as it happens;
* :mod:`~elastic_dew.simulate.diagnosis`: what each fault cost the program and the mistakes
  it made, each named with its fix, from those records and the fault log.

Names are imported lazily: the grammar is read without starting JAX.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ACTIONS": "schedule",
    "Cost": "diagnosis",
    "Diagnosis": "diagnosis",
    "PROBLEMS": "diagnosis",
    "Problem": "diagnosis",
    "ScheduledFault": "schedule",
    "Schedule": "schedule",
    "SimulatedSlices": "simulator",
    "diagnose": "diagnosis",
    "parse_schedule": "schedule",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    # Lazily, so the grammar and the launcher's settings are read without starting JAX
    # (``elastic-dew simulate`` checks a schedule before the program's process starts).
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'elastic_dew.simulate' has no attribute {name!r}")
    return getattr(importlib.import_module(f"elastic_dew.simulate.{module}"), name)


def __dir__() -> list[str]:
    return __all__
