"""Elastic data: Grain's ``ElasticIterator`` over a ``MapDataset``, restartable at any batch size.

The position in the data is one number, the global index of the next example. Grain's
``grain.experimental.ElasticIterator`` keeps exactly that (``global_next_index``), reads
``dataset[position + shard_index :: shard_count]`` and batches it, so a position saved under
one global batch resumes under another (e.g. 32 on four slices, 24 on three with
``scale_by_active_slices``) with no example skipped and none repeated. Restoring a position
slices the dataset lazily: it costs the same at step 1,000,000 as at step 1.

Training runs past one epoch by wrapping: a finite dataset of ``n`` examples is repeated
with ``MapDataset.repeat()``, so global index ``i`` reads example ``i % n`` of epoch
``i // n``; random transformations in the dataset are reseeded every epoch by Grain. The
dataset must be deterministic (index ``i`` always gives the same example) and must not
``filter`` (Grain's elastic iterator refuses it: a filter breaks the index arithmetic).

Pathways runs a single controller, so there is one shard; under multi-controller JAX each
process reads its own shard (``jax.process_index()`` of ``jax.process_count()``) and
:meth:`ElasticData.next` returns that process's part of the global batch.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import grain
import jax

__all__ = ["ElasticData", "POSITION_KEY", "default_read_options"]

logger = logging.getLogger(__name__)

#: Grain's own state key for the position; kept as is so a Grain user can read our state.
POSITION_KEY = "global_next_index"
_LENGTH_KEY = "dataset_length"


def default_read_options(batch: int) -> grain.ReadOptions:
    """Read-ahead of two batches on at most as many threads as there are cores.

    Every attempt and every scale-up starts a new iterator, whose first batch waits for its
    read-ahead to fill. Grain's default (16 threads, 500 elements) made that first step the
    largest part of recovery on a small host (the benchmarks measured it); two batches keep
    the next step's data ready without delaying the first. ``ElasticIterator`` batches before
    ``to_iter_dataset``, so the buffer counts batches: ``batch`` (the global batch) only
    names the caller's batch and does not size the buffer.
    """
    return grain.ReadOptions(
        num_threads=max(1, min(16, os.cpu_count() or 1)), prefetch_buffer_size=2
    )


class ElasticData:
    """A deterministic ``MapDataset`` read in global batches that may change between attempts."""

    def __init__(
        self, dataset: grain.MapDataset, *, read_options: grain.ReadOptions | None = None
    ) -> None:
        if not isinstance(dataset, grain.MapDataset):
            raise TypeError(
                f"ElasticData needs a grain.MapDataset (random access by index), got "
                f"{type(dataset).__name__}; build it with grain.MapDataset.source(...)"
            )
        length = len(dataset)
        if length < 1:
            raise ValueError("the dataset is empty; ElasticData needs at least one example")
        self.length = length
        self._dataset = dataset if length >= sys.maxsize else dataset.repeat()
        self._read_options = read_options
        self._iterator: Any = None
        self._position = 0
        self.global_batch: int | None = None

    def start(self, global_batch: int, state: dict | None = None) -> None:
        """(Re)create the iterator for this attempt's ``global_batch``, at ``state``'s position.

        ``state`` is a dict from :meth:`get_state` (``None``: the start of the data). It is
        checked before the current iterator is touched.
        """
        shards = jax.process_count()
        if not isinstance(global_batch, int) or global_batch < 1:
            raise ValueError(f"global_batch={global_batch!r} must be an int >= 1")
        if global_batch % shards:
            raise ValueError(
                f"global_batch={global_batch} is not divisible by the {shards} data shards "
                f"(JAX processes); use a multiple of {shards}"
            )
        position = 0 if state is None else self._position_from(state)
        if self._iterator is not None:
            self._iterator.close()
        iterator = grain.experimental.ElasticIterator(
            self._dataset,
            global_batch,
            grain.sharding.ShardOptions(shard_index=jax.process_index(), shard_count=shards),
            read_options=self._read_options or default_read_options(global_batch // shards),
        )
        iterator.set_state({POSITION_KEY: position})
        self._iterator = iterator
        self._position = position
        self.global_batch = global_batch
        logger.info("data at example %d, global batch %d", position, global_batch)

    def _position_from(self, state: dict) -> int:
        if not isinstance(state, dict) or POSITION_KEY not in state:
            raise ValueError(
                f"data state {state!r} has no {POSITION_KEY!r}; pass a dict from ElasticData.get_state()"
            )
        position = state[POSITION_KEY]
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise ValueError(f"data state {POSITION_KEY}={position!r} must be an int >= 0")
        saved_length = state.get(_LENGTH_KEY)
        if saved_length is not None and saved_length != self.length:
            raise ValueError(
                f"data state was saved over a dataset of {saved_length} examples, but this one has "
                f"{self.length}: positions would not match; resume with the same dataset"
            )
        return position

    def next(self) -> tuple[Any, tuple[int, int]]:
        """The next batch (a numpy pytree) and the half-open range of global indices it consumed."""
        if self._iterator is None:
            raise RuntimeError("ElasticData.next() before start(global_batch, state)")
        batch = next(self._iterator)
        start = self._position
        self._position = self._iterator.get_state()[POSITION_KEY]
        return batch, (start, self._position)

    def get_state(self) -> dict:
        """A JSON-able dict: the global index of the next example, and the dataset length."""
        return {POSITION_KEY: int(self._position), _LENGTH_KEY: int(self.length)}

    @property
    def position(self) -> int:
        """The global index of the next example."""
        return self._position

    def close(self) -> None:
        """Stop the iterator's read-ahead threads."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
