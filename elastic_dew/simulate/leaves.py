"""The arrays in a state's tree, looking inside Orbax's argument objects (``args.StandardSave``,
``args.Composite``, a dataclass or an object with attributes holding the tree)."""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["arrays_in", "placed_leaves"]


def arrays_in(tree: Any, depth: int = 0) -> list[Any]:
    """The ``jax.Array`` leaves of ``tree``, looking inside Orbax's argument objects (a
    dataclass or an object with attributes holding the tree) too."""
    out: list[Any] = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array):
            out.append(leaf)
        elif depth < 3 and hasattr(leaf, "__dict__") and not isinstance(leaf, type):
            out.extend(arrays_in(list(vars(leaf).values()), depth + 1))
    return out


def _sharding_of(leaf: Any) -> Any:
    """``leaf.sharding``, or None where it has none: Orbax's argument objects
    (``args.Composite``) answer an unknown attribute with a ``KeyError``, not an
    ``AttributeError``."""
    try:
        return getattr(leaf, "sharding", None)
    except KeyError:
        return None


def placed_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` that say where they go: arrays, and abstract leaves
    (``jax.ShapeDtypeStruct``) with a sharding, looking inside Orbax's argument objects."""
    out: list[Any] = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array) or isinstance(_sharding_of(leaf), jax.sharding.Sharding):
            out.append(leaf)
        elif hasattr(leaf, "__dict__") and not isinstance(leaf, type):
            out.extend(a for a in arrays_in(list(vars(leaf).values())))
    return out
