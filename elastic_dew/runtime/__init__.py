"""Process set-up every recipe runs before it builds anything, and preemption.

The package is split by job; this module re-exports its public names, so
``from elastic_dew.runtime import ...`` is the one way to reach them:

- :mod:`~elastic_dew.runtime.prepare`: :func:`prepare_process` and :class:`Wandb`, which
  compose the rest (a recipe calls it once, as the first line of ``main()``);
- :mod:`~elastic_dew.runtime.preemption`: :class:`PreemptionNotice`, :class:`Preempted`,
  :data:`PREEMPTED_EXIT` and :func:`install_exit_hook`;
- :mod:`~elastic_dew.runtime.xla_flags` (:data:`EXECUTION_TIMEOUT`) and
  :mod:`~elastic_dew.runtime.compilation_cache` (:func:`use_compilation_cache`, the one
  place JAX's persistent compilation cache is configured): what XLA starts with;
- :mod:`~elastic_dew.runtime.backend`: :func:`cuda_plugin` and the other questions
  about the backend that can be asked before it opens;
- :mod:`~elastic_dew.runtime.pool`: joining the JAX process pool (GPU, Slurm, mpirun,
  ``elastic-dew launch``, Pathways);
- :mod:`~elastic_dew.runtime.layout`: :class:`Layout` and its check;
- :mod:`~elastic_dew.runtime.limits`: rlimits;
- :mod:`~elastic_dew.runtime.local_bucket`: :func:`use_local_bucket`, the one switch
  (``STORAGE_EMULATOR_HOST``) that points every Cloud Storage client at a local server;
- :mod:`~elastic_dew.runtime.timestamp`: :func:`run_timestamp`.

Importing the package changes nothing in the process: it imports no JAX (the XLA flags
and the pool have to be settled before JAX opens a backend, and ``elastic-dew launch``
imports nothing of JAX at all), and it leaves ``sys.excepthook`` alone until a program
calls :func:`install_exit_hook` (or :func:`prepare_process`).
"""

from __future__ import annotations

from elastic_dew.runtime.backend import cuda_plugin
from elastic_dew.runtime.compilation_cache import use_compilation_cache
from elastic_dew.runtime.layout import Layout
from elastic_dew.runtime.local_bucket import use_local_bucket
from elastic_dew.runtime.preemption import (
    PREEMPTED_EXIT,
    Preempted,
    PreemptionNotice,
    install_exit_hook,
)
from elastic_dew.runtime.prepare import Wandb, prepare_process
from elastic_dew.runtime.timestamp import run_timestamp
from elastic_dew.runtime.xla_flags import EXECUTION_TIMEOUT

__all__ = [
    "EXECUTION_TIMEOUT",
    "PREEMPTED_EXIT",
    "Layout",
    "Preempted",
    "PreemptionNotice",
    "Wandb",
    "cuda_plugin",
    "install_exit_hook",
    "prepare_process",
    "run_timestamp",
    "use_compilation_cache",
    "use_local_bucket",
]
