"""Item 8: the time to restore the data position at step 10 and at step 1,000,000.

Grain's ``ElasticIterator`` slices the dataset lazily, so a position far into the data
should cost what a near one costs. Timed from ``ElasticData.start`` with a saved position
to the first batch read, alternating the two positions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import median

__all__ = ["measure"]

BATCH = 48


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    from benchmarks.worker import lm_parts
    from elastic_dew.elastic.loop.data import ElasticData

    dataset = lm_parts()["dataset"]
    times: dict[int, list[float]] = {10: [], 1_000_000: []}
    data = ElasticData(dataset)
    for _ in range(sizes.reposition_repeats + 1):  # the first round warms up
        for step in times:
            state = {"global_next_index": step * BATCH, "dataset_length": len(dataset)}
            t = time.perf_counter()
            data.start(BATCH, state)
            data.next()
            times[step].append(time.perf_counter() - t)
    data.close()
    near, far = median(times[10][1:]), median(times[1_000_000][1:])
    notes.append(f"Data reposition: global batch {BATCH}, start() to the first batch, {sizes.reposition_repeats} alternating repeats.")
    return {"reposition_s_step10": near, "reposition_s_step1e6": far, "reposition_ratio": far / near}
