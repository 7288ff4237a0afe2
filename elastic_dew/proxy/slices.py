"""The local Pathways backend's slices, in the fault state machine both boundaries share.

:class:`Slices` keeps the backend's slices in
:class:`~elastic_dew.simulate.slice_states.SliceStates`, the state machine the in-process
simulator keeps its slices in, so a schedule moves both through the same states: lost (a
read of what the slice held, and of what runs on it, fails with the loss's code), hung and
suspended (a read waits), woken and restored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from elastic_dew.proxy.ifrt import DATA_LOSS, DEADLINE_EXCEEDED, INTERNAL, NOT_FOUND, ProxyError

__all__ = ["Slices", "SLICE_DOWN"]

logger = logging.getLogger(__name__)

#: ``tensorflow.error.Code`` of each slice-down code a schedule's ``lose`` takes.
SLICE_DOWN = {"DATA_LOSS": DATA_LOSS, "INTERNAL": INTERNAL, "NOT_FOUND": NOT_FOUND,
              "DEADLINE_EXCEEDED": DEADLINE_EXCEEDED}


class Slices:
    """The backend's slices in the fault state machine both boundaries share
    (:class:`~elastic_dew.simulate.slice_states.SliceStates`, :attr:`states`).

    An array remembers the epochs of the slices it lives on when it was made, and is lost
    when one of them is lost now or its data went since (a loss, or a return from a loss
    or a hang): what a slice held while it was down never comes back. A read of an array
    on a hung slice waits until the slice is lost, restored or woken (:meth:`await_answer`).
    """

    def __init__(self, count: int, devices_per_slice: int):
        from elastic_dew.simulate.slice_states import SliceStates

        self.count, self.devices_per_slice = count, devices_per_slice
        self.states = SliceStates(count)
        self.events: list[tuple[str, int]] = []

    def slice_of(self, device_id: int) -> int:
        return device_id // self.devices_per_slice

    def _check(self, index: int) -> None:
        if not 0 <= index < self.count:
            raise ValueError(f"slice {index} does not exist: the backend has slices 0..{self.count - 1}")

    def _change(self, action: str, index: int, changed: bool) -> None:
        if changed:
            self.events.append((action, index))
            logger.info("slice %d: %s", index, action)

    def lose(self, index: int, code: str = "DATA_LOSS") -> None:
        """Lose slice ``index``: what it holds and what runs on it from now on fails with ``code``."""
        self._check(index)
        self._change("lose", index, self.states.lose(index, code))

    def hang(self, index: int) -> None:
        """Slice ``index`` stops answering: reads of what it holds and computes wait."""
        self._check(index)
        self._change("hang", index, self.states.hang(index))

    def suspend(self, index: int) -> None:
        """Pathways' transparent suspend: reads wait until :meth:`wake`, then complete."""
        self._check(index)
        self._change("suspend", index, self.states.suspend(index))

    def wake(self, index: int) -> None:
        """Slice ``index``'s suspension ends (a slice not suspended is restored)."""
        self._check(index)
        if self.states.wake(index):
            self._change("wake", index, True)
        else:
            self.restore(index)

    def restore(self, index: int) -> None:
        """Give slice ``index`` back: arrays and results made on it from now on are whole."""
        self._check(index)
        self._change("restore", index, self.states.restore(index))

    @property
    def lost(self) -> frozenset[int]:
        """The slices lost or hung now."""
        return self.states.lost

    def epochs(self, device_ids: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The epochs of the slices ``device_ids`` lie on (sorted ``(slice, epoch)`` pairs)."""
        return self.states.epochs_of({self.slice_of(d) for d in device_ids})

    def lost_among(self, epochs: tuple[tuple[int, int], ...]) -> list[int]:
        """The slices of ``epochs`` lost now or whose data went since those epochs."""
        return self.states.gone(epochs)

    def code_of(self, index: int) -> int:
        """The ``tensorflow.error.Code`` a read of slice ``index``'s lost data fails with."""
        return SLICE_DOWN.get(self.states.codes.get(index, "DATA_LOSS"), DATA_LOSS)

    def await_answer(self, epochs: tuple[tuple[int, int], ...]) -> None:
        """Wait while a slice of ``epochs`` is hung (a read of its result).

        Raises:
            ProxyError: DEADLINE_EXCEEDED when the backend stops meanwhile.
        """
        for index, _ in epochs:
            if index in self.states.hung:
                released, _, _ = self.states.await_answer(index)
                if not released:
                    raise ProxyError(DEADLINE_EXCEEDED,
                                     f"slice {index} stopped answering (elastic-dew local Pathways backend)")
