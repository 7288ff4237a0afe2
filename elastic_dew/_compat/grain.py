"""Grain's private names elastic_dew uses, each named and checked (the seam's Grain module).

:class:`elastic_dew.elastic.loop.data.ElasticData` needs three things Grain's public API does not
give: the iterator ``ElasticIterator`` reads through (to close it, and its worker processes,
under both Grain APIs), that iterator's running pipeline (to save and set Grain's own state
for a rewind that keeps the workers), and that iterator's position field (set with the
pipeline's state, since the public ``set_state`` drops the pipeline and its workers). Every
such use is here, so a Grain release that renames or reshapes one breaks this module alone,
and ``tests/test_compat.py`` and ``tests/test_grain_adapter.py`` name the member that changed. Read against grain 0.2.18
(:data:`GRAIN_VERSION_READ`) and google/grain's main branch at commit
f5dd0d8a490004ecf07436bbb0222c73cf4c03b9, in ``grain/_src/python/dataset/elastic_iterator.py``:

* **the reading iterator**: the release's ``ElasticIterator`` (an ``IterDataset``) creates it
  on first use as the ``functools.cached_property`` ``_default_iterator``; main's (a
  ``DatasetIterator``) as the attribute ``base_iterator``. Both are read from the instance's
  ``__dict__``, so asking never creates one. Main's ``close()`` looks for a third name and so
  leaves it, and its workers, running: :func:`close` closes it.
* **its pipeline**: the reading iterator (``_ElasticMapDatasetIterator``) builds the sliced,
  batched, prefetched pipeline on its first ``next`` as the cached property ``_iterator``.
* **its position**: ``_global_next_index``, the field its public state reports as
  ``global_next_index``.
"""

from __future__ import annotations

from typing import Any

from elastic_dew._compat import Private

__all__ = ["PRIVATE", "READING_ITERATOR", "GRAIN_VERSION_READ", "READER_ATTRIBUTES", "PIPELINE", "POSITION", "reader", "pipeline",
           "rewind", "close"]

#: The Grain release this module was read against.
GRAIN_VERSION_READ = "0.2.18"
#: Where each Grain API keeps the reading iterator: the release's name, then main's.
READER_ATTRIBUTES = ("_default_iterator", "base_iterator")
#: The reading iterator's cached pipeline.
PIPELINE = "_iterator"
#: The reading iterator's position field.
POSITION = "_global_next_index"


_MODULE = "grain._src.python.dataset.elastic_iterator"
_INSTEAD = ("ElasticIterator.set_state that keeps the running pipeline and its workers, and a "
            "close() that closes the iterator it reads through")
#: The reading iterator's class, built with ``ElasticIterator``'s own arguments (a test's
#: stand-in for Grain's next ``ElasticIterator`` reads through one).
READING_ITERATOR = Private(
    "grain",
    f"{_MODULE}:_ElasticMapDatasetIterator",
    why="the reading iterator's class (Grain's private helper), whose pipeline and "
    "position a rewind sets",
    instead=_INSTEAD,
    params=("read_options", "multiprocessing_options"),
)
#: Each private name of the supported release (0.2.18); main's ``base_iterator`` is public.
PRIVATE: tuple[Private, ...] = (
    Private(
        "grain",
        f"{_MODULE}:ElasticIterator.{READER_ATTRIBUTES[0]}",
        why="the iterator an ElasticIterator reads through (a cached property): closed with "
        "its workers, and holding the pipeline a rewind sets",
        instead=_INSTEAD,
    ),
    READING_ITERATOR,
    Private(
        "grain",
        f"{_MODULE}:_ElasticMapDatasetIterator.{PIPELINE}",
        why="the reading iterator's running pipeline (a cached property), whose own "
        "get_state/set_state rewind it without restarting its workers",
        instead=_INSTEAD,
    ),
    Private(
        "grain",
        f"{_MODULE}:_ElasticMapDatasetIterator.{POSITION}",
        why="the position the public state reports as global_next_index, set with the "
        "pipeline's state, since the public set_state drops the pipeline and its workers",
        instead=_INSTEAD,
        probe=lambda: _reading_iterator(),
    ),
)


def _reading_iterator() -> Any:
    """One reading iterator over a tiny dataset, for the canary."""
    import grain

    iterator = grain.experimental.ElasticIterator(
        grain.MapDataset.range(8), 2, grain.sharding.ShardOptions(shard_index=0, shard_count=1)
    )
    return getattr(iterator, READER_ATTRIBUTES[0])


def reader(iterator: Any) -> Any:
    """The iterator an ``ElasticIterator`` reads through, or ``None`` before its first use."""
    state = vars(iterator)
    for name in READER_ATTRIBUTES:
        if name in state:
            return state[name]
    return None


def pipeline(iterator: Any) -> Any:
    """The reading iterator's running pipeline, or ``None`` before the first batch was read."""
    base = reader(iterator)
    return None if base is None else vars(base).get(PIPELINE)


def rewind(iterator: Any, pipeline_state: Any, position: int) -> bool:
    """Set the running pipeline to ``pipeline_state`` (its own earlier ``get_state()``) and the
    position to ``position``, keeping its workers; whether there was a pipeline to set."""
    running = pipeline(iterator)
    if running is None:
        return False
    running.set_state(pipeline_state)
    setattr(reader(iterator), POSITION, position)
    return True


def close(iterator: Any) -> None:
    """Close an ``ElasticIterator`` and the iterator under it, whichever Grain API it is."""
    iterator.close()
    base = reader(iterator)
    if base is not None:
        base.close()
