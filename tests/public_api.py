"""elastic_dew's public API: the one list of public names, its snapshot and its docs page.

The public names are the ``__all__`` of the modules in :data:`PUBLIC_MODULES`, plus the
pytest plugin's marker, fixture and option. For each, this module writes

- ``tests/public_api.txt``: every name's signature (functions; classes with their
  constructor (a dataclass's: its fields with their defaults), public methods and properties;
  constants with their type and value; a class's members once, where the public class that
  defines them is listed; a re-export as the name it re-exports; not a deprecated alias,
  kept one minor version), which ``tests/test_public_api.py`` compares with the package as it is, so a change to the public API is a decision, not an accident;
- ``docs/api.md``: every name with its one-line contract (the first sentence of its
  docstring, or of the ``#:`` comment above a constant).

After a deliberate change to the public API, regenerate both and add a ``CHANGELOG.md`` line::

    python tests/public_api.py --write
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import functools
import importlib
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "tests" / "public_api.txt"
DOCS_PAGE = REPO / "docs" / "api.md"
REGENERATE = "python tests/public_api.py --write"

#: What a user is doing, and the public modules for it, each with what it is for (the docs
#: page's sections, in this order). A public name is in one of these modules' ``__all__``;
#: every other module may change or move freely.
GROUPS: dict[str, tuple[str, dict[str, str]]] = {
    "Train": ("A model, an optimizer and a dataset, trained through slice loss and preemption; "
              "a recipe run as the command line runs it; what the run leaves behind.", {
        "elastic_dew": "the trainer and its settings, at the top",
        "elastic_dew.trainer": "the trainer and what `fit` returns",
        "elastic_dew.runtime": "the process: prepare it before JAX starts, preemption, compilation cache",
        "elastic_dew.run": "a recipe run, as the command line and a recipe's own main() run it",
        "elastic_dew.settings": "settings declared once (default, range or choices) and their one refusal, for your own configuration",
        "elastic_dew.observe": "the sinks that show a run (TensorBoard, the goodput export), its options, the log setup",
        "elastic_dew.record": "reading and summarising a run directory's record",
    }),
    "Bring your own loop": ("Your own `train_step`, made elastic by the protocol the trainer runs on.", {
        "elastic_dew.elastic": "the elastic layer for your own loop: its settings, the protocol and your program, data, state tiers, meshes, the health checker, the step deadline",
        "elastic_dew.your_loop": "pieces a pathwaysutils loop of your own calls with your own objects: the health checker installed, checkpoints on your CheckpointManager (docs/harden-your-loop.md)",
        "elastic_dew.elastic.events": "the typed events of a run: the run record's lines and what sinks receive",
        "elastic_dew.elastic.hooks": "phase announcements: where a loop says what it is doing, for the simulator to fire faults at",
    }),
    "Test": ("Your program on simulated slices with injected faults, on CPU: in-process, under "
             "pytest, through a local Pathways backend, or as chaos scenarios.", {
        "elastic_dew.simulate": "simulated slices and fault schedules on CPU",
        "elastic_dew.testing.pytest_plugin": "the pytest plugin (its marker, fixture and option are below)",
        "elastic_dew.proxy": "a local Pathways backend: JAX's IFRT proxy protocol served by CPU slices on loopback",
        "elastic_dew.testing": "the chaos harness: faulted scenarios, their runs and the invariants they keep",
    }),
    "Plan": ("What a run will cost at your scale, and which settings to pick.", {
        "elastic_dew.plan": "expected goodput per recovery policy and the settings to pick at N slices",
    }),
    "Deploy": ("The run on GKE, as a JobSet for Pathways.", {
        "elastic_dew.k8s": "JobSet manifests for Pathways on GKE, rendered from their parameters",
    }),
}

#: Every public module and what it is for, in :data:`GROUPS`' order.
PUBLIC_MODULES: dict[str, str] = {module: purpose for _, modules in GROUPS.values() for module, purpose in modules.items()}

@functools.cache
def plugin_surface() -> dict[str, str]:
    """The pytest plugin's public surface that is not a Python name, read from the plugin
    itself: its marker (as it registers it), its command-line option and ini key, and its
    fixture."""
    from elastic_dew.testing import pytest_plugin

    surface: dict[str, str] = {}

    class Group:
        def addoption(self, name: str, **options: Any) -> None:
            surface[f"option {name} {options.get('metavar', '')}".rstrip()] = options.get("help", "")

    class Parser:
        def getgroup(self, *args: Any) -> Group:
            return Group()

        def addini(self, name: str, help: str, **options: Any) -> None:
            surface[f"ini {name}"] = help

    class Config:
        def addinivalue_line(self, name: str, line: str) -> None:
            if name == "markers":
                signature, _, meaning = line.partition(": ")
                surface[f"marker {signature}"] = meaning

        def getoption(self, *args: Any, **kwargs: Any) -> None:
            return None

        def getini(self, name: str) -> str:
            return ""

    pytest_plugin.pytest_addoption(Parser())  # type: ignore[arg-type]
    pytest_plugin.pytest_configure(Config())  # type: ignore[arg-type]
    fixture = pytest_plugin.simulated_slices
    doc = getattr(fixture, "__doc__", None) or getattr(getattr(fixture, "__wrapped__", None), "__doc__", "")
    surface["fixture simulated_slices"] = _first_sentence(doc or "")
    return surface


def _prepare_jax() -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _clean(text: str) -> str:
    """A repr without what changes from run to run (addresses)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


