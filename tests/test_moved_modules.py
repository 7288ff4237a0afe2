"""Modules and names moved by the elastic layer's split keep their old paths for one minor version."""

from __future__ import annotations

import importlib

import pytest

#: old module path -> the module that now holds its names, and one name users read there
MOVED = {
    "elastic_dew.elastic.sharding": ("elastic_dew.elastic.slices.sharding", "with_model_rule"),
    "elastic_dew.elastic.health": ("elastic_dew.elastic.slices.health", "ReusableSliceHealthChecker"),
    "elastic_dew.elastic.persistence": ("elastic_dew.elastic.state.persistence", "checkpoint_dir_problem"),
    "elastic_dew.elastic.protocol": ("elastic_dew.elastic.loop.protocol", "ElasticRun"),
    "elastic_dew.elastic.data": ("elastic_dew.elastic.loop.data", "default_read_options"),
    "elastic_dew.elastic.slices": ("elastic_dew.elastic.slices.mesh", "build_mesh"),
}

#: (old module, name) -> the module that now holds the name
MOVED_NAMES = {
    ("elastic_dew.rundir", "committed"): "elastic_dew.elastic.state.orbax_step",
    ("elastic_dew.rundir", "committed_checkpoint_steps"): "elastic_dew.elastic.state.orbax_step",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_serves_the_same_object_with_a_warning_naming_the_new_one(old):
    new, name = MOVED[old]
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{name}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize(("old", "name"), sorted(MOVED_NAMES))
def test_a_moved_name_is_served_from_its_old_module_with_a_warning_naming_its_new_one(old, name):
    new = MOVED_NAMES[old, name]
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{name}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


def test_the_slices_package_keeps_its_submodules_and_serves_only_the_old_modules_public_names():
    slices = importlib.import_module("elastic_dew.elastic.slices")
    from elastic_dew.elastic.slices import health  # a submodule, never shadowed

    assert health.__name__ == "elastic_dew.elastic.slices.health"
    with pytest.raises(AttributeError, match="no attribute 'np'"):
        slices.np
