"""Data flows one way: runtime -> elastic layer -> training -> run -> recipes -> command line.

Each module's imports (read from its source, top level and inside functions alike) may name
only its own layer or a layer its layer may import (:data:`LAYERS`). The rules are the
layers' own, with no exception for any module: the simulator sits beside the elastic layer
(it imports what that layer does) and below the run, so the training layer cannot import it
and the run (which wires simulated slices when it simulates), the harness and the command
line can. Nothing outside the command line imports the commands: recipes call the library
(``elastic_dew.run``), and the chaos harness (``elastic_dew.testing``) is below the command
that drives it.

Inside the elastic layer, its packages by job form layers of their own
(:data:`ELASTIC_PACKAGES`): the shared definitions directly in ``elastic_dew.elastic``, then
the state tiers, the slices, the loop.

No circle anywhere: inside every package, its modules and sub-packages (each sub-package
taken whole, the package's own ``__init__`` one of them) import one another one way only, so
no two modules and no two packages import each other, directly or round a longer circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from conftest import REPO

#: Each layer: the module path prefixes it holds (the longest prefix wins), and the layers
#: below it that it may import. Listed bottom up.
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # (and the deprecation shims' one wording, which imports nothing of elastic_dew)
    "runtime": (("elastic_dew.runtime", "elastic_dew.launch", "elastic_dew._deprecation"), ()),
    # the elastic layer and the run directory's formats: below everything that reads them
    "elastic": (("elastic_dew.elastic", "elastic_dew.rundir"), ("runtime",)),
    "simulator": (("elastic_dew.simulate",), ("runtime", "elastic")),
    # the package root only re-exports the Trainer (lazily)
    "training": (
        ("elastic_dew.trainer", "elastic_dew.train_config", "elastic_dew.record",
         "elastic_dew.observe", "elastic_dew"),
        ("runtime", "elastic"),
    ),
    # Planning a run at scale: reads run records, writes fault schedules' text
    "plan": (("elastic_dew.plan",), ("runtime", "elastic", "training")),
    # The run (plan, check, execute) and its terminal face: recipes call them from main(),
    # and they load recipes by name at run time, never by import.
    "run": (("elastic_dew.run", "elastic_dew.console"), ("runtime", "elastic", "simulator", "training")),
    "recipes": (("recipes",), ("runtime", "elastic", "training", "run")),
    # the chaos harness (scenarios, runner, invariants) and the supervisor that re-runs a
    # program after 143 or a kill, as a JobSet does
    "harness": (
        ("elastic_dew.testing", "elastic_dew.supervisor"),
        ("runtime", "elastic", "simulator", "training", "run"),
    ),
    # the command line and its program entry points (python -m elastic_dew, python -m
    # elastic_dew.chaos)
    "cli": (
        ("elastic_dew.commands", "elastic_dew.cli", "elastic_dew.k8s", "elastic_dew.chaos", "elastic_dew.__main__"),
        ("runtime", "elastic", "simulator", "training", "plan", "run", "recipes", "harness"),
    ),
}

#: The elastic layer's packages, bottom up: each may import only itself and those before it.
#: A module directly in ``elastic_dew/elastic/`` is a shared definition (config, events, hooks,
#: the step deadline, the fault token), which every package reads.
ELASTIC_PACKAGES = (
    "elastic_dew.elastic",
    "elastic_dew.elastic.state",
    "elastic_dew.elastic.slices",
    "elastic_dew.elastic.loop",
)


def _home(module: str) -> tuple[str, str] | None:
    """The longest prefix in :data:`LAYERS` that holds ``module``, and its layer."""
    best = None
    for name, (prefixes, _) in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[0])
            ):
                best = (prefix, name)
    return best


def _layer(module: str) -> str | None:
    home = _home(module)
    return None if home is None else home[1]


def _may_import(layer: str) -> set[str]:
    return {layer, *LAYERS[layer][1]}


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


def test_the_layers_import_only_layers_below_them():
    order = list(LAYERS)
    for layer, (_, below) in LAYERS.items():
        assert all(order.index(other) < order.index(layer) for other in below), layer


def test_no_module_imports_a_layer_its_own_may_not():
    violations = []
    for module, path in _modules():
        home = _home(module)
        listed = home is not None and (home[0] != "elastic_dew" or module == "elastic_dew")
        assert listed, f"{module} has no layer in LAYERS; add it"
        own = home[1]
        for imported in _imports(path):
            other = _layer(imported)
            if other is not None and other not in _may_import(own):
                violations.append(f"{module} ({own}) imports {imported} ({other})")
    assert not violations, "\n".join(violations)


def test_the_simulator_is_imported_only_from_the_run_upward():
    allowed = {layer for layer in LAYERS if "simulator" in _may_import(layer)}
    assert allowed == {"simulator", "run", "harness", "cli"}
    importers = {
        module
        for module, path in _modules()
        if any(_layer(name) == "simulator" for name in _imports(path)) and _layer(module) != "simulator"
    }
    assert "elastic_dew.run" in importers
    assert {module for module in importers if _layer(module) not in allowed} == set()


def test_no_module_below_the_command_line_imports_the_commands():
    below = [(module, path) for module, path in _modules() if _layer(module) != "cli"]
    assert {"elastic_dew.run", "elastic_dew.testing", "recipes.lm"} <= {module for module, _ in below}
    offenders = [
        f"{module} imports {imported}"
        for module, path in below
        for imported in _imports(path)
        if imported == "elastic_dew.commands" or imported.startswith("elastic_dew.commands.")
    ]
    assert offenders == []


def _elastic_package(module: str) -> str | None:
    """The package of :data:`ELASTIC_PACKAGES` that holds ``module`` (the longest that does)."""
    holders = [p for p in ELASTIC_PACKAGES if module == p or module.startswith(p + ".")]
    return max(holders, key=len) if holders else None


def test_the_elastic_layers_packages_import_only_packages_before_them():
    order = list(ELASTIC_PACKAGES)
    modules = [(module, path) for module, path in _modules() if _elastic_package(module) is not None]
    assert {"elastic_dew.elastic.loop.protocol", "elastic_dew.elastic.state.tiers"} <= {m for m, _ in modules}
    violations = []
    for module, path in modules:
        own = _elastic_package(module)
        for imported in _imports(path):
            # ``from elastic_dew.elastic import hooks`` names the module; the package root
            # itself imports nothing eagerly
            other = _elastic_package(imported)
            if other is not None and order.index(other) > order.index(own):
                violations.append(f"{module} ({own}) imports {imported} ({other})")
    assert not violations, "\n".join(violations)


def _resolved_imports() -> dict[str, set[str]]:
    """Each module's imports of the project's modules, by module: ``from pkg import sub``
    names ``pkg.sub`` when that is a module, else ``pkg``; ``import a.b.c`` the longest
    module it names."""
    modules = dict(_modules())

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = {}
    for module, path in modules.items():
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    names.add(full if full in modules else known(node.module))
        found[module] = {name for name in names if name is not None and name != module}
    return found


def _circles(edges: dict[str, dict[str, tuple[str, str]]]) -> Iterator[list[str]]:
    """One circle (``[a, b, ..., a]``) through each strongly connected group of ``edges``
    that has more than one member (Tarjan's algorithm, then a path back to the start)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges.get(node, {}):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            groups.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    for group in groups:
        if len(group) < 2:
            continue
        start = min(group)
        paths = {start: [start]}
        frontier = [start]
        while frontier:  # breadth first inside the group: the shortest circle through start
            node = frontier.pop(0)
            for other in sorted(edges.get(node, {})):
                if other == start:
                    yield paths[node] + [start]
                    frontier = []
                    break
                if other in group and other not in paths:
                    paths[other] = paths[node] + [other]
                    frontier.append(other)


def _package_circles(imports: dict[str, set[str]]) -> list[str]:
    """Every circle among the members of a package, each worded with the imports that make it."""
    packages = {module for module, path in _modules() if path.name == "__init__.py"}

    def member(package: str, module: str) -> str | None:
        if module == package:
            return "__init__"
        if module.startswith(package + "."):
            return module[len(package) + 1:].split(".")[0]
        return None

    found = []
    for package in sorted(packages):
        edges: dict[str, dict[str, tuple[str, str]]] = {}
        for module, names in imports.items():
            source = member(package, module)
            if source is None:
                continue
            for name in sorted(names):
                target = member(package, name)
                if target is not None and target != source:
                    edges.setdefault(source, {}).setdefault(target, (module, name))
        for circle in _circles(edges):
            how = "; ".join(f"{edges[a][b][0]} imports {edges[a][b][1]}" for a, b in zip(circle, circle[1:]))
            found.append(f"in {package}: {' -> '.join(circle)} ({how})")
    return found


def test_no_modules_and_no_packages_import_each_other():
    imports = _resolved_imports()
    assert "elastic_dew.elastic.config" in imports["elastic_dew.elastic.loop.protocol"]
    circles = _package_circles(imports)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_circle_check_finds_a_circle_between_packages_and_names_it():
    imports = {
        "elastic_dew.elastic.config": {"elastic_dew.rundir"},
        "elastic_dew.rundir": {"elastic_dew.elastic.events"},
        "elastic_dew.elastic.events": set(),
        "elastic_dew.testing.runner": {"elastic_dew.testing.invariants"},
        "elastic_dew.testing.invariants": {"elastic_dew.testing.runner"},
    }
    assert _package_circles(imports) == [
        "in elastic_dew: elastic -> rundir -> elastic (elastic_dew.elastic.config imports "
        "elastic_dew.rundir; elastic_dew.rundir imports elastic_dew.elastic.events)",
        "in elastic_dew.testing: invariants -> runner -> invariants (elastic_dew.testing.invariants "
        "imports elastic_dew.testing.runner; elastic_dew.testing.runner imports "
        "elastic_dew.testing.invariants)",
    ]
