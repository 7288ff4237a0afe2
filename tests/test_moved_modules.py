"""Modules and names moved by the elastic layer's split keep their old paths for one minor version."""

from __future__ import annotations

import importlib

import pytest

#: (old module, name) -> the module that now holds the name
MOVED_NAMES = {
    ("elastic_dew.rundir", "committed"): "elastic_dew.elastic.state.orbax_step",
    ("elastic_dew.rundir", "committed_checkpoint_steps"): "elastic_dew.elastic.state.orbax_step",
    ("elastic_dew.simulate.schedule", "ScheduleRunner"): "elastic_dew.simulate.runner",
}


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
