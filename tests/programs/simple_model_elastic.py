"""pathwaysutils' own elastic workload (``pathwaysutils.extras.simple_model``), driven as its
docstrings say: one ``Manager``, ``elastic_retry`` around the training, the in-memory
snapshot restored at the start of an attempt, ``ScaleUpSignalError`` at a step boundary once
a slice is back. It imports nothing of elastic_dew; ``elastic-dew simulate`` runs it as it is,
and the in-process tests (``tests/test_third_party_workloads.py``) call :func:`train`.

    python simple_model_elastic.py STEPS [MIN_SLICES|all] [POLL_INTERVAL|default]

Prints ``started``, one ``step N on S slices: rows C,C,...`` line (the CRC-32 of each example's tokens) per step it ran and ``done`` at the end.
"""

import logging
import sys
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
from pathwaysutils.elastic import manager
from pathwaysutils.extras.simple_model import config as config_lib
from pathwaysutils.extras.simple_model import workload as workload_lib

CONFIG = config_lib.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_heads=2,
                                head_dim=16, num_layers=1, per_device_batch_size=1, seq_len=8)
LEARNING_RATE = 0.05


class _Recording:
    """The workload's data iterator, with each batch it hands out kept."""

    def __init__(self, iterator, batches: list):
        self._iterator, self._batches = iterator, batches

    def __next__(self):
        batch = next(self._iterator)
        self._batches.append(np.asarray(batch).copy())
        return batch

    def __getattr__(self, name):
        return getattr(self._iterator, name)


def train(steps: int, minimum_slice_count: int | None, on_step: Callable[[int, int, int, np.ndarray], None], *,
          snapshot_interval: int = 1, **retry: Any) -> Any:
    """Run the workload to ``steps`` under ``elastic_retry(minimum_slice_count, **retry)``.

    ``on_step(attempt, step, active_slice_count, batch)`` is called after each step ran
    (``attempt`` counts from 1; a step re-done after a resume is reported again). Returns
    the final parameters.
    """
    elastic_manager = manager.Manager()
    snapshotter = ocp.v1.training.pathways.Snapshotter(replica_axis_index=0)
    attempt = 0

    @elastic_manager.elastic_retry(minimum_slice_count=minimum_slice_count, **retry)
    def run():
        nonlocal attempt
        attempt += 1
        work = workload_lib.Workload(config=CONFIG, elastic_manager=elastic_manager, total_steps=steps,
                                     learning_rate=LEARNING_RATE, snapshot_interval=snapshot_interval,
                                     snapshotter=snapshotter)
        work.initialize()
        if snapshotter.latest is not None:
            work.restore_from_snapshot()
            work.step = snapshotter.latest.step + 1
        batches: list = []
        work.data_iterator = _Recording(work.data_iterator, batches)
        try:
            while work.step <= steps:
                step = work.step
                work.run_step()
                on_step(attempt, step, elastic_manager.active_slice_count, batches[-1])
                if elastic_manager.available_inactive_slices and work.step <= steps:
                    snapshotter.join()
                    raise manager.ScaleUpSignalError()
            snapshotter.join()
            return work.params
        finally:
            work.close()

    return run()


def _print_step(attempt: int, step: int, slices: int, batch: np.ndarray) -> None:
    print(f"step {step} on {slices} slices: rows " + ",".join(str(zlib.crc32(row.tobytes())) for row in batch),
          flush=True)


def main(steps: int, minimum_slice_count: int | None, poll_interval: float | None) -> None:
    logging.raiseExceptions = True  # as elastic_retry's docstring recommends
    print("started", flush=True)
    polling = {} if poll_interval is None else {"poll_interval": poll_interval}
    train(steps, minimum_slice_count, _print_step, timeout=120, **polling)
    print("done", flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    minimum = None if len(argv) < 2 or argv[1] == "all" else int(argv[1])
    poll = None if len(argv) < 3 or argv[2] == "default" else float(argv[2])
    main(int(argv[0]), minimum, poll)
