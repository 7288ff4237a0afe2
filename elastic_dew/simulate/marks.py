"""The simulator's marks on arrays: whose data a lost slice took, and which results wait on
a hung one.

Arrays are never tracked by ``id()`` (Python reuses ids; pathwaysutils' own test mock does,
and misreports healthy slices and fresh arrays). A mark is an attribute on the array object
itself, tagged with the token of the :class:`Marks` that set it, so a mark an earlier
simulator left on a long-lived array never counts for a later one. An array type without a
``__dict__`` cannot carry a mark; the device rule (an array on a lost slice fails) still
holds for it.
"""

from __future__ import annotations

import logging
from typing import Any

from elastic_dew.simulate.pathways_guards import live_arrays

__all__ = ["LOST", "HUNG", "Marks"]

logger = logging.getLogger(__name__)

#: The mark of an array whose data was on a lost slice: the loss's error code.
LOST = "_elastic_dew_simulated_loss"
#: The mark of a result that waits on a hung slice: that slice's index.
HUNG = "_elastic_dew_simulated_hang"


def _on(array: Any, device_ids: frozenset[int]) -> bool:
    return any(device.id in device_ids for device in array.sharding.device_set)


class Marks:
    """One simulator's marks (:data:`LOST`, :data:`HUNG`) on the arrays it touched."""

    def __init__(self) -> None:
        self._token = object()

    def set(self, array: Any, name: str, value: Any) -> None:
        """Mark ``array`` with ``name`` (``value`` ``None`` clears it)."""
        try:
            setattr(array, name, (self._token, value))
        except AttributeError:  # an array type without a __dict__: the device rule still holds
            logger.debug("cannot mark %s", type(array).__name__)

    def of(self, array: Any, name: str) -> Any:
        """``array``'s ``name`` mark set by these marks, or ``None``."""
        mark = getattr(array, name, None)
        return mark[1] if mark is not None and mark[0] is self._token else None

    def lose_live(self, device_ids: frozenset[int], code: str) -> int:
        """Every live array on ``device_ids`` loses its data (with ``code``, unless it already
        had); how many live arrays are on them."""
        marked = 0
        for array in live_arrays():
            if _on(array, device_ids):
                if self.of(array, LOST) is None:
                    self.set(array, LOST, code)
                marked += 1
        return marked

    def hang_live(self, device_ids: frozenset[int], index: int) -> int:
        """Every live device-memory array on ``device_ids`` waits on hung slice ``index`` (host
        memory has no computation in flight: it fails at once instead); how many."""
        marked = 0
        for array in live_arrays():
            if _on(array, device_ids) and array.sharding.memory_kind != "pinned_host":
                self.set(array, HUNG, index)
                marked += 1
        return marked

    def clear_hung(self, index: int) -> int:
        """No live array waits on slice ``index`` any more (it woke); how many did."""
        cleared = 0
        for array in live_arrays():
            if self.of(array, HUNG) == index:
                self.set(array, HUNG, None)
                cleared += 1
        return cleared

    def inherit(self, parent: Any, child: Any) -> None:
        """A shard or a copy (``child``) of an array whose data is lost or hung is too."""
        for name in (LOST, HUNG):
            value = self.of(parent, name)
            if value is not None:
                self.set(child, name, value)

    def derive(self, inputs: list[Any], outputs: list[Any]) -> None:
        """Results computed from a hung slice's results are hung too (they wait on them)."""
        hung = next((h for h in (self.of(a, HUNG) for a in inputs) if h is not None), None)
        if hung is not None:
            for output in outputs:
                self.set(output, HUNG, hung)
