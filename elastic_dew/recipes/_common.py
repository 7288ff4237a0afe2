"""What the recipes share: turning ``build(**overrides)`` into a checked, frozen configuration."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["make_config"]

C = TypeVar("C", bound="DataclassInstance")


def make_config(cls: type[C], overrides: dict[str, Any], recipe: str) -> C:
    """``cls(**overrides)``, refusing an unknown setting with the list of known ones."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(
            f"the {recipe} recipe has no setting {', '.join(unknown)}; its settings are {', '.join(known)}"
        )
    return cls(**overrides)
