"""Elastic data: exactly-once examples across restores and global-batch changes."""

from __future__ import annotations

import json

import grain
import numpy as np
import pytest

from elastic_dew.elastic.loop.data import ElasticData

pytestmark = pytest.mark.libraries  # Grain's ElasticIterator


def indexed(n: int) -> grain.MapDataset:
    """Element i carries its index and a value derived from it, so contents can be checked."""
    return grain.MapDataset.range(n).map(
        lambda i: {"index": np.int64(i), "value": np.float32(i * 3 + 1)}
    )


class CountingSource:
    """A huge random-access source that records every index read."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.read: list[int] = []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        self.read.append(int(index))
        return {"index": np.int64(index)}


def read_steps(data: ElasticData, steps: int) -> list[tuple[np.ndarray, tuple[int, int]]]:
    out = []
    for _ in range(steps):
        batch, span = data.next()
        out.append((batch, span))
    return out


def test_no_example_is_skipped_or_repeated_when_the_global_batch_shrinks_from_32_to_24():
    n = 100
    data = ElasticData(indexed(n))
    data.start(32)
    before = read_steps(data, 2)
    saved = json.loads(json.dumps(data.get_state()))  # what travels in a snapshot/checkpoint
    read_steps(data, 1)  # step 3 ran, but its slice was lost before the next snapshot

    resumed = ElasticData(indexed(n))
    resumed.start(24, saved)
    after = read_steps(resumed, 6)

    spans = [span for _, span in before + after]
    assert spans[:2] == [(0, 32), (32, 64)]
    assert spans[2:] == [(64 + 24 * k, 88 + 24 * k) for k in range(6)]
    contents = np.concatenate([batch["index"] for batch, _ in before + after])
    global_indices = np.arange(0, 64 + 6 * 24)
    # Exactly once, in order, wrapping past the first epoch of 100 examples.
    np.testing.assert_array_equal(contents, global_indices % n)
    values = np.concatenate([batch["value"] for batch, _ in before + after])
    np.testing.assert_array_equal(values, (global_indices % n) * 3 + 1)
    for batch, (start, end) in before + after:
        np.testing.assert_array_equal(batch["index"], np.arange(start, end) % n)


def test_a_growing_global_batch_resumes_at_the_same_example():
    data = ElasticData(indexed(50))
    data.start(24)
    read_steps(data, 3)
    assert data.position == 72
    data.start(32, data.get_state())  # scale-up in place: same object, larger batch
    batch, span = data.next()
    assert span == (72, 104)
    np.testing.assert_array_equal(batch["index"], np.arange(72, 104) % 50)


def test_restoring_the_position_of_step_one_million_reads_nothing_before_it():
    source = CountingSource(10**12)
    data = ElasticData(grain.MapDataset.source(source), read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))
    position = 1_000_000 * 32
    data.start(24, {"global_next_index": position})
    batch, span = data.next()
    assert span == (position, position + 24)
    np.testing.assert_array_equal(batch["index"], np.arange(position, position + 24))
    assert min(source.read) == position  # restoring did not iterate up to the position
    data.close()


def test_the_state_is_json_and_names_the_position_and_the_dataset_length():
    data = ElasticData(indexed(10))
    assert data.position == 0
    data.start(4)
    read_steps(data, 2)
    state = data.get_state()
    assert json.loads(json.dumps(state)) == {"global_next_index": 8, "dataset_length": 10}


def test_a_state_from_another_dataset_or_a_bad_batch_is_refused_before_the_iterator_changes():
    data = ElasticData(indexed(10))
    data.start(4)
    data.next()
    with pytest.raises(ValueError, match="dataset of 12 examples, but this one has 10"):
        data.start(4, {"global_next_index": 8, "dataset_length": 12})
    with pytest.raises(ValueError, match="has no 'global_next_index'"):
        data.start(4, {"position": 8})
    with pytest.raises(ValueError, match="global_batch=0 must be an int >= 1"):
        data.start(0)
    batch, span = data.next()  # the running iterator is untouched
    assert span == (4, 8)
    np.testing.assert_array_equal(batch["index"], [4, 5, 6, 7])


def test_reading_before_start_and_an_empty_dataset_are_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        ElasticData(indexed(0))
    with pytest.raises(TypeError, match="grain.MapDataset"):
        ElasticData([1, 2, 3])
    with pytest.raises(RuntimeError, match="before start"):
        ElasticData(indexed(3)).next()


def test_reads_within_the_storage_bound_start_one_reader_thread_for_all_the_steps(monkeypatch):
    """read_within runs every step's read on one long-lived thread: over 20 steps after the
    first, no thread is started (Grain's read-ahead included), and close ends the reader."""
    import threading

    from elastic_dew.elastic.loop.data import read_within

    data = ElasticData(indexed(1000))
    data.start(4)
    first = read_within(data, 1, 30.0)
    started: list[str] = []
    original = threading.Thread.start

    def counted(thread):
        started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    spans = [read_within(data, step, 30.0).examples for step in range(2, 22)]
    monkeypatch.undo()
    assert started == []
    assert first.examples == (0, 4) and spans[-1] == (80, 84)
    (reader,) = [t for t in threading.enumerate() if t.name == "elastic-dew-data-reader"]
    data.close()
    reader.join(10)
    assert not reader.is_alive()


def test_a_read_that_makes_no_progress_still_ends_in_a_storage_timeout_and_its_reader_then_ends():
    import threading

    from elastic_dew.elastic.loop.data import read_within
    from elastic_dew.elastic.state import storage

    release = threading.Event()

    def read(i):
        if i == 8:
            release.wait(30)
        return {"index": np.int64(i)}

    data = ElasticData(grain.MapDataset.range(100).map(read),
                       read_options=grain.ReadOptions(num_threads=1, prefetch_buffer_size=1))
    data.start(4)
    assert read_within(data, 1, 30.0).examples == (0, 4)
    reader = data._reader.thread
    read_within(data, 2, 30.0)
    with pytest.raises(storage.StorageTimeout) as stalled:
        read_within(data, 3, 0.3)
    assert str(stalled.value).startswith("data read of step 3 in the training data did not finish within")
    assert reader in storage.stuck() and data._stuck
    release.set()
    reader.join(30)
    assert not reader.is_alive() and reader not in storage.stuck()
    data.close()  # leaves the iterator of the given-up read (close would wait on it)
