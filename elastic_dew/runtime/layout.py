"""Which parts of the training state the host owns, and whether the backend allows it.

A :class:`Layout` with ``params`` among the host's parts makes the host hold the
transaction (CPU transaction ownership), which needs a CPU backend beside the accelerator
and one CPU device per local accelerator. Both are settled before the backend opens, so
:func:`~elastic_dew.runtime.prepare_process` checks them, reading configuration only.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys

from elastic_dew.runtime import backend
from elastic_dew.runtime.xla_flags import _CPU_COUNT_FLAG, _flag_name

__all__ = ["Layout"]

_LAYOUT_PARTS = frozenset({"params", "opt_state"})


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which parts of the training state the host owns between steps.

    ``host`` names parts from ``params`` and ``opt_state``. With ``params`` among them the
    host holds the transaction (CPU transaction ownership), which needs a CPU backend
    beside the accelerator and one CPU device per local accelerator; :func:`prepare_process`
    checks both. The same ``Layout`` is passed to the trainer.

    Args:
        host: the state parts the host owns (``params``, ``opt_state``); empty: none.

    Raises:
        ValueError: ``host`` is not a set of parts, or names a part other than those two.
    """

    host: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        host = self.host
        if isinstance(host, str) or not isinstance(host, (set, frozenset, list, tuple)):
            raise ValueError(
                f"Layout.host must be a set of state parts, e.g. frozenset({{'params'}}), "
                f"got {host!r}"
            )
        unknown = sorted(set(host) - _LAYOUT_PARTS)
        if unknown:
            raise ValueError(
                f"Layout.host names unknown state parts {unknown}; "
                f"the parts a host can own are {sorted(_LAYOUT_PARTS)}"
            )
        object.__setattr__(self, "host", frozenset(host))


def _cpu_devices_established(xla_flags: str) -> int | None:
    """How many CPU devices JAX will make, if something set it before this call."""
    value = os.environ.get("JAX_NUM_CPU_DEVICES")
    if value is None and "jax" in sys.modules:
        import jax

        configured = getattr(jax.config, "jax_num_cpu_devices", -1)
        if configured is not None and configured >= 0:
            value = str(configured)
    if value is None:
        for token in shlex.split(xla_flags):
            if _flag_name(token) == _CPU_COUNT_FLAG and "=" in token:
                value = token.split("=", 1)[1]
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _local_accelerators_from_env() -> int | None:
    """The number of local accelerators, where the environment says so before start."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    chips = os.environ.get("TPU_VISIBLE_CHIPS")
    if chips:
        return len([c for c in chips.split(",") if c.strip()])
    return None


def _check_layout(layout: Layout, xla_flags_env: str) -> None:
    """Refuse a host-owned ``params`` layout the backend was not set up for.

    Reads configuration only; it never changes it, before or after the backend started.
    """
    if "params" not in layout.host:
        return
    platforms = backend._platform_list()
    if platforms == ["cpu"]:
        return  # CPU is the accelerator: host memory is device memory
    if platforms and "cpu" not in platforms:
        raise ValueError(
            f"Layout(host=...) includes 'params', so the host owns the transaction and needs "
            f"a CPU backend beside the accelerator, but JAX_PLATFORMS={','.join(platforms)!r} "
            f"excludes CPU. Set JAX_PLATFORMS={','.join(platforms)},cpu before the process starts."
        )
    accelerators: int | None
    cpus: int | None
    if backend._backend_started():
        import jax

        accelerators = jax.local_device_count()
        cpus = len(jax.local_devices(backend="cpu"))
        where = "the started backend has"
    else:
        accelerators = _local_accelerators_from_env()
        cpus = _cpu_devices_established(xla_flags_env)
        where = "the environment establishes"
        if cpus is None:
            raise ValueError(
                "Layout(host=...) includes 'params', which needs one CPU device per local "
                "accelerator, and nothing establishes the CPU device count. Set "
                "JAX_NUM_CPU_DEVICES=<local accelerators> (or XLA_FLAGS="
                f"{_CPU_COUNT_FLAG}=<local accelerators>) before calling prepare_process."
            )
    if accelerators is not None and cpus != accelerators:
        raise ValueError(
            f"Layout(host=...) includes 'params', which needs one CPU device per local "
            f"accelerator: {where} {cpus} CPU device(s) for {accelerators} accelerator(s). "
            f"Set JAX_NUM_CPU_DEVICES={accelerators} before the process starts."
        )