class _Written(str):
    """An annotation as its source wrote it (the modules use ``from __future__ import
    annotations``, so annotations are strings): shown without quotes."""

    def __repr__(self) -> str:
        return str(self)


def _unquoted(annotation: Any) -> Any:
    return _Written(annotation) if isinstance(annotation, str) else annotation


def _signature(obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    signature = signature.replace(
        parameters=[p.replace(annotation=_unquoted(p.annotation)) for p in signature.parameters.values()],
        return_annotation=_unquoted(signature.return_annotation),
    )
    return _clean(str(signature))


def _own(cls: type, name: str) -> Any:
    """``name``'s attribute as an elastic_dew class of ``cls``'s MRO defines it, or ``None``."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name] if klass.__module__.startswith("elastic_dew") else None
    return None


def _constant(value: Any) -> str:
    if isinstance(value, (bool, int, float, str, bytes, type(None))):
        return f"{type(value).__name__} = {value!r}"
    if isinstance(value, (tuple, frozenset, list)) and all(isinstance(v, (int, float, str)) for v in value):
        return f"{type(value).__name__} = {_clean(repr(value))}"
    return type(value).__name__


def _deprecated(attr: Any) -> bool:
    """A name kept only for one minor version (its docstring starts ``Deprecated``:
    :func:`elastic_dew._deprecation.renamed_method`'s), listed in ``CHANGELOG.md``, not part of the API."""
    target = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
    return (getattr(target, "__doc__", None) or "").lstrip().startswith("Deprecated")


def _public_bases(cls: type) -> list[type]:
    """The public classes ``cls`` derives from (listed elsewhere in the snapshot)."""
    listed = {id(obj) for obj in public_names().values()}
    return [base for base in cls.__mro__[1:] if id(base) in listed]


def _class_lines(qualified: str, cls: type) -> list[str]:
    """A class's lines: what it adds to its public bases (which have their own lines)."""
    lines = []
    inherited: set[str] = set()
    for base in _public_bases(cls):
        inherited |= {n for n in dir(base) if not n.startswith("_")}
        if dataclasses.is_dataclass(base):
            inherited |= {f.name for f in dataclasses.fields(base)}
    own = set(vars(cls)) | set(vars(cls).get("__annotations__", {}))
    bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
    if dataclasses.is_dataclass(cls):  # its fields are its constructor's parameters, on one line
        flags = ", ".join(
            flag for flag in ("frozen", "kw_only")
            if getattr(cls.__dataclass_params__, flag, False)  # type: ignore[attr-defined]
        )
        kind = f"dataclass{f'({flags})' if flags else ''}{f' of {bases}' if bases else ''}"
        lines.append(f"{qualified}: {kind}{_signature(cls)}")
        for field in dataclasses.fields(cls):  # what the constructor does not take: a class constant
            if not field.init and not field.name.startswith("_") and field.default is not dataclasses.MISSING:
                lines.append(f"{qualified}.{field.name}: {field.type} = {_clean(repr(field.default))}")
    else:
        lines.append(f"{qualified}: class{f'({bases})' if bases else ''}{_signature(cls)}")
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    for name in sorted(dir(cls)):
        if name.startswith("_") or name in fields or (name in inherited and name not in own):
            continue
        attr = _own(cls, name)
        if attr is None or _deprecated(attr):
            continue
        if isinstance(attr, property):
            lines.append(f"{qualified}.{name}: property")
        elif isinstance(attr, (classmethod, staticmethod)):
            kind = type(attr).__name__
            lines.append(f"{qualified}.{name}: {kind}{_signature(getattr(cls, name))}")
        elif inspect.isfunction(attr):
            lines.append(f"{qualified}.{name}{_signature(attr)}")
        elif not callable(attr):
            lines.append(f"{qualified}.{name}: {_constant(attr)}")
    return lines


def _lines(qualified: str, obj: Any) -> list[str]:
    if inspect.isclass(obj):
        return _class_lines(qualified, obj)
    if inspect.ismodule(obj):
        return [f"{qualified}: module"]
    if callable(obj):
        return [f"{qualified}{_signature(obj)}"]
    return [f"{qualified}: {_constant(obj)}"]


@functools.cache
def public_names() -> dict[str, Any]:
    """Every public name (``module.name``) and its object, in :data:`PUBLIC_MODULES` order."""
    _prepare_jax()
    names: dict[str, Any] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            names[f"{module_name}.{name}"] = getattr(module, name)
    return names


def _homes() -> dict[int, str]:
    """Each class's and function's listing under the public module nearest the module that
    defines it (``elastic_dew.elastic.events.Stop``, not the re-export
    ``elastic_dew.elastic.Stop``)."""
    home: dict[int, tuple[int, str]] = {}
    for qualified, obj in public_names().items():
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        module = qualified.rsplit(".", 1)[0]
        defined = getattr(obj, "__module__", "") or ""
        near = len(module) if defined == module or defined.startswith(module + ".") else 0
        if id(obj) not in home or near > home[id(obj)][0]:
            home[id(obj)] = (near, qualified)
    return {key: qualified for key, (_, qualified) in home.items()}


@functools.cache
def snapshot() -> str:
    """The snapshot text of the public API as the package is now."""
    lines = []
    home = _homes()
    for qualified, obj in public_names().items():
        if home.get(id(obj), qualified) != qualified:
            lines.append(f"{qualified}: the same as {home[id(obj)]}")  # a re-export
            continue
        lines.extend(_lines(qualified, obj))
    lines.extend(f"elastic_dew.testing.pytest_plugin: {what}: {how}" for what, how in plugin_surface().items())
    return "\n".join(lines) + "\n"


def _markdown(text: str) -> str:
    """reStructuredText roles and literals as Markdown code."""
    text = re.sub(r":\w+:`~([^`]+)`", lambda m: "`" + m.group(1).rsplit(".", 1)[-1] + "`", text)
    text = re.sub(r":\w+:`([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _first_sentence(text: str) -> str:
    paragraph = " ".join(inspect.cleandoc(text).split("\n\n")[0].split())
    match = re.match(r"(.+?[.])(\s|$)", paragraph)
    sentence = match.group(1) if match else paragraph
    return _markdown(sentence.rstrip(".:;"))


def _comment_above(name: str) -> str | None:
    """The ``#:`` comment block above ``NAME = ...`` (or ``NAME: T = ...``) in elastic_dew's sources."""
    pattern = re.compile(rf"^{re.escape(name)}\s*(:[^=]*)?=")
    for path in sorted((REPO / "elastic_dew").rglob("*.py")):
        lines = path.read_text().splitlines()
        for index, line in enumerate(lines):
            if pattern.match(line):
                block = []
                j = index - 1
                while j >= 0 and lines[j].startswith("#:"):
                    block.insert(0, lines[j][2:].strip())
                    j -= 1
                if block:
                    return " ".join(block)
    return None


def contract(qualified: str, obj: Any) -> str | None:
    """The one-line contract of a public name: its docstring's first sentence (the ``#:``
    comment above a constant); ``None`` when it has neither."""
    doc = None
    if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj):
        doc = obj.__doc__
    if doc:
        return _first_sentence(doc)
    comment = _comment_above(qualified.rsplit(".", 1)[1])
    return _first_sentence(comment) if comment else None


def routines() -> dict[str, Any]:
    """Every public function, class and public method (``module.Class.method``), once each
    (a name re-exported by several public modules is listed under the first)."""
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for qualified, obj in public_names().items():
        if id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        seen.add(id(obj))
        out[qualified] = obj
        if inspect.isclass(obj):
            for name in sorted(dir(obj)):
                attr = None if name.startswith("_") else _own(obj, name)
                if isinstance(attr, (classmethod, staticmethod)):
                    attr = attr.__func__
                if inspect.isfunction(attr):
                    out[f"{qualified}.{name}"] = attr
    return out


def sections_needed(obj: Any) -> list[str]:
    """The docstring sections a public routine owes: ``Args`` when it takes arguments (a
    dataclass: its fields), ``Returns`` when it returns something, ``Raises`` when its own
    body raises."""
    needed = []
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        arguments = [f.name for f in dataclasses.fields(obj) if f.init]
    else:
        try:
            parameters = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            parameters = {}
        arguments = [
            name for name, p in parameters.items()
            if name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    if arguments:
        needed.append("Args")
    if not inspect.isclass(obj) and inspect.signature(obj).return_annotation not in (
        "None", None, inspect.Signature.empty, "Iterator[None]"
    ):
        needed.append("Returns")
    try:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        tree = None
    if tree is not None:
        body = tree.body[0]
        if inspect.isclass(obj):  # the constructor's and __post_init__'s raises are the class's
            body = ast.Module(body=[n for n in body.body if isinstance(n, ast.FunctionDef)
                                    and n.name in ("__init__", "__post_init__")], type_ignores=[])
        if any(isinstance(node, ast.Raise) for node in ast.walk(body)):
            needed.append("Raises")
    return needed


def sections_lacking() -> dict[str, list[str]]:
    """Each public routine whose docstring lacks a section it owes, and those sections."""
    lacking = {}
    for qualified, obj in routines().items():
        doc = inspect.getdoc(obj) or ""
        missing = [section for section in sections_needed(obj) if not re.search(rf"^\s*{section}:\s*$", doc, re.M)]
        if missing:
            lacking[qualified] = missing
    return lacking


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


@functools.cache
def docs_page() -> str:
    """``docs/api.md``: every public name with its one-line contract, by what a user is doing
    (:data:`GROUPS`), then by module."""
    names = public_names()
    out = [
        "# Public API",
        "",
        "These are elastic_dew's public names, grouped by what you are doing: the `__all__` of the",
        "modules below, and the pytest",
        "plugin's marker, fixture and option. They keep their word: a change to one is recorded in",
        "`CHANGELOG.md`, and a public name that is renamed or moved keeps working from its old place",
        "for one minor version, with a `DeprecationWarning` naming the new one. Every other module",
        "may change without notice. Each name's docstring has its full contract (`help(name)`), with",
        "its arguments, what it returns and what it raises.",
        "",
        f"`tests/test_public_api.py` compares every signature here with `tests/public_api.txt`; after",
        f"a deliberate change, regenerate both (`{REGENERATE}`) and add a `CHANGELOG.md` line.",
        "",
        f"{len(names)} public names in {len(PUBLIC_MODULES)} modules, and the plugin's "
        f"{len(plugin_surface())} entries.",
        "",
    ]
    for group, (intro, modules) in GROUPS.items():
        out += [f"## {group}", "", intro, ""]
        for module_name, purpose in modules.items():
            out += [f"### `{module_name}`", "", purpose[0].upper() + purpose[1:] + ".", "", "| name | contract |",
                    "| --- | --- |"]
            prefix = module_name + "."
            for qualified, obj in names.items():
                if qualified.startswith(prefix) and "." not in qualified[len(prefix):]:
                    text = contract(qualified, obj) or "(no contract written)"
                    out.append(f"| `{qualified[len(prefix):]}` | {_escape(text)} |")
            if module_name == "elastic_dew.testing.pytest_plugin":
                for what, how in plugin_surface().items():
                    out.append(f"| `{what}` | {_escape(_markdown(how))} |")
            out.append("")
    return "\n".join(out)


def diff(expected: str, actual: str, name: str) -> str:
    return "".join(difflib.unified_diff(
        expected.splitlines(keepends=True), actual.splitlines(keepends=True),
        fromfile=f"{name} (checked in)", tofile=f"{name} (the package now)",
    ))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write tests/public_api.txt and docs/api.md")
    args = parser.parse_args(argv)
    outputs = {SNAPSHOT: snapshot(), DOCS_PAGE: docs_page()}
    if args.write:
        for path, text in outputs.items():
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
    for path in stale:
        sys.stdout.write(diff(path.read_text() if path.exists() else "", outputs[path], str(path.relative_to(REPO))))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
