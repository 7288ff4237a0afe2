"""A public name renamed after 0.2.0 keeps working from its old place for one minor version,
with a warning in one wording naming the new one: each shape of ``elastic_dew._deprecation``
(a module's name, a keyword, a method) serves the old spelling and warns."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

from elastic_dew._deprecation import REMOVED_IN, moved_names, renamed_keywords, renamed_method


def _said(old: str, new: str) -> str:
    """The warning's one wording, as a pattern."""
    import re

    return rf"^{re.escape(old)} is deprecated and will be removed in {re.escape(REMOVED_IN)}; use {re.escape(new)}$"


def test_a_moved_name_is_served_from_its_old_module_as_the_same_object_with_a_warning(monkeypatch):
    old = types.ModuleType("old_home")
    old.__getattr__ = moved_names("old_home", {"Dumps": "json.dumps"})  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "old_home", old)
    import json

    with pytest.warns(DeprecationWarning, match=_said("old_home.Dumps", "json.dumps")):
        from old_home import Dumps  # type: ignore[import-not-found]
    assert Dumps is json.dumps
    with pytest.raises(AttributeError, match="module 'old_home' has no attribute 'Nothing'"):
        old.Nothing


def test_a_moved_name_asks_the_modules_own_lazy_names_first_without_a_warning(recwarn):
    def own(name):
        if name != "Own":
            raise AttributeError(name)
        return 1

    serve = moved_names("old_home", {"Old": "json.dumps"}, fallback=own)
    assert serve("Own") == 1
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_a_renamed_keyword_is_taken_as_its_new_name_with_a_warning_and_both_are_refused():
    @renamed_keywords("scale", factor="by")
    def scale(value, *, by=1):
        return value * by

    with pytest.warns(DeprecationWarning, match=_said("scale(factor=...)", "scale(by=...)")):
        assert scale(2, factor=3) == 6
    assert list(inspect.signature(scale).parameters) == ["value", "by"]
    with pytest.raises(TypeError, match="give by= only"):
        scale(2, factor=3, by=3)


def test_a_renamed_method_is_the_new_one_under_the_old_name_with_a_warning():
    class Owner:
        def new(self, a, *, b=0):
            """The new method."""
            return (self, a, b)

        old = renamed_method("Owner", "old", new)

    owner = Owner()
    with pytest.warns(DeprecationWarning, match=_said("Owner.old", "Owner.new")):
        assert owner.old(1, b=2) == (owner, 1, 2)
    assert Owner.old.__doc__.startswith("Deprecated: use :meth:`new`")  # what the API snapshot leaves out
