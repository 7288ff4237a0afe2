"""The Orbax adapter: the installed Orbax still has the private members elastic_dew relies on.

``elastic_dew._compat.orbax`` is the one module that reaches into Orbax's internals:
the experimental ``Snapshotter``'s members, the replica-parallel slicing of a save and the
Pathways backend test. When an Orbax release renames or reshapes one of those members, these
tests fail with the member's name instead of a training run failing later.
"""

from __future__ import annotations

import inspect
import pathlib
import queue
import re

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from orbax.checkpoint.experimental.v1.training.pathways import Snapshotter

from elastic_dew._compat import orbax as adapter
from elastic_dew._compat import orbax_snapshotter as snapshotter_seam

pytestmark = pytest.mark.libraries  # Orbax's private members, through the seam


@pytest.mark.parametrize("name", sorted(snapshotter_seam.METHODS))
def test_every_snapshotter_method_the_adapter_calls_exists_with_its_parameters(name):
    method = getattr(Snapshotter, name, None)
    assert callable(method), f"Snapshotter.{name} is gone; update elastic_dew/_compat/orbax_snapshotter.py"
    params = list(inspect.signature(method).parameters)[1:]
    expected = list(snapshotter_seam.METHODS[name])
    assert params[: len(expected)] == expected, (
        f"Snapshotter.{name} now takes {params}, the adapter expects {expected} first"
    )


def test_the_snapshotter_still_has_the_private_attributes_the_adapter_reads():
    fresh = Snapshotter(replica_axis_index=0)
    for name in snapshotter_seam.ATTRIBUTES:
        assert hasattr(fresh, name), f"Snapshotter.{name} is gone; update the adapter"
    assert isinstance(fresh._queue, queue.Queue) and fresh._queue.maxsize == 1, "Snapshotter._queue changed"
    assert hasattr(fresh._lock, "acquire") and hasattr(fresh._lock, "release"), "Snapshotter._lock changed"
    assert fresh._latest_snapshot is None, "Snapshotter._latest_snapshot no longer starts as None"
    assert isinstance(inspect.getattr_static(Snapshotter, "latest"), property), "Snapshotter.latest changed"
    assert snapshotter_seam.class_incompatibilities() == []
    assert snapshotter_seam.instance_incompatibilities(fresh) == []


def test_a_changed_member_is_named_by_the_compatibility_check():
    class Renamed(Snapshotter):
        _worker = None

    assert any("_worker" in p for p in snapshotter_seam.class_incompatibilities(Renamed))

    class Broken:
        _queue = queue.Queue(maxsize=3)
        _lock = None

    problems = snapshotter_seam.instance_incompatibilities(Broken())
    assert any("_latest_snapshot is gone" in p for p in problems), problems
    assert any("_lock is a NoneType" in p for p in problems), problems
    assert any("_queue holds 3" in p for p in problems), problems


REPLICAS = 2


def _replicated(values: jax.Array) -> jax.Array:
    """``values`` replicated over a mesh of two replicas of one device each."""
    mesh = Mesh([[d] for d in jax.devices()[:REPLICAS]], ("replica", "data"))
    return jax.device_put(values, NamedSharding(mesh, PartitionSpec()))


def test_a_taken_save_lands_as_replica_trees_and_step_and_can_be_dropped():
    """The behaviour behind the private reads: ``save_or_skip``'s answer, ``busy``, ``newest`` and ``drop``."""
    weights = _replicated(jnp.arange(4.0))
    snapshotter = snapshotter_seam.HostSnapshotter(replica_axis_index=0)
    assert snapshotter.newest() is None
    assert snapshotter.save_or_skip(3, {"weights": weights, "meta": "{}"}) is True
    snapshotter.join()
    assert not snapshotter.busy()
    trees, step = snapshotter.newest()
    assert step == 3 and len(trees) == REPLICAS and trees[0]["meta"] == "{}"
    snapshotter.drop()
    assert snapshotter.newest() is None and snapshotter.latest is None


def test_orbax_replica_slicing_still_has_the_function_types_and_handler_settings_the_adapter_uses():
    replica_slices = adapter.replica_slices_module()
    get = getattr(replica_slices, "get_replica_slices", None)
    assert callable(get), "replica_slices.get_replica_slices is gone; update elastic_dew/_compat/orbax.py"
    params = list(inspect.signature(get).parameters)
    expected = list(adapter.REPLICA_SLICE_PARAMETERS)
    assert params[: len(expected)] == expected, f"get_replica_slices now takes {params}, the adapter expects {expected}"
    assert "replica_slices" in replica_slices.ReplicaSlices.__dataclass_fields__, "ReplicaSlices.replica_slices changed"
    assert callable(replica_slices.ReplicaSlice.data), "ReplicaSlice.data changed"
    handler = ocp.type_handlers.get_type_handler(jax.Array)
    for parameter, attribute in adapter.HANDLER_SETTINGS.items():
        assert hasattr(handler, attribute), f"{type(handler).__name__}.{attribute} (for {parameter}) is gone"
    assert adapter.replica_slicing_incompatibilities() == []


def test_orbax_still_has_the_pathways_backend_test_and_it_is_false_on_cpu():
    multihost = adapter.pathways_backend_bindings()[0]  # where Orbax defines it
    assert callable(getattr(multihost, "is_pathways_backend", None)), "multihost.is_pathways_backend is gone"
    assert adapter.pathways_incompatibilities() == []
    assert adapter.is_pathways_backend() is False
    assert adapter.incompatibilities() == []


def test_a_changed_slicing_member_is_named_by_the_compatibility_check(monkeypatch):
    class Handler:
        _replica_id = 0
        _use_replica_parallel = True

    problems = adapter.replica_slicing_incompatibilities(Handler())
    assert any("Handler._min_slice_bytes_for_replica_parallel is gone" in p for p in problems), problems
    assert any("Handler._max_replicas_for_replica_parallel is gone" in p for p in problems), problems

    class Module:
        def get_replica_slices(arr, replica_id):  # noqa: N805 - stands in for a module function
            return None

    monkeypatch.setattr(adapter, "replica_slices_module", lambda: Module)
    problems = adapter.replica_slicing_incompatibilities()
    assert any("get_replica_slices takes (arr, replica_id)" in p for p in problems), problems
    assert any("ReplicaSlices.replica_slices is gone" in p for p in problems), problems
    assert any("ReplicaSlice.data is gone" in p for p in problems), problems


def test_slicing_a_replicated_array_compiles_and_leaves_the_array_whole():
    weights = _replicated(jnp.arange(4096.0))
    adapter.slice_replicas(weights)
    assert not weights.is_deleted() and float(weights.sum()) == float(jnp.arange(4096.0).sum())


def test_no_other_module_of_elastic_dew_imports_orbax_private_internals():
    """Every ``orbax.checkpoint._src`` and experimental-Snapshotter use lives in the adapter
    (its registry and its Snapshotter module)."""
    package = pathlib.Path(adapter.__file__).parents[1]
    pattern = re.compile(r"orbax\.checkpoint\._src|orbax\.checkpoint\.experimental\.v1")
    seam = {pathlib.Path(adapter.__file__), pathlib.Path(adapter.__file__).with_name("orbax_snapshotter.py")}
    offenders = [
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if path not in seam and pattern.search(path.read_text())
    ]
    assert offenders == [], f"{offenders} reach into Orbax's internals; go through elastic_dew/_compat/orbax.py"
