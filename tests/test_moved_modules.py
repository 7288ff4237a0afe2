"""Modules and names moved by the elastic layer's split keep their old paths for one minor version."""

from __future__ import annotations

import importlib

import pytest

#: Every module of ``elastic_dew/elastic/`` with a public ``__all__`` before the split (62e5786)
#: that moved: old path -> (the module that now holds its names, one old name, its name there).
#: ``orbax_private`` and ``grain_private`` said they were private and went to ``_compat``.
MOVED = {
    "elastic_dew.elastic.checkpoint_backend": ("elastic_dew.elastic.state.backend", "Backend", "Backend"),
    "elastic_dew.elastic.checkpoint_multi_tier": ("elastic_dew.elastic.state.multi_tier", "MultiTierBackend", "MultiTierBackend"),
    "elastic_dew.elastic.checkpoint_orbax": ("elastic_dew.elastic.state.orbax_backend", "OrbaxBackend", "OrbaxBackend"),
    "elastic_dew.elastic.checkpoint_warmup": ("elastic_dew.elastic.state.save_precompiler", "SaveWarmup", "SavePrecompiler"),
    "elastic_dew.elastic.checkpoints": ("elastic_dew.elastic.state.checkpoints", "Checkpoints", "Checkpoints"),
    "elastic_dew.elastic.compiler": ("elastic_dew.elastic.loop.compiler", "StepCompiler", "StepCompiler"),
    "elastic_dew.elastic.data": ("elastic_dew.elastic.loop.data", "default_read_options", "default_read_options"),
    "elastic_dew.elastic.evaluation": ("elastic_dew.elastic.loop.evaluation", "Evaluation", "Evaluation"),
    "elastic_dew.elastic.health": ("elastic_dew.elastic.slices.health", "ReusableSliceHealthChecker", "ReusableSliceHealthChecker"),
    "elastic_dew.elastic.meta": ("elastic_dew.elastic.state.meta", "meta_json", "meta_json"),
    "elastic_dew.elastic.packing": ("elastic_dew.elastic.state.packing", "make_packer", "make_packer"),
    "elastic_dew.elastic.persistence": ("elastic_dew.elastic.state.persistence", "checkpoint_dir_problem", "checkpoint_dir_problem"),
    "elastic_dew.elastic.protocol": ("elastic_dew.elastic.loop.protocol", "ElasticRun", "ElasticRun"),
    "elastic_dew.elastic.recovery": ("elastic_dew.elastic.loop.recovery", "RecoveryTimer", "RecoveryTimer"),
    "elastic_dew.elastic.retry": ("elastic_dew.elastic.slices.retry", "make_manager", "make_manager"),
    "elastic_dew.elastic.sharding": ("elastic_dew.elastic.slices.sharding", "with_model_rule", "with_model_rule"),
    "elastic_dew.elastic.slice_loss_log": ("elastic_dew.elastic.slices.loss_log", "HandledSliceLossFilter", "HandledSliceLossFilter"),
    "elastic_dew.elastic.slices": ("elastic_dew.elastic.slices.mesh", "build_mesh", "build_mesh"),
    "elastic_dew.elastic.snapshots": ("elastic_dew.elastic.state.snapshots", "Snapshots", "Snapshots"),
    "elastic_dew.elastic.state": ("elastic_dew.elastic.state.checkpoints", "Checkpoints", "Checkpoints"),
    "elastic_dew.elastic.tiers": ("elastic_dew.elastic.state.tiers", "Tiers", "Tiers"),
}

#: (old module, name) -> the module that now holds the name
MOVED_NAMES = {
    ("elastic_dew.rundir", "committed"): "elastic_dew.elastic.state.orbax_step",
    ("elastic_dew.rundir", "committed_checkpoint_steps"): "elastic_dew.elastic.state.orbax_step",
    ("elastic_dew.k8s.render", "priority_class"): "elastic_dew.k8s.cluster",
    ("elastic_dew.k8s.render", "checkpoint_configuration"): "elastic_dew.k8s.cluster",
    ("elastic_dew.k8s.render", "jobset_comments"): "elastic_dew.k8s.comments",
    ("elastic_dew.k8s.render", "JOBSET_COMMENTS"): "elastic_dew.k8s.comments",
    ("elastic_dew.k8s.render", "dump"): "elastic_dew.k8s.yaml_text",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_serves_the_same_object_with_a_warning_naming_the_new_one(old):
    new, name, new_name = MOVED[old]
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} is deprecated .* use {new}.{new_name}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), new_name)


