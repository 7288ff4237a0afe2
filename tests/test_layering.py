"""Data flows one way: runtime -> elastic layer -> trainer -> recipes.

Each module's imports (read from its source, top level and inside functions alike) may name
only its own layer or lower ones. The simulator sits beside the elastic layer: it may use the
elastic layer's hooks, and nothing in the library imports it except the run (which wires
simulated slices when it simulates), the commands and the chaos harness. Nothing below the
command line imports the commands: recipes call the library (``elastic_dew.run``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

#: Layer of each module path prefix (longest prefix wins); a higher number is a higher layer.
LAYERS = {
    "elastic_dew.runtime": 0,
    "elastic_dew.launch": 0,
    "elastic_dew.elastic": 1,
    "elastic_dew.simulate": 1,
    "elastic_dew.rundir": 1,  # the run directory's formats: below everything that reads them
    "elastic_dew.trainer": 2,
    "elastic_dew.record": 2,
    "elastic_dew.progress": 2,
    "elastic_dew.observe": 2,  # goodput, export, TensorBoard, logs, progress bar
    "recipes": 3,
    # The run (plan, check, execute) and its terminal face: recipes call them from main(),
    # and they load recipes by name at run time, never by import.
    "elastic_dew.run": 2,
    "elastic_dew.console": 2,
    "elastic_dew.commands": 4,
    "elastic_dew.cli": 4,
    "elastic_dew.k8s": 4,
    "elastic_dew.chaos": 4,
    "elastic_dew.testing": 4,  # the chaos harness: scenarios, runner, invariants
    "elastic_dew.supervisor": 4,  # re-run a program after 143 or a kill, as a JobSet does
    "elastic_dew.__main__": 4,
    "elastic_dew": 2,  # the package root only re-exports the Trainer (lazily)
}


def _layer(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best[0])
        ):
            best = (prefix, layer)
    return None if best is None else best[1]


def _modules():
    for root in ("elastic_dew", "recipes"):
        for path in sorted((REPO / root).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # ``from pkg import sub`` may name a submodule: the longest known prefix decides.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {n for n in names if n.split(".")[0] in ("elastic_dew", "recipes")}


def test_no_module_imports_a_layer_above_its_own():
    violations = []
    for module, path in _modules():
        own = _layer(module)
        listed = any(module == p or module.startswith(p + ".") for p in LAYERS if p != "elastic_dew")
        assert listed or module == "elastic_dew", f"{module} has no layer in LAYERS; add it"
        for imported in _imports(path):
            other = _layer(imported)
            if other is not None and other > own:
                violations.append(f"{module} (layer {own}) imports {imported} (layer {other})")
    assert not violations, "\n".join(violations)


def test_only_the_commands_import_the_simulator():
    offenders = [
        module
        for module, path in _modules()
        if any(name == "elastic_dew.simulate" or name.startswith("elastic_dew.simulate.") for name in _imports(path))
        and not module.startswith(("elastic_dew.commands", "elastic_dew.chaos", "elastic_dew.testing", "elastic_dew.simulate"))
        and module != "elastic_dew.run"  # the run wires simulated slices when it simulates
    ]
    assert offenders == []


#: The command line, its program entry points (``python -m elastic_dew``, ``python -m
#: elastic_dew.chaos``) and the test harness; everything else is below it.
_CLI = (
    "elastic_dew.commands", "elastic_dew.cli", "elastic_dew.k8s", "elastic_dew.__main__",
    "elastic_dew.testing", "elastic_dew.chaos",
)


def test_no_module_below_the_command_line_imports_the_commands():
    below = [(module, path) for module, path in _modules() if not module.startswith(_CLI)]
    assert any(module == "elastic_dew.run" for module, _ in below)
    offenders = [
        f"{module} imports {imported}"
        for module, path in below
        for imported in _imports(path)
        if imported == "elastic_dew.commands" or imported.startswith("elastic_dew.commands.")
    ]
    assert offenders == []
