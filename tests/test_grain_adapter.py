"""The Grain adapter: the installed Grain still has the private members ``ElasticData`` relies on.

``elastic_dew._compat.grain`` is the one module that reaches into Grain's internals
(the iterator ``ElasticIterator`` reads through, its pipeline and its position field). When a
Grain release renames or reshapes one of them, these tests fail with the member's name
instead of a rewind silently restarting worker processes, or a close leaking them.
"""

from __future__ import annotations

import pathlib
import re

import grain
import pytest

from elastic_dew._compat import grain as adapter

pytestmark = pytest.mark.libraries  # Grain's private members, through the seam


def _iterator(global_batch=4):
    return grain.experimental.ElasticIterator(
        grain.MapDataset.range(64), global_batch, grain.sharding.ShardOptions(shard_index=0, shard_count=1)
    )


def test_the_reading_iterator_its_pipeline_and_its_position_are_where_the_adapter_reads_them():
    iterator = _iterator()
    assert adapter.reader(iterator) is None and adapter.pipeline(iterator) is None  # asking creates nothing
    first = next(iterator)
    base = adapter.reader(iterator)
    assert base is not None, f"ElasticIterator keeps its reader under none of {adapter.READER_ATTRIBUTES}"
    running = adapter.pipeline(iterator)
    assert running is not None, f"the reader's pipeline is no longer its cached {adapter.PIPELINE!r}"
    assert getattr(base, adapter.POSITION, None) == 4, f"the reader's position is no longer {adapter.POSITION!r}"
    assert list(first) == [0, 1, 2, 3]


def test_a_rewind_sets_grains_own_pipeline_state_and_position_and_reads_the_same_batches_again():
    iterator = _iterator()
    next(iterator)
    saved = adapter.pipeline(iterator).get_state()
    want = [list(next(iterator)) for _ in range(2)]
    running = adapter.pipeline(iterator)
    assert adapter.rewind(iterator, saved, 4)
    assert adapter.pipeline(iterator) is running  # the same pipeline (and so the same workers)
    assert [list(next(iterator)) for _ in range(2)] == want
    assert iterator.get_state() == {"global_next_index": 12}


def test_a_rewind_before_the_first_batch_says_it_could_not():
    assert not adapter.rewind(_iterator(), {}, 0)


def test_no_other_module_of_elastic_dew_names_grains_private_members():
    package = pathlib.Path(adapter.__file__).parents[1]
    names = (*adapter.READER_ATTRIBUTES, adapter.POSITION)
    pattern = re.compile(r"grain\._src|" + "|".join(re.escape(n) + r"\b" for n in names))
    offenders = [
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if path != pathlib.Path(adapter.__file__) and pattern.search(path.read_text())
    ]
    assert offenders == [], f"{offenders} reach into Grain's internals; go through elastic_dew/_compat/grain.py"
