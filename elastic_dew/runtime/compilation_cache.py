"""JAX's persistent compilation cache: the one place a process turns it on, off, or keeps it off.

:func:`use_compilation_cache` is the only code in elastic_dew that sets JAX's cache options
(``jax_compilation_cache_dir``, ``jax_persistent_cache_min_compile_time_secs``):
:func:`~elastic_dew.runtime.prepare_process` calls it with JAX's own threshold, and the test
suite and the soak call it to cache every program.

A GPU pool whose jax keys a computation spanning processes differently on each process
would have some ranks load a step from the cache that the others compile, and that
compile would wait for every rank for ever; such a pool compiles without the cache.
Under Pathways the cache is Pathways' own (the Pathways proxy keeps compiled programs under
its ``--gcs_scratch_location``, and ``pathwaysutils.initialize`` turns JAX's cache off), so
JAX's is left off.
"""

from __future__ import annotations

import logging
import math
import os
import re

from elastic_dew.runtime import backend, pool

__all__ = ["JAX_MIN_COMPILE_TIME_S", "use_compilation_cache"]

logger = logging.getLogger(__name__)

#: JAX's own default for ``jax_persistent_cache_min_compile_time_secs``: a program is
#: written to the cache only when its compile took at least this long.
JAX_MIN_COMPILE_TIME_S = 1.0

#: The first jax whose persistent-cache key of a GPU computation spanning several
#: processes is the same on every process (the key strips the device assignment). This is
#: the lowest jax elastic_dew pins; its ``jax._src.cache_key`` was read to confirm it.
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


def _check(directory: object, min_compile_time_s: object) -> None:
    """Raise ``ValueError`` for a directory that is not a path (or None) or a threshold
    that is not a finite number of seconds >= 0."""
    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise ValueError(f"compilation_cache_dir must be a path or None, got {directory!r}")
    if (
        isinstance(min_compile_time_s, bool)
        or not isinstance(min_compile_time_s, (int, float))
        or not math.isfinite(min_compile_time_s)
        or min_compile_time_s < 0
    ):
        raise ValueError(
            f"min_compile_time_s must be a number of seconds >= 0 (0 caches every program), "
            f"got {min_compile_time_s!r}"
        )


def use_compilation_cache(
    directory: str | os.PathLike[str] | None,
    *,
    min_compile_time_s: float = JAX_MIN_COMPILE_TIME_S,
) -> bool:
    """Use JAX's persistent compilation cache at ``directory`` from the next compile on;
    ``None`` turns it off. Returns whether the cache is on.

    A program is written to the cache when its compile took at least
    ``min_compile_time_s`` seconds (JAX's default, 1 s, unless given; 0 caches every
    program, as the test suite and the soak do). JAX decides once per process whether it
    uses a cache; this call makes it decide again, so it also takes effect after programs
    were compiled (and programs compiled before it are not in the cache).

    Not turned on, with a warning saying why, under Pathways (``JAX_PLATFORMS`` names the
    proxy backend: Pathways keeps its own cache and ``pathwaysutils`` turns JAX's off),
    nor in a GPU pool on a jax that keys a computation spanning processes differently on
    each process. ``ValueError`` for a directory that is not a path, or a threshold that
    is not a number of seconds >= 0, before anything changes.

    Args:
        directory: the cache's directory (created when needed), or ``None`` to turn it off.
        min_compile_time_s: the least compile time, in seconds, of a program written to it.

    Returns:
        Whether the cache is on.

    Raises:
        ValueError: ``directory`` is not a path, or ``min_compile_time_s`` is not a number of
            seconds >= 0; nothing was changed.
    """
    _check(directory, min_compile_time_s)
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if directory is not None:
        if backend._pathways_controller():
            logger.warning(
                "compilation_cache_dir=%s ignored: Pathways keeps its own compilation cache "
                "and turns JAX's off",
                directory,
            )
            return False
        if pool._pool_size() > 1 and backend.cuda_plugin() and backend._gpu_platform_allowed():
            if not _pool_keys_alike(_jax_version()):
                logger.warning(
                    "compiling without the persistent compilation cache: jax %s keys a GPU "
                    "computation that spans processes differently on each process, so some "
                    "ranks would load a step the others compile, and that compile would wait "
                    "for ever",
                    ".".join(map(str, _jax_version())),
                )
                return False
    jax.config.update("jax_compilation_cache_dir", None if directory is None else os.fspath(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    compilation_cache.reset_cache()  # JAX decided once whether it uses a cache: decide again
    logger.debug("persistent compilation cache at %s (programs compiled in >= %s s)", directory, min_compile_time_s)
    return directory is not None
