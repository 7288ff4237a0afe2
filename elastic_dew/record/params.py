"""``final_params.npz``: a run's final parameters, and the digest that identifies them.

Parameters are stored flat, one array per path (``layers/0/w``), without pickle, so any
numpy can read them and loading one never runs code.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from elastic_dew import rundir

__all__ = ["flatten_params", "state_digest", "write_params", "load_params"]


def flatten_params(params: Any) -> dict[str, np.ndarray]:
    """A parameter pytree as ``{"path/to/leaf": numpy array}``, sorted by path.

    A flat mapping of such paths (what :func:`load_params` returns) flattens to itself, so a
    digest of saved parameters equals the digest of the live ones.

    Args:
        params: a pytree of arrays, or a flat mapping of paths.

    Returns:
        Each leaf's path and its numpy array.

    Raises:
        ValueError: two leaves flatten to the same path.
    """
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    flat: dict[str, np.ndarray] = {}
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path, simple=True, separator="/") or "value"
        if name in flat:
            raise ValueError(f"two parameters flatten to the same path {name!r}; rename one")
        flat[name] = np.asarray(jax.device_get(leaf))
    return dict(sorted(flat.items()))


def state_digest(params: Any) -> str:
    """SHA-256 over the parameters' paths, dtypes, shapes and bytes, in sorted path order.

    Equal digests mean bitwise-equal parameters; for runs whose meshes differed compare
    ``final_params.npz`` with ``allclose`` instead.

    Args:
        params: a pytree of arrays, or a flat mapping of paths.

    Returns:
        The hexadecimal digest.
    """
    digest = hashlib.sha256()
    for name, array in flatten_params(params).items():
        array = np.ascontiguousarray(array)
        header = f"{name}\0{array.dtype.str}\0{array.shape}\0".encode()
        digest.update(len(header).to_bytes(8, "little"))
        digest.update(header)
        digest.update(array.tobytes())
    return digest.hexdigest()


def write_params(run_dir: str | os.PathLike[str], flat: dict[str, np.ndarray]) -> Path:
    """Write flattened parameters (:func:`flatten_params`) to ``run_dir/final_params.npz``, atomically.

    Args:
        run_dir: the run directory.
        flat: the flattened parameters.

    Returns:
        The file's path.
    """
    path = Path(run_dir) / rundir.PARAMS_FILE
    arrays: dict[str, Any] = flat  # numpy's stub reads ** as its own keywords too
    rundir.atomic_write(path, lambda f: np.savez(f, **arrays))
    return path


def load_params(run_dir: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The final parameters of a finished run, as written by :func:`write_params`.

    Args:
        run_dir: the run directory.

    Returns:
        Each parameter's path and its array.

    Raises:
        FileNotFoundError: the run has no ``final_params.npz``.
        ValueError: the file is not one elastic_dew wrote (it would need unpickling, or is
            damaged); it is never unpickled.
    """
    path = Path(run_dir) / rundir.PARAMS_FILE
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in sorted(data.files)}
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        # allow_pickle=False: a file that would need unpickling is refused, never run.
        why = (
            "it holds pickled (object) data, which elastic_dew never writes and never loads"
            if "pickle" in str(error) else str(error)
        )
        raise ValueError(
            f"{path} is not a parameters file elastic_dew wrote ({why}); delete it and run the "
            "run's train command again, which rewrites it from the final checkpoint"
        ) from error
