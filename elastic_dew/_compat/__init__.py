"""The one seam for other libraries' internals: every private name elastic_dew touches.

elastic_dew wraps jax, Orbax, Grain and pathwaysutils (and uses argparse); where a library
has no public API for what the project needs, the private name it uses lives here, one
module per library (:mod:`.jax` and its :mod:`.jax_executables`, :mod:`.orbax` and its :mod:`.orbax_snapshotter`, :mod:`.grain`, :mod:`.pathwaysutils`,
:mod:`.argparse`, :mod:`.goodput`, and :mod:`.python` for the interpreter's own), and nowhere else: ``tests/test_layering.py`` refuses a
private import of those libraries, or an underscore attribute taken from their objects,
outside this package. The simulator's run-time patches name their targets here too: each
object it replaces for the length of a simulation is a :class:`Private` of this seam.

Each private name is declared once as a :class:`Private`: where it lives, why no public API
serves, and which public API would replace it. ``tests/test_compat.py`` (the canary, run in
every CI environment) resolves each and checks the shape the project uses, so an upgrade
that removes or reshapes one fails there, naming the library, its version and the name.

This package is the lowest layer: it imports only the libraries, never elastic_dew. It
imports each library lazily (when a name is first used), so the runtime can ask it before
JAX starts; only :mod:`.orbax_snapshotter` (which subclasses Orbax's ``Snapshotter``) and
:mod:`.orbax` (which binds it) import their library at once.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Private", "all_private", "version"]

#: The seam's modules, one per library (Orbax's experimental Snapshotter has its own).
MODULES = ("jax", "jax_executables", "orbax", "orbax_snapshotter", "grain", "pathwaysutils", "argparse", "goodput", "python")


@dataclass(frozen=True)
class Private:
    """One private name of another library, or one object the simulator replaces.

    Args:
      library: the distribution that ships it (its installed version names it in a failure).
      path: ``module`` or ``module:attribute.attribute``; the module is imported and the
        attributes taken in turn.
      why: why no public API serves.
      instead: the public API that would replace it (or what is missing upstream).
      params: for a callable, the parameters the project passes, by name: the canary
        checks its signature takes each.
      probe: for an attribute each instance holds (not its class), a callable that builds
        one such instance for the canary to look at.
    """

    library: str
    path: str
    why: str
    instead: str
    params: tuple[str, ...] = ()
    probe: Callable[[], Any] | None = None

    @property
    def module(self) -> str:
        return self.path.partition(":")[0]

    @property
    def attributes(self) -> tuple[str, ...]:
        attrs = self.path.partition(":")[2]
        return tuple(attrs.split(".")) if attrs else ()

    @property
    def name(self) -> str:
        """The last attribute (the one the project reads or replaces); the module's name
        for a module."""
        return self.attributes[-1] if self.attributes else self.module.rpartition(".")[2]

    def owner(self) -> Any:
        """The object that holds :attr:`name` (the module for a module-level name)."""
        obj: Any = importlib.import_module(self.module)
        for attr in self.attributes[:-1]:
            obj = getattr(obj, attr)
        return obj

    def get(self) -> Any:
        """The object itself (``AttributeError`` or ``ImportError`` when it is gone)."""
        if not self.attributes:
            return importlib.import_module(self.module)
        return getattr(self.owner(), self.name)

    def set(self, value: Any) -> None:
        """Bind :attr:`name` on its owner to ``value`` (a run-time patch; the caller undoes it)."""
        setattr(self.owner(), self.name, value)

    def raw(self) -> Any:
        """The object as its owner holds it (a class's own ``property``, not its value)."""
        owner = self.owner()
        if isinstance(owner, type):
            for klass in owner.__mro__:
                if self.name in vars(klass):
                    return vars(klass)[self.name]
        return getattr(owner, self.name)

    def check(self) -> str | None:
        """What is wrong with this name in the installed library, ``None`` when nothing is."""
        try:
            obj = getattr(self.probe(), self.name) if self.probe is not None else self.get()
        except (ImportError, AttributeError) as err:
            return f"{self.path} is gone ({type(err).__name__}: {err})"
        if self.params:
            try:
                signature = inspect.signature(obj)
            except (TypeError, ValueError) as err:
                return f"{self.path} is no longer a callable with a signature ({err})"
            parameters = signature.parameters
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
            missing = [p for p in self.params if p not in parameters and not takes_any]
            if missing:
                return f"{self.path}{signature} no longer takes {', '.join(missing)}"
        return None


def version(library: str) -> str:
    """The installed version of the distribution ``library`` (``"not installed"``);
    ``"python"`` is the interpreter (argparse's)."""
    if library == "python":
        return platform.python_version()
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def all_private() -> dict[str, tuple[Private, ...]]:
    """Every private name of the seam, by seam module."""
    return {name: importlib.import_module(f"{__name__}.{name}").PRIVATE for name in MODULES}
