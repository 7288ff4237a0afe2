"""pathwaysutils' ``Manager`` as the elastic layer reads it: :class:`SliceManager`.

The elastic layer never creates its own slice tracker: it takes pathwaysutils' ``Manager``
(:func:`~elastic_dew.elastic.slices.retry.make_manager`, or one the caller made), and reads
only what this protocol names, so the contract between the loop, the mesh, the compiler and
the retry is one declaration. Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any, Protocol

__all__ = ["SliceManager"]


class SliceManager(Protocol):
    """The slices a pathwaysutils ``Manager`` tracks, and its retry: what
    :class:`~elastic_dew.elastic.ElasticRun` (its ``manager=``) and :func:`~elastic_dew.elastic.build_mesh`
    read of one. pathwaysutils' ``Manager`` is one; you never implement it.

    ``slice_to_devices`` maps each slice index to its devices; ``active_slice_indices`` are
    the slices the run uses now (the loop widens it at a scale-up and narrows it when it
    persists a snapshot while stopping); ``available_inactive_slices`` are healthy slices
    not in use (the monitor thread's answer, a scale-up's cue).
    """

    slice_to_devices: Mapping[int, Sequence[Any]]
    available_inactive_slices: Set[int]

    @property
    def total_slice_count(self) -> int:
        """The allocation's slices."""
        ...

    @property
    def active_slice_count(self) -> int:
        """The slices in use now."""
        ...

    @property
    def active_slice_indices(self) -> Set[int]:
        """The indices of the slices in use now."""
        ...

    @active_slice_indices.setter
    def active_slice_indices(self, value: Set[int]) -> None: ...

    def elastic_retry(
        self,
        minimum_slice_count: int | None = None,
        poll_interval: float | int = 10,
        timeout: float | None = None,
        pre_callback: Callable[..., Any] | None = None,
        on_elastic_event_callback: Callable[..., Any] | None = None,
        retry_policy: Any = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """pathwaysutils' retry decorator: re-runs the decorated function after a slice loss,
        once enough slices are healthy.

        Args:
            minimum_slice_count: healthy slices an attempt needs (``None``: every slice).
            poll_interval: seconds between health polls while waiting.
            timeout: seconds to wait for slices, or ``None`` for no bound.
            pre_callback: called before each attempt.
            on_elastic_event_callback: called after a slice loss, before the wait.
            retry_policy: pathwaysutils' policy of how many losses to retry.

        Returns:
            The decorator.
        """
        ...
