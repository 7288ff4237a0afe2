"""JAX's persistent compilation cache, turned on where every process of a pool keys alike.

A GPU pool whose jax keys a computation spanning processes differently on each process
would have some ranks load a step from the cache that the others compile, and that
compile would wait for every rank for ever; such a pool compiles without the cache.
Under Pathways the cache is Pathways' own, and the caller leaves JAX's off.
"""

from __future__ import annotations

import logging
import os
import re

from elastic_dew.runtime import backend, pool

__all__: list[str] = []

logger = logging.getLogger(__name__)

#: The first jax whose persistent-cache key of a GPU computation spanning several
#: processes is the same on every process (the key strips the device assignment). This is
#: the lower bound elastic_dew pins; its ``jax._src.cache_key`` was read to confirm it.
_POOL_KEYS_ALIKE_SINCE = (0, 10, 1)


def _jax_version() -> tuple[int, ...]:
    import jax

    return tuple(int(p) for p in re.findall(r"\d+", jax.__version__)[:3])


def _pool_keys_alike(version: tuple[int, ...]) -> bool:
    """Whether this jax keys a computation spanning processes alike on every process.

    If it does not, some ranks of a GPU pool would load a step from the persistent cache
    that the others compile, and that compile waits for every rank for ever.
    """
    return tuple(version) >= _POOL_KEYS_ALIKE_SINCE


def _enable_cache(directory: str | os.PathLike[str]) -> None:
    """Turn on the persistent compilation cache at ``directory``, unless this is a GPU
    pool on a jax that keys pools differently per process (then say why, in a warning)."""
    import jax

    if pool._pool_size() > 1 and backend.cuda_plugin() and backend._gpu_platform_allowed():
        if not _pool_keys_alike(_jax_version()):
            logger.warning(
                "compiling without the persistent compilation cache: jax %s keys a GPU "
                "computation that spans processes differently on each process, so some ranks "
                "would load a step the others compile, and that compile would wait for ever",
                ".".join(map(str, _jax_version())),
            )
            return
    jax.config.update("jax_compilation_cache_dir", os.fspath(directory))
    logger.debug("persistent compilation cache at %s", directory)
