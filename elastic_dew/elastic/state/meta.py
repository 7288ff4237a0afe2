"""The JSON companions of a saved state (step, data position, ...), for both tiers.

Both tiers store the non-array part of a state as JSON, never as a pickle, so nothing in a
snapshot or checkpoint can execute code when it is read back.
"""

from __future__ import annotations

import json

__all__ = ["MetaError", "meta_json"]


class MetaError(ValueError):
    """A state's ``meta`` a tier cannot carry (not a dict, not JSON, more bytes than the
    multi-tier kind holds): the caller's to fix, never a storage failure, so a save raises
    it instead of abandoning the checkpoint as it does a storage error."""


def meta_json(meta: dict, what: str) -> str:
    """``meta`` as canonical JSON, or a :class:`MetaError` naming ``what`` (the tier) and the fix."""
    if not isinstance(meta, dict):
        raise MetaError(f"{what} meta must be a dict, got {type(meta).__name__}")
    try:
        return json.dumps(meta, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise MetaError(
            f"{what} meta must be JSON-serialisable (ints, floats, strings, lists, dicts): "
            f"{error}; convert such values before saving"
        ) from error
