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

**Worker processes.** ``workers=N`` reads through ``N`` Grain worker processes
(``grain.MultiprocessingOptions``, which ``ElasticIterator`` applies after batching), as a
file-backed dataset (``grain.sources.ArrayRecordDataSource``) usually is. The batches are
the same as without workers. Grain's workers read absl flags, so absl's flags are marked
parsed first when the program has not parsed them (``UnparsedFlagAccessError`` otherwise).
Starting workers costs seconds (a ``spawn`` per worker, each importing the dataset's code).
A restart at the same global batch and shard count, at a position the running iterator has
passed since it started (a restore of the newest snapshot, a retry at the same batch) does
not pay it: the running workers are sent Grain's own iterator state for that position
(``set_state``, no new process). Any other restart (another global batch, a position ahead
of or before the running iterator's) starts new workers.

**Grain's API.** The installed releases' ``ElasticIterator`` is an ``IterDataset``; Grain's
main branch (after 0.2.18) makes it a ``DatasetIterator`` whose ``close()`` leaves its
workers running. Both work: what the rewind and the close need of Grain's internals is in
:mod:`elastic_dew._compat.grain`, for either API.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
from typing import Any, NamedTuple

import grain
import jax

from elastic_dew._compat import grain as grain_private
from elastic_dew.elastic.deadline import ReadThread
from elastic_dew.elastic.state import storage

__all__ = ["ElasticData", "DataBatch", "POSITION_KEY", "default_read_options", "read_within"]

logger = logging.getLogger(__name__)

#: Grain's own state key for the position; kept as is so a Grain user can read our state.
POSITION_KEY = "global_next_index"
_LENGTH_KEY = "dataset_length"


def default_read_options() -> grain.ReadOptions:
    """Read-ahead of two batches on at most as many threads as there are cores.

    Every attempt and every scale-up starts a new iterator, whose first batch waits for its
    read-ahead to fill. With Grain's default (16 threads, 500 elements) that first step can
    be the largest part of a recovery (``docs/performance.md``); two batches keep
    the next step's data ready without delaying the first. ``ElasticIterator`` batches before
    ``to_iter_dataset``, so the buffer counts batches, whatever the batch's size.
    """
    return grain.ReadOptions(
        num_threads=max(1, min(16, os.cpu_count() or 1)), prefetch_buffer_size=2
    )


class DataBatch(NamedTuple):
    """One batch as :meth:`ElasticData.next` hands it out: the ``batch`` (a numpy pytree) and
    the half-open range of global example indices it consumed, ``examples``. It unpacks as
    ``batch, examples``."""

    batch: Any
    examples: tuple[int, int]


class ElasticData:
    """A deterministic ``MapDataset`` read in global batches that may change between attempts.

    ``workers`` (default 0: read in this process) is the number of Grain worker processes;
    ``read_options`` the read-ahead (default :func:`default_read_options`).

    Args:
        dataset: a finite, deterministic ``grain.MapDataset``.
        read_options: Grain's read-ahead, or ``None`` for :func:`default_read_options`.
        workers: Grain worker processes (0: read in this process).

    Raises:
        TypeError: ``dataset`` is not a ``grain.MapDataset``.
        ValueError: ``workers`` below 0, or an empty dataset.
    """

    #: How many recent positions of the running iterator keep Grain's state for a rewind.
    REWINDABLE = 256

    def __init__(
        self,
        dataset: grain.MapDataset,
        *,
        read_options: grain.ReadOptions | None = None,
        workers: int = 0,
    ) -> None:
        if not isinstance(dataset, grain.MapDataset):
            raise TypeError(
                f"ElasticData needs a grain.MapDataset (random access by index), got "
                f"{type(dataset).__name__}; build it with grain.MapDataset.source(...)"
            )
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ValueError(f"workers={workers!r} must be an int >= 0 (Grain worker processes; 0: none)")
        length = len(dataset)
        if length < 1:
            raise ValueError("the dataset is empty; ElasticData needs at least one example")
        self.length = length
        self.workers = workers
        self._dataset = dataset if length >= sys.maxsize else dataset.repeat()
        self._read_options = read_options
        self._iterator: Any = None
        self._layout: tuple[int, int, int] | None = None  # global batch, shard index, shard count
        #: position -> the worker pipeline's Grain state before the batch at that position
        self._rewind: collections.OrderedDict[int, Any] = collections.OrderedDict()
        self._position = 0
        self.global_batch: int | None = None
        #: Whether a read was given up on (:func:`read_within`): its reader is stuck, so
        #: :meth:`close` leaves it.
        self._stuck = False
        self._reader: ReadThread | None = None  # read_within's thread, started by its first read

    def start(self, global_batch: int, state: dict | None = None) -> None:
        """(Re)create the iterator for this attempt's ``global_batch``, at ``state``'s position.

        ``state`` is a dict from :meth:`get_state` (``None``: the start of the data). It is
        checked before the current iterator is touched. With workers, a position the
        running iterator has passed at the same batch reuses its workers (module docstring).

        Args:
            global_batch: examples per step in this attempt.
            state: a position from :meth:`get_state`, or ``None`` for the start.

        Raises:
            ValueError: a batch below 1 or not divisible by the JAX processes, or a position that
                is not this dataset's; the current iterator is untouched.
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
        layout = (global_batch, jax.process_index(), shards)
        if self._iterator is not None and layout == self._layout and self._rewind_to(position):
            logger.info("data at example %d, global batch %d (workers kept)", position, global_batch)
            return
        self._close_iterator()
        options = None
        if self.workers:
            _absl_flags_parsed()
            options = grain.MultiprocessingOptions(num_workers=self.workers)
        iterator = grain.experimental.ElasticIterator(
            self._dataset,
            global_batch,
            grain.sharding.ShardOptions(shard_index=jax.process_index(), shard_count=shards),
            read_options=self._read_options or default_read_options(),
            multiprocessing_options=options,
        )
        iterator.set_state({POSITION_KEY: position})
        self._iterator = iterator
        self._layout = layout
        self._position = position
        self.global_batch = global_batch
        logger.info("data at example %d, global batch %d", position, global_batch)

    def _rewind_to(self, position: int) -> bool:
        """Move the running worker pipeline to ``position`` by Grain's own state; whether it could."""
        if not self.workers or position not in self._rewind:
            return False
        if not grain_private.rewind(self._iterator, self._rewind[position], position):
            return False
        self._position = position
        return True

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

    def next(self) -> DataBatch:
        """The next batch (a numpy pytree) and the half-open range of global indices it consumed.

        Returns:
            The :class:`DataBatch`: the batch, and its ``[start, end)`` global example indices.

        Raises:
            RuntimeError: called before :meth:`start`.
        """
        if self._iterator is None:
            raise RuntimeError("ElasticData.next() before start(global_batch, state)")
        if self.workers:
            pipeline = grain_private.pipeline(self._iterator)
            if pipeline is not None:  # created by the first next(); nothing to rewind to before it
                self._rewind[self._position] = pipeline.get_state()
                while len(self._rewind) > self.REWINDABLE:
                    self._rewind.popitem(last=False)
        batch = next(self._iterator)
        start = self._position
        self._position = self._iterator.get_state()[POSITION_KEY]
        return DataBatch(batch, (start, self._position))

    def get_state(self) -> dict:
        """A JSON-able dict: the global index of the next example, and the dataset length.

        Returns:
            The position, as :meth:`start` takes it.
        """
        return {POSITION_KEY: int(self._position), _LENGTH_KEY: int(self.length)}

    @property
    def position(self) -> int:
        """The global index of the next example."""
        return self._position

    def _close_iterator(self) -> None:
        if self._iterator is not None:
            grain_private.close(self._iterator)
            self._iterator = None
        self._layout = None
        self._rewind.clear()

    def close(self) -> None:
        """Stop the iterator's read-ahead threads and its worker processes (unless a read was
        given up on: its reader is stuck, and closing would wait on it), and end
        :func:`read_within`'s reader thread once it is idle."""
        if self._reader is not None:
            self._reader.stop()
            self._reader = None
        if not self._stuck:
            self._close_iterator()


def read_within(data: ElasticData, step: int, timeout: float | None) -> DataBatch:
    """Step ``step``'s batch, ``data.next()`` within the storage timeout ``timeout`` (at least
    :data:`~elastic_dew.elastic.state.storage.FLOOR_SECONDS` when ``None``): a data file whose
    reads block (a stalled Cloud Storage FUSE mount) ends the run with
    :class:`~elastic_dew.elastic.state.storage.StorageTimeout` instead of holding it for ever,
    and ``data`` is then not closed. The reads run on one long-lived thread of ``data``'s,
    started by the first; a read given up on ends it once that read returns (a later read
    starts another).

    Raises:
        StorageTimeout: the read did not finish within the timeout.
    """
    if data._reader is None:
        data._reader = ReadThread("data-reader")
    try:
        return storage.bounded("read", "the training data", step, timeout or storage.FLOOR_SECONDS, data.next,
                               noun="data", activity=None, runner=data._reader)
    except storage.StorageTimeout:
        data._stuck = True
        data._reader.stop()
        data._reader = None
        raise


def _absl_flags_parsed() -> None:
    """Mark absl's flags parsed if the program did not parse them: Grain's worker set-up reads
    its debug flags, and an unparsed flag raises ``UnparsedFlagAccessError``."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
