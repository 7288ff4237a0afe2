"""The recipe registry: recipes found by name (``lm`` is ``elastic_dew.recipes.lm``) or by module path,
loaded at run time, never imported by the run (recipes sit above it and call it)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType
from typing import Any

from elastic_dew.run.exits import UsageError

__all__ = ["available_recipes", "load_recipe", "recipe_defaults"]


def available_recipes() -> list[str]:
    """The recipe names shipped in the ``recipes`` package (found by name, not imported:
    recipes sit above this module and call it).

    Returns:
        The recipe names, sorted.
    """
    spec = importlib.util.find_spec("elastic_dew.recipes")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted(
        info.name
        for info in pkgutil.iter_modules(locations)
        if not info.name.startswith("_") and not info.ispkg
    )


def _module_name(recipe: str) -> str:
    return recipe if "." in recipe else f"elastic_dew.recipes.{recipe}"


def load_recipe(recipe: str) -> ModuleType:
    """The recipe's module (``lm`` is ``elastic_dew.recipes.lm``), which must have ``build()``.

    Args:
        recipe: a shipped recipe's name, or a module path (``mypkg.myrecipe``).

    Returns:
        The recipe's module.

    Raises:
        UsageError: no such module, or it has no ``build()``.
    """
    name = _module_name(recipe)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise UsageError(
            f"unknown recipe {recipe!r}; the recipes are {', '.join(available_recipes())}, "
            "or give a module path whose module has build() (mypkg.myrecipe)"
        )
    module = importlib.import_module(name)
    if not callable(getattr(module, "build", None)):
        raise UsageError(
            f"recipe module {name} has no build(**overrides) function returning "
            "dict(init=..., loss=..., optimizer=..., dataset=...)"
        )
    return module


def recipe_defaults(recipe: str) -> dict[str, Any]:
    """The recipe's own defaults (its module's ``DEFAULTS``: ``steps``, ``global_batch``).

    Args:
        recipe: as :func:`load_recipe`'s.

    Returns:
        The defaults (empty when the recipe has none).

    Raises:
        UsageError: an unknown recipe.
    """
    return dict(getattr(load_recipe(recipe), "DEFAULTS", {}))
