"""The Orbax adapter: the installed Snapshotter still has the private members it relies on.

``elastic_dew.elastic.orbax_snapshotter`` is the one module that reaches into Orbax's
experimental ``Snapshotter``. When an Orbax release renames or reshapes one of those
members, these tests fail with the member's name instead of a training run failing later.
"""

from __future__ import annotations

import inspect
import queue

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter

from elastic_dew.elastic import orbax_snapshotter as adapter


@pytest.mark.parametrize("name", sorted(adapter.METHODS))
def test_every_snapshotter_method_the_adapter_calls_exists_with_its_parameters(name):
    method = getattr(Snapshotter, name, None)
    assert callable(method), f"Snapshotter.{name} is gone; update elastic_dew/elastic/orbax_snapshotter.py"
    params = list(inspect.signature(method).parameters)[1:]
    expected = list(adapter.METHODS[name])
    assert params[: len(expected)] == expected, (
        f"Snapshotter.{name} now takes {params}, the adapter expects {expected} first"
    )


def test_the_snapshotter_still_has_the_private_attributes_the_adapter_reads():
    fresh = Snapshotter(replica_axis_index=0)
    for name in adapter.ATTRIBUTES:
        assert hasattr(fresh, name), f"Snapshotter.{name} is gone; update the adapter"
    assert isinstance(fresh._queue, queue.Queue) and fresh._queue.maxsize == 1, "Snapshotter._queue changed"
    assert hasattr(fresh._lock, "acquire") and hasattr(fresh._lock, "release"), "Snapshotter._lock changed"
    assert fresh._latest_snapshot is None, "Snapshotter._latest_snapshot no longer starts as None"
    assert isinstance(inspect.getattr_static(Snapshotter, "latest"), property), "Snapshotter.latest changed"
    assert adapter.class_incompatibilities() == []
    assert adapter.instance_incompatibilities(fresh) == []


def test_a_changed_member_is_named_by_the_compatibility_check():
    class Renamed(Snapshotter):
        _to_snapshot_state = None

    assert any("_to_snapshot_state" in p for p in adapter.class_incompatibilities(Renamed))

    class Broken:
        _queue = queue.Queue(maxsize=3)
        _lock = None

    problems = adapter.instance_incompatibilities(Broken())
    assert any("_latest_snapshot is gone" in p for p in problems), problems
    assert any("_lock is a NoneType" in p for p in problems), problems
    assert any("_queue holds 3" in p for p in problems), problems


def test_a_taken_save_lands_as_replica_trees_and_step_and_can_be_dropped():
    """The behaviour behind the private reads: ``took``, ``busy``, ``newest`` and ``drop``."""
    devices = jax.devices()[:2]
    mesh = Mesh([[d] for d in devices], ("replica", "data"))
    weights = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, PartitionSpec()))
    snapshotter = adapter.HostSnapshotter(replica_axis_index=0)
    assert snapshotter.newest() is None
    assert snapshotter.offer(3, {"weights": weights, "meta": "{}"}) is True
    snapshotter.join()
    assert not snapshotter.busy()
    trees, step = snapshotter.newest()
    assert step == 3 and len(trees) == len(devices) and trees[0]["meta"] == "{}"
    snapshotter.drop()
    assert snapshotter.newest() is None and snapshotter.latest is None
