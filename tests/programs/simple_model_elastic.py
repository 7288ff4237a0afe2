"""pathwaysutils' own elastic workload (``pathwaysutils.extras.simple_model``), driven as its
docstrings say: one ``Manager``, ``elastic_retry`` around the training, the in-memory
snapshot restored at the start of an attempt, ``ScaleUpSignalError`` at a step boundary once
a slice is back. It imports nothing of elastic_dew; ``elastic-dew simulate`` runs it as it is.

    python simple_model_elastic.py STEPS [MIN_SLICES|all] [POLL_INTERVAL|default]

Prints ``started``, one ``step N on S slices: rows C,C,...`` line (the CRC-32 of each example's tokens) per step it ran and ``done`` at the end.
"""

import logging
import sys
import zlib

import numpy as np
import orbax.checkpoint as ocp
from pathwaysutils.elastic import manager
from pathwaysutils.extras.simple_model import config as config_lib
from pathwaysutils.extras.simple_model import workload as workload_lib

CONFIG = config_lib.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_heads=2,
                                head_dim=16, num_layers=1, per_device_batch_size=1, seq_len=8)


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


def main(steps: int, minimum_slice_count: int | None, poll_interval: float | None) -> None:
    logging.raiseExceptions = True  # as elastic_retry's docstring recommends
    print("started", flush=True)
    elastic_manager = manager.Manager()
    snapshotter = ocp.v1.training.pathways.Snapshotter(replica_axis_index=0)
    polling = {} if poll_interval is None else {"poll_interval": poll_interval}

    @elastic_manager.elastic_retry(minimum_slice_count=minimum_slice_count, timeout=120, **polling)
    def train():
        work = workload_lib.Workload(config=CONFIG, elastic_manager=elastic_manager, total_steps=steps,
                                     learning_rate=0.05, snapshot_interval=1, snapshotter=snapshotter)
        work.initialize()
        if snapshotter.latest is not None:
            work.restore_from_snapshot()
            work.step = snapshotter.latest.step + 1
        rows: list = []
        work.data_iterator = _Recording(work.data_iterator, rows)
        try:
            while work.step <= steps:
                step = work.step
                work.run_step()
                print(f"step {step} on {elastic_manager.active_slice_count} slices: rows "
                      + ",".join(str(zlib.crc32(row.tobytes())) for row in rows[-1]), flush=True)
                if elastic_manager.available_inactive_slices and work.step <= steps:
                    snapshotter.join()
                    raise manager.ScaleUpSignalError()
            snapshotter.join()
        finally:
            work.close()

    train()
    print("done", flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    minimum = None if len(argv) < 2 or argv[1] == "all" else int(argv[1])
    poll = None if len(argv) < 3 or argv[2] == "default" else float(argv[2])
    main(int(argv[0]), minimum, poll)
