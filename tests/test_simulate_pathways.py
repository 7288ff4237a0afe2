"""Pathways-shaped devices and backend under the simulator, as code nobody here wrote reads them.

TPU slices and a Pathways backend cannot exist here; :class:`SimulatedSlices` stands in for
them on the test process's 8 CPU devices (conftest). What is read is real: JAX's
``mesh_utils.create_hybrid_device_mesh``, Orbax's Pathways worker grouping and backend test,
pathwaysutils' backend test and ``Manager``.
"""

from __future__ import annotations

import jax
import numpy as np
import pathwaysutils
import pytest
from jax.experimental import mesh_utils
from orbax.checkpoint import utils as ocp_utils
from pathwaysutils.elastic import manager

from elastic_dew._compat import orbax as orbax_private
from elastic_dew.simulate import SimulatedSlices

from private_names import ORBAX_WORKER_GROUPS

pytestmark = pytest.mark.libraries  # the simulator's patches over pathwaysutils and Orbax


def test_every_simulated_device_carries_its_slice_index_and_the_rest_carry_none():
    with SimulatedSlices(3, 2) as sim:
        assert [d.slice_index for d in sim.devices] == [0, 0, 1, 1, 2, 2]
        outside = [d for d in jax.devices() if d not in sim.devices]
        assert outside and all(d.slice_index is None for d in outside)
    assert not hasattr(jax.devices()[0], "slice_index")


def test_code_that_groups_devices_by_slice_index_itself_sees_the_simulated_slices():
    with SimulatedSlices(2, 2) as sim:
        by_slice: dict[int, list] = {}
        for device in jax.devices():
            by_slice.setdefault(getattr(device, "slice_index", 0), []).append(device)
        assert {k: v for k, v in by_slice.items() if k is not None} == sim.slice_to_devices
        mesh = mesh_utils.create_hybrid_device_mesh((1, 2), (2, 1), devices=sim.devices)
        assert [[d.slice_index for d in row] for row in mesh] == [[0, 0], [1, 1]]


def test_orbax_groups_pathways_workers_by_simulated_slice():
    with SimulatedSlices(4, 2) as sim:
        workers = ORBAX_WORKER_GROUPS.get()(sim.devices)
    assert sorted(workers) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert [workers[(0, i)] for i in range(4)] == [sim.slice_to_devices[i] for i in range(4)]


def test_the_pathways_backend_tests_answer_true_inside_the_simulator_and_false_after():
    tests = {
        "pathwaysutils.is_pathways_backend_used": lambda: pathwaysutils.is_pathways_backend_used(),
        "multihost.is_pathways_backend": lambda: orbax_private.pathways_backend_bindings()[0].is_pathways_backend(),
        "orbax.checkpoint.utils.is_pathways_backend": lambda: ocp_utils.is_pathways_backend(),
        "orbax_private.is_pathways_backend": orbax_private.is_pathways_backend,
    }
    with SimulatedSlices(2, 2):
        assert {name: bool(test()) for name, test in tests.items()} == dict.fromkeys(tests, True)
        assert orbax_private.pathways_incompatibilities() == []
    assert {name: bool(test()) for name, test in tests.items()} == dict.fromkeys(tests, False)
    assert orbax_private.pathways_incompatibilities() == []


def test_a_manager_made_with_no_arguments_leaves_out_devices_outside_every_slice():
    with SimulatedSlices(2, 2) as sim:
        elastic_manager = manager.Manager()
        assert elastic_manager.slice_to_devices == sim.slice_to_devices
        assert elastic_manager.active_slice_indices == {0, 1}
        assert elastic_manager.total_slice_count == 2


@pytest.mark.parametrize("binding", orbax_private.PATHWAYS_BACKEND_BINDINGS)
def test_a_lost_binding_of_orbaxs_pathways_backend_test_is_named(binding, monkeypatch):
    module = dict(zip(orbax_private.PATHWAYS_BACKEND_BINDINGS, orbax_private.pathways_backend_bindings()))[binding]
    monkeypatch.setattr(module, "is_pathways_backend", None)
    problems = orbax_private.pathways_incompatibilities()
    assert len(problems) == 1 and binding.rsplit(".", 1)[-1] in problems[0]