def test_every_old_path_served_is_one_this_test_checks():
    from elastic_dew.elastic import _moved

    assert set(_moved.MOVED) <= set(MOVED)


def test_the_newest_state_rule_is_still_where_it_was_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from elastic_dew.elastic.state import newest
    assert newest(None, None) == ("fresh", None)


@pytest.mark.parametrize(("old", "name"), sorted(MOVED_NAMES))
def test_a_moved_name_is_served_from_its_old_module_with_a_warning_naming_its_new_one(old, name):
    new = MOVED_NAMES[old, name]
    with pytest.warns(DeprecationWarning, match=f"{old}.{name} is deprecated .* use {new}.{name}"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)


def test_the_slices_package_keeps_its_submodules_and_serves_only_the_old_modules_public_names():
    slices = importlib.import_module("elastic_dew.elastic.slices")
    from elastic_dew.elastic.slices import health  # a submodule, never shadowed

    assert health.__name__ == "elastic_dew.elastic.slices.health"
    with pytest.raises(AttributeError, match="no attribute 'np'"):
        slices.np


#: (class, old method) -> new method, for the warm-up words renamed to "precompile"
RENAMED_METHODS = {
    ("Tiers", "prepare"): "precompile_saves",
    ("Tiers", "precompile"): "precompile_resume",
    ("Snapshots", "prepare"): "precompile_saves",
    ("Snapshots", "precompile"): "precompile_resume",
    ("Checkpoints", "prepare"): "precompile_saves",
    ("Checkpoints", "prepared"): "saves_precompiled",
    ("Checkpoints", "stop_preparing"): "stop_precompiling",
    ("Checkpoints", "settle"): "wait_or_abandon",
}


@pytest.mark.parametrize(("owner", "old"), sorted(RENAMED_METHODS))
def test_a_renamed_method_is_its_new_one_under_the_old_name(owner, old):
    home = {"Tiers": "state.tiers", "Snapshots": "state.snapshots", "Checkpoints": "state.checkpoints"}[owner]
    cls = getattr(importlib.import_module(f"elastic_dew.elastic.{home}"), owner)
    new = RENAMED_METHODS[owner, old]
    assert getattr(cls, old).__wrapped__ is getattr(cls, new)
    assert getattr(cls, old).__doc__.startswith(f"Deprecated: use :meth:`{new}`")


def test_a_renamed_method_warns_naming_the_new_one_and_forwards_its_arguments_and_result():
    from elastic_dew._deprecation import renamed_method

    class Owner:
        def new(self, a, *, b=0):
            return (self, a, b)

        old = renamed_method("Owner", "old", new)

    owner = Owner()
    with pytest.warns(DeprecationWarning, match=r"Owner\.old is deprecated .* use Owner\.new"):
        assert owner.old(1, b=2) == (owner, 1, 2)


def test_the_step_compilers_old_pause_warns_and_pauses(tmp_path):
    from elastic_dew.elastic import ElasticConfig
    from elastic_dew.elastic.loop.compiler import StepCompiler

    compiler = StepCompiler(program=None, manager=None, config=ElasticConfig(checkpoint_dir=str(tmp_path)))
    with pytest.warns(DeprecationWarning, match=r"StepCompiler\.hold is deprecated .* use StepCompiler\.pause_precompiling"):
        compiler.hold()
    assert not compiler._go.is_set()
    with pytest.warns(DeprecationWarning, match=r"StepCompiler\.allow_precompiling is deprecated"):
        compiler.allow_precompiling()


def test_the_simulators_step_program_keyword_and_attribute_are_step_function_with_a_warning():
    from elastic_dew.simulate import SimulatedSlices

    with pytest.warns(DeprecationWarning, match=r"SimulatedSlices\(step_program=\.\.\.\) is deprecated .* use SimulatedSlices\(step_function=\.\.\.\)"):
        sim = SimulatedSlices(2, 2, step_program="train_step")
    assert sim.step_function == "train_step"
    with pytest.warns(DeprecationWarning, match=r"SimulatedSlices\.step_program is deprecated .* use SimulatedSlices\.step_function"):
        assert sim.step_program == "train_step"
