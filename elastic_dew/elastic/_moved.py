"""The old module paths of the elastic layer, kept for one minor version.

When ``elastic_dew/elastic/`` was split by job (``state``, ``slices``, ``loop``), every
module that had a public ``__all__`` kept its old path: :data:`MOVED` lists each old path,
the module that now holds its names, and the names renamed on the way. An old path is served
by :func:`install`'s import hook (no file of its own); the package that took a module's
place binds :func:`moved` as its ``__getattr__`` (``slices``: all of ``slices.mesh``'s names)
or, for a few names, :func:`elastic_dew._deprecation.moved_names` (``state``). Either way a name read
from an old path resolves to the same object in its new module, with a
``DeprecationWarning`` naming the new path in :func:`elastic_dew._deprecation.warn`'s one
wording (``CHANGELOG.md``, Deprecated). Everything here goes in
:data:`~elastic_dew._deprecation.REMOVED_IN`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Mapping

from elastic_dew._deprecation import warn

__all__ = ["MOVED", "moved", "install"]

_LAYER = "elastic_dew.elastic."

#: Each old module path -> (the module that now holds its names, {old name: new name} for
#: the names renamed on the way). The two that took a package's place are not here: they
#: are served by their package (``slices``: :mod:`~elastic_dew.elastic.slices.mesh`'s names;
#: ``state``: ``Snapshots`` and ``Checkpoints``, and ``newest`` where it always was).
MOVED: dict[str, tuple[str, Mapping[str, str]]] = {
    _LAYER + old: (_LAYER + new, renamed)
    for old, new, renamed in [
        ("checkpoint_backend", "state.backend", {}),
        ("checkpoint_multi_tier", "state.multi_tier", {}),
        ("checkpoint_orbax", "state.orbax_backend", {}),
        ("checkpoint_warmup", "state.save_precompiler",
         {"SaveWarmup": "SavePrecompiler", "prepare_replica_slices": "precompile_replica_slices"}),
        ("checkpoints", "state.checkpoints", {}),
        ("compiler", "loop.compiler", {}),
        ("data", "loop.data", {}),
        ("evaluation", "loop.evaluation", {}),
        ("health", "slices.health", {}),
        ("meta", "state.meta", {}),
        ("packing", "state.packing", {}),
        ("persistence", "state.persistence", {}),
        ("protocol", "loop.protocol", {}),
        ("recovery", "loop.recovery", {}),
        ("retry", "slices.retry", {}),
        ("sharding", "slices.sharding", {}),
        ("slice_loss_log", "slices.loss_log", {}),
        ("snapshots", "state.snapshots", {}),
        ("tiers", "state.tiers", {}),
    ]
}


def moved(old: str, new: str, public_only: bool = False,
          renamed: Mapping[str, str] | None = None) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``old`` that serves every name of the module ``new`` with a
    warning (a name by name move is :func:`elastic_dew._deprecation.moved_names`'s).

    Args:
        old: the module path users imported (the shim's ``__name__``).
        new: the module path that now holds its names.
        public_only: serve only the names in ``new``'s ``__all__`` (for a package that took
            a module's place, so its submodules are never shadowed).
        renamed: ``{old name: new name}`` for the names renamed on the way.

    Returns:
        The function to bind as the old module's ``__getattr__``.
    """
    renamed = dict(renamed or {})

    def __getattr__(name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module = importlib.import_module(new)
        new_name = renamed.get(name, name)
        if public_only and new_name not in module.__all__:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        value = getattr(module, new_name)
        warn(f"{old}.{name}", f"{new}.{new_name}")
        return value

    return __getattr__


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds each old path of :data:`MOVED` (after every real module: a file wins) and
    makes it a module whose names resolve with :func:`moved`."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        new, renamed = MOVED[module.__name__]
        module.__doc__ = f"Deprecated: this module moved to :mod:`{new}`; its names resolve there with a warning."
        module.__getattr__ = moved(module.__name__, new, renamed=renamed)  # type: ignore[method-assign]


def install() -> None:
    """Serve the old paths of :data:`MOVED` (once per process; the elastic package calls it)."""
    if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
        sys.meta_path.append(_OldPaths())
