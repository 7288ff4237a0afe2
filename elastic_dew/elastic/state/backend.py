"""The one protocol both persistent checkpoint backends implement, and what they share.

:class:`~elastic_dew.elastic.state.checkpoints.Checkpoints` checks its arguments, encodes the
meta and skips steps already committed; a :class:`Backend` stores and restores. The two
backends are :class:`~elastic_dew.elastic.state.orbax_backend.OrbaxBackend` (an Orbax
``CheckpointManager`` on a directory or bucket) and
:class:`~elastic_dew.elastic.state.multi_tier.MultiTierBackend` (the guide's
``ReplicatorCheckpointManager`` over colocated Python).

Typed PRNG keys are stored as their key data by both (Orbax's array handlers need plain
dtypes): :func:`unwrap_keys` before a save, :func:`abstract_key_data` for a restore target,
:func:`rewrap_keys` after it.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from jax.sharding import Mesh

from elastic_dew.elastic.state.packing import is_key

__all__ = ["Backend", "unwrap_keys", "abstract_key_data", "rewrap_keys"]


class Backend(Protocol):
    """A kind of persistent checkpoint storage, as :class:`Checkpoints` drives it.

    ``save`` starts an asynchronous save of a step not yet committed; ``wait`` commits it
    (raising if it failed); ``latest_step`` is the newest committed step; ``restore``
    returns ``(state, meta)`` of a committed step on ``abstract_state``'s shardings or
    raises ``ValueError`` saying why it cannot. ``on_active_slices_changed`` tells the backend the active
    devices and mesh (every attempt and scale-up); ``on_slice_lost`` tells it a slice was lost, so
    anything bound to the old devices must be forgotten without being called. ``precompile_saves``,
    ``saves_precompiled`` and ``stop_precompiling`` precompile a layout's first save off the
    training loop, where the backend has such work. ``close`` waits for the last save and releases
    the backend. ``committed_steps`` lists the committed steps; ``saving`` says, without
    waiting, whether a save is still being written; ``abandon`` forgets a save given up on
    (and whatever it holds) without waiting for it, so the next call starts afresh (closing
    what it held first when ``close``: a failed save whose writers ended);
    ``quarantine`` moves a damaged committed step aside (never deleting it) and returns
    where it went, or raises ``NotImplementedError`` where the backend cannot.
    """

    directory: str

    def latest_step(self) -> int | None: ...

    def committed_steps(self) -> list[int]: ...

    def saving(self) -> bool: ...

    def abandon(self, close: bool = False) -> None: ...

    def quarantine(self, step: int) -> str: ...

    def save(self, step: int, state: Any, meta_json: str, force: bool) -> None: ...

    def wait(self) -> None: ...

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]: ...

    def on_active_slices_changed(self, devices: list[jax.Device], mesh: Mesh) -> None: ...

    def on_slice_lost(self) -> None: ...

    def precompile_saves(self, state: Any) -> None: ...

    def saves_precompiled(self, timeout: float | None) -> bool: ...

    def stop_precompiling(self) -> None: ...

    def close(self) -> None: ...


def _is_key(x: Any) -> bool:
    """Whether ``x`` is an array of typed PRNG keys (the one rule: :func:`packing.is_key`)."""
    return hasattr(x, "dtype") and is_key(x.dtype)


def unwrap_keys(state: Any) -> Any:
    """``state`` with every typed PRNG key replaced by its key data."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, state)


def abstract_key_data(abstract: Any) -> Any:
    """``abstract`` with every typed-key leaf replaced by its key data's shape and dtype."""

    def convert(x: Any) -> Any:
        if not _is_key(x):
            return x
        shape = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(x.shape, x.dtype))
        return jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=x.sharding)

    return jax.tree.map(convert, abstract)


def rewrap_keys(restored: Any, abstract: Any) -> Any:
    """Typed keys again where ``abstract`` has them (a key's dtype names its implementation)."""
    return jax.tree.map(
        lambda x, a: jax.random.wrap_key_data(x, dtype=a.dtype) if _is_key(a) and not _is_key(x) else x,
        restored,
        abstract,
    )
