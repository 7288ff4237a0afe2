"""What this process's JAX backend is, or will be, asked without opening it.

The XLA flags, the compilation cache, the pool and the host layout all depend on which
platforms JAX may use and whether a backend already started (XLA read its flags then).
These questions never import JAX when it is not imported yet, so a process can ask them
before its first JAX call.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from elastic_dew._compat import jax as jax_private

__all__ = ["cuda_plugin"]

_CUDA_PLUGIN_MODULES = (
    "jax_cuda13_plugin",
    "jax_cuda12_plugin",
    "jax_plugins.xla_cuda13",
    "jax_plugins.xla_cuda12",
)


def cuda_plugin() -> bool:
    """Whether JAX's CUDA plugin is installed, the one reader of XLA's GPU flags.

    Asked before the backend opens, which no other question (``jax.devices()``) can be:
    it looks for the plugin's module without importing it.

    Returns:
        Whether the CUDA plugin's module is installed.
    """
    for name in _CUDA_PLUGIN_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _backend_started() -> bool:
    """Whether this process already opened a JAX backend (XLA has read its flags)."""
    return jax_private.backends_started()


def _platforms() -> str:
    """The platforms JAX may use, as ``JAX_PLATFORMS`` (or jax's config) names them."""
    env = os.environ.get("JAX_PLATFORMS", "")
    if env:
        return env
    if "jax" in sys.modules:
        import jax

        return jax.config.jax_platforms or ""  # type: ignore[attr-defined]  # jax.config declares its options at run time
    return ""


def _platform_list() -> list[str]:
    """:func:`_platforms` as lower-case names, empty when JAX may choose any."""
    return [p.strip().lower() for p in _platforms().split(",") if p.strip()]


def _pathways_controller() -> bool:
    """Whether this process is a Pathways single controller (the proxy backend)."""
    return "proxy" in _platforms().lower()


def _gpu_platform_allowed() -> bool:
    """Whether JAX may pick a GPU platform in this process."""
    platforms = _platform_list()
    return not platforms or any(p in ("cuda", "gpu", "rocm") for p in platforms)
