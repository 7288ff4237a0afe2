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
    # the one seam for other libraries' internals: imports only the libraries
    "compat": (("elastic_dew._compat",), ()),
    # (and the deprecation shims' one wording, which imports nothing of elastic_dew; the
    # settings' declarations, the mentions inside their refusals, and the command line's one
    # builder of flags from them, which launch uses)
    "runtime": (("elastic_dew.runtime", "elastic_dew.launch", "elastic_dew._deprecation", "elastic_dew.settings",
                 "elastic_dew.mentions", "elastic_dew.flags"),
                ("compat",)),
    # the elastic layer and the run directory's formats: below everything that reads them
    "elastic": (("elastic_dew.elastic", "elastic_dew.rundir"), ("compat", "runtime")),
    # a fault's text, the schedule's token grammar: the simulator's, which the planner (a tool
    # beside the core) writes the schedules it draws in; it imports nothing of elastic_dew
    "fault text": (("elastic_dew.simulate.fault_token",), ("compat",)),
    "simulator": (("elastic_dew.simulate",), ("compat", "runtime", "elastic", "fault text")),
    # the local Pathways backend (the IFRT proxy server): fires the simulator's schedules at
    # the steps it counts, beside the simulator, below everything that starts it
    "proxy": (("elastic_dew.proxy",), ("compat", "runtime", "elastic", "fault text", "simulator")),
    # the package root only re-exports the Trainer (lazily)
    "training": (
        ("elastic_dew.trainer", "elastic_dew.train_config", "elastic_dew.record",
         "elastic_dew.observe", "elastic_dew.your_loop", "elastic_dew"),
        ("compat", "runtime", "elastic"),
    ),
    # Planning a run at scale: reads run records, writes fault schedules' text
    "plan": (("elastic_dew.plan",), ("compat", "runtime", "elastic", "fault text", "training")),
    # The run (plan, check, execute) and its terminal face: recipes call them from main(),
    # and they load recipes by name at run time, never by import.
    "run": (("elastic_dew.run", "elastic_dew.console", "elastic_dew.terminal"),
            ("compat", "runtime", "elastic", "fault text", "simulator", "proxy", "training")),
    "recipes": (("elastic_dew.recipes",), ("compat", "runtime", "elastic", "training", "run")),
    # the chaos harness (scenarios, runner, invariants) and the supervisor that re-runs a
    # program after 143 or a kill, as a JobSet does
    "harness": (
        ("elastic_dew.testing", "elastic_dew.supervisor"),
        ("compat", "runtime", "elastic", "fault text", "simulator", "proxy", "training", "run"),
    ),
    # the command line and its program entry points (python -m elastic_dew, python -m
    # elastic_dew.chaos)
    "cli": (
        ("elastic_dew.commands", "elastic_dew.cli", "elastic_dew.k8s", "elastic_dew.chaos", "elastic_dew.__main__"),
        ("compat", "runtime", "elastic", "fault text", "simulator", "proxy", "training", "plan", "run", "recipes",
         "harness"),
    ),
}

#: The elastic layer's packages, bottom up: each may import only itself and those before it.
#: A module directly in ``elastic_dew/elastic/`` is a shared definition (config, events, the
#: loop's channel ``hooks``, the step deadline), which every package reads.
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
    for root in ("elastic_dew",):
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
    return {n for n in names if n.split(".")[0] == "elastic_dew"}


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


def test_the_planner_reads_the_simulators_fault_text_and_nothing_else_of_the_simulator():
    assert _layer("elastic_dew.simulate.fault_token") == "fault text"
    assert _layer("elastic_dew.simulate.schedule") == "simulator"
    importers = {module for module, path in _modules()
                 if any(_layer(name) == "fault text" for name in _imports(path))}
    assert {"elastic_dew.plan.faults", "elastic_dew.simulate.schedule"} <= importers
    assert "simulator" not in _may_import("plan") and "fault text" in _may_import("plan")
    assert _imports(REPO / "elastic_dew" / "simulate" / "fault_token.py") == set()


def test_the_simulator_is_imported_only_from_the_run_upward():
    allowed = {layer for layer in LAYERS if "simulator" in _may_import(layer)}
    assert allowed == {"simulator", "proxy", "run", "harness", "cli"}
    importers = {
        module
        for module, path in _modules()
        if any(_layer(name) == "simulator" for name in _imports(path)) and _layer(module) != "simulator"
    }
    assert {"elastic_dew.run.planning", "elastic_dew.run.execution"} <= importers
    assert {module for module in importers if _layer(module) not in allowed} == set()


def test_no_module_below_the_command_line_imports_the_commands():
    below = [(module, path) for module, path in _modules() if _layer(module) != "cli"]
    assert {"elastic_dew.run", "elastic_dew.testing", "elastic_dew.recipes.lm"} <= {module for module, _ in below}
    offenders = [
        f"{module} imports {imported}"
        for module, path in below
        for imported in _imports(path)
        if imported == "elastic_dew.commands" or imported.startswith("elastic_dew.commands.")
    ]
    assert offenders == []


# ------------------------------------------------------------------ the loop's channel

#: The loop's one instrumentation channel (phases under way, events that happened).
CHANNEL = "elastic_dew.elastic.hooks"
#: Its calls, by what they do: hear it, announce a phase, tell an event.
_LISTEN, _ANNOUNCE, _TELL = {"add_listener", "remove_listener", "listening"}, {"phase"}, {"emit"}
#: Who may hear the channel: the run itself (its sink, while it runs: the run record and the
#: displays), the simulator (what the program does, the faults to fire at phases and those
#: fired), the local Pathways backend's forwarding, and the chaos harness.
CHANNEL_LISTENERS = ("elastic_dew.elastic.loop", "elastic_dew.simulate", "elastic_dew.proxy", "elastic_dew.testing")
#: Who may announce a phase on it: the loop and its state tiers, nothing else.
CHANNEL_ANNOUNCERS = ("elastic_dew.elastic.loop", "elastic_dew.elastic.state")
#: Who may tell an event on it: the loop (its own events) and the simulator (each fault it fires).
CHANNEL_TELLERS = ("elastic_dew.elastic.loop", "elastic_dew.simulate")


def _channel_calls(path: Path) -> set[str]:
    """The channel's functions a module names: ``hooks.X`` where ``hooks`` is bound to the
    channel by an import, and each name imported from it."""
    bound, names = set(), set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == CHANNEL:
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and f"{node.module}.hooks" == CHANNEL:
            bound.update(alias.asname or alias.name for alias in node.names if alias.name == "hooks")
        elif isinstance(node, ast.Import):
            bound.update(alias.asname for alias in node.names if alias.name == CHANNEL and alias.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            names.add(node.attr)
    return names


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def test_only_the_run_the_simulator_the_backends_forwarding_and_the_harness_listen_to_the_loops_channel():
    calls = {module: _channel_calls(path) for module, path in _modules()}
    listeners = {module for module, names in calls.items() if names & _LISTEN}
    # the run's sink, the simulator, the proxy's forwarding and the chaos harness all listen
    assert {"elastic_dew.elastic.loop.protocol", "elastic_dew.simulate.simulator", "elastic_dew.simulate.runner",
            "elastic_dew.proxy.announce", "elastic_dew.testing.runner"} <= listeners
    assert sorted(m for m in listeners if not _under(m, CHANNEL_LISTENERS)) == []


def test_only_the_loop_announces_phases_and_only_the_loop_and_the_simulator_tell_events():
    calls = {module: _channel_calls(path) for module, path in _modules()}
    announcers = {module for module, names in calls.items() if names & _ANNOUNCE}
    tellers = {module for module, names in calls.items() if names & _TELL}
    assert {"elastic_dew.elastic.loop.protocol", "elastic_dew.elastic.state.tiers"} <= announcers
    assert {"elastic_dew.elastic.loop.protocol", "elastic_dew.simulate.runner"} <= tellers
    assert sorted(m for m in announcers if not _under(m, CHANNEL_ANNOUNCERS)) == []
    assert sorted(m for m in tellers if not _under(m, CHANNEL_TELLERS)) == []


def test_the_channel_check_finds_a_listener_an_announcer_and_a_teller_however_the_channel_is_imported(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "from elastic_dew.elastic import hooks\nimport elastic_dew.elastic.hooks as channel\n"
        "from elastic_dew.elastic.hooks import listening\n"
        "hooks.phase('step', 1)\nchannel.emit(None)\nother.add_listener(f)\n"
    )
    assert _channel_calls(source) == {"phase", "emit", "listening"}


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


# ------------------------------------------------------------------ the seam for other libraries' internals

#: The libraries whose private names only the seam (``elastic_dew._compat``) may touch.
LIBRARIES = ("jax", "jaxlib", "orbax", "grain", "pathwaysutils", "argparse", "ml_goodput_measurement",
             "threading", "atexit")
SEAM = "elastic_dew._compat"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _outside_the_seam():
    for module, path in _modules():
        if module != SEAM and not module.startswith(SEAM + "."):
            yield module, path


def _seam_names() -> frozenset[str]:
    """The underscore names the seam declares (each private member's last attribute)."""
    from elastic_dew import _compat

    names = {point.name for points in _compat.all_private().values() for point in points}
    return frozenset(name for name in names if _private(name)) | {"_impl"}


_SEAM_NAMES = _seam_names()


def _library_imports(tree: ast.AST) -> list[tuple[str, str | None, str]]:
    """Every import of :data:`LIBRARIES` in ``tree``: (module, imported name or None, bound name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    found.append((alias.name, None, alias.asname or alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in LIBRARIES:
                found.extend((node.module, alias.name, alias.asname or alias.name) for alias in node.names)
    return found


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, ``None`` for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _root(node: ast.AST) -> str | None:
    """What an expression is made from: a call's function, an attribute's or subscript's object."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript, ast.Await)):
        node = node.func if isinstance(node, ast.Call) else node.value
        dotted = _dotted(node)
        if dotted is not None:
            return dotted
    return _dotted(node)


def _library_objects(tree: ast.AST) -> set[str]:
    """The names (and ``self.x`` attributes) that hold a library's module, class or object:
    bound by an import of one, or assigned from an expression made from one."""
    held = {bound for _, _, bound in _library_imports(tree)}
    # a parameter annotated with a library's type (``parser: argparse.ArgumentParser``)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotation = node.annotation
            if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
                try:
                    annotation = ast.parse(annotation.value, mode="eval").body
                except SyntaxError:
                    continue
            if _held_by(_dotted(annotation), held):
                held.add(node.arg)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if not _held_by(_root(value), held):
                continue
            for target in targets:
                name = _dotted(target)
                if name is not None and name not in held:
                    held.add(name)
                    changed = True
    return held


def _held_by(name: str | None, held: set[str]) -> bool:
    return name is not None and any(name == h or name.startswith(h + ".") for h in held)


def _underscore_uses(tree: ast.AST, seam_names: bool = True) -> list[str]:
    """Each non-dunder underscore attribute read or written on a library's object (and, with
    ``seam_names``, one of the seam's names on any object but ``self``)."""
    held = _library_objects(tree)
    imported = {bound for _, _, bound in _library_imports(tree)}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = _dotted(node.value)
            if _held_by(owner, held):
                uses.append(f"line {node.lineno}: {owner}.{node.attr}")
            elif seam_names and node.attr in _SEAM_NAMES and owner not in ("self", "cls") and not (
                isinstance(node.value, ast.Call) and _dotted(node.value.func) == "super"
            ):
                # one of the seam's names, on an object no import says is a library's
                # (``recorder._cloud_logger``, ``a.dtype._impl``)
                uses.append(f"line {node.lineno}: {owner or '(expression)'}.{node.attr} (a name the seam declares)")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _held_by(_dotted(node.value), imported):
            # a library's module or class rebound from outside the seam
            uses.append(f"line {node.lineno}: {_dotted(node)} = ... (rebinds a library's name)")
        if isinstance(node, ast.ClassDef):
            # A subclass of a library's class: its private methods override the library's,
            # and super()._x calls the library's.
            bases = [_dotted(base) for base in node.bases]
            if not any(_held_by(base, held) for base in bases):
                continue
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name):
                    uses.append(f"line {item.lineno}: {node.name}.{item.name} (overrides {', '.join(map(str, bases))}'s)")
            for inner in ast.walk(node):
                if (isinstance(inner, ast.Attribute) and _private(inner.attr) and isinstance(inner.value, ast.Call)
                        and _dotted(inner.value.func) == "super"):
                    uses.append(f"line {inner.lineno}: super().{inner.attr}")
    return uses


def test_the_seam_is_the_lowest_layer_and_imports_only_the_libraries():
    seam = [(module, path) for module, path in _modules() if module == SEAM or module.startswith(SEAM + ".")]
    assert {f"{SEAM}.jax", f"{SEAM}.orbax", f"{SEAM}.grain", f"{SEAM}.pathwaysutils", f"{SEAM}.argparse"} <= {
        module for module, _ in seam
    }
    offenders = [
        f"{module} imports {imported}"
        for module, path in seam
        for imported in _imports(path)
        if imported != SEAM and not imported.startswith(SEAM + ".")
    ]
    assert offenders == []
    assert all("compat" in _may_import(layer) for layer in LAYERS) and list(LAYERS)[0] == "compat"


def test_no_module_outside_the_seam_imports_a_private_name_of_the_libraries():
    offenders = []
    for module, path in _outside_the_seam():
        for imported, name, _ in _library_imports(ast.parse(path.read_text())):
            parts = imported.split(".") + ([name] if name else [])
            if any(_private(part) for part in parts):
                offenders.append(f"{module}: {imported}{'' if name is None else ' import ' + name}")
    assert offenders == [], "private names of other libraries belong in elastic_dew._compat:\n" + "\n".join(offenders)


def test_no_module_outside_the_seam_reads_a_private_name_of_the_interpreters_sys_module():
    """``sys._getframe`` and the like are the interpreter's private names: the seam's, or a
    public spelling (``inspect.currentframe``)."""
    offenders = [
        f"{module}:{node.lineno} sys.{node.attr}"
        for module, path in _outside_the_seam()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys"
        and _private(node.attr)
    ]
    assert offenders == [], "the interpreter's private names belong in elastic_dew._compat:\n" + "\n".join(offenders)


#: The tests' own seam for the private names only the tests use (``tests/test_compat.py`` checks it).
TESTS_SEAM = "private_names.py"


def test_no_test_outside_the_tests_seam_imports_a_private_name_of_the_libraries():
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == TESTS_SEAM:
            continue
        for imported, name, _ in _library_imports(ast.parse(path.read_text())):
            parts = imported.split(".") + ([name] if name else [])
            if any(_private(part) for part in parts):
                offenders.append(f"{path.relative_to(REPO)}: {imported}{'' if name is None else ' import ' + name}")
    assert offenders == [], (
        "a private name of another library belongs in elastic_dew._compat, or, used by tests alone, in "
        f"tests/{TESTS_SEAM}:\n" + "\n".join(offenders)
    )


#: The tests of the seams themselves, which look at the private names they declare.
SEAM_TESTS = ("test_compat.py", "test_orbax_adapter.py", "test_grain_adapter.py")


def test_no_test_outside_the_seams_tests_takes_an_underscore_attribute_from_the_libraries_objects():
    offenders = [
        f"{path.relative_to(REPO)} {use}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path.name not in (TESTS_SEAM, *SEAM_TESTS)
        for use in _underscore_uses(ast.parse(path.read_text()), seam_names=False)
    ]
    assert offenders == [], (
        f"private members of other libraries belong in elastic_dew._compat or tests/{TESTS_SEAM}:\n" + "\n".join(offenders)
    )


def test_no_module_outside_the_seam_takes_an_underscore_attribute_from_the_libraries_objects():
    offenders = [
        f"{module} {use}"
        for module, path in _outside_the_seam()
        for use in _underscore_uses(ast.parse(path.read_text()))
    ]
    assert offenders == [], "private members of other libraries belong in elastic_dew._compat:\n" + "\n".join(offenders)


def test_the_underscore_check_finds_reads_writes_and_overrides_through_names_and_what_they_made():
    source = (
        "import argparse\nimport orbax.checkpoint as ocp\nfrom x import y\n"
        "parser = argparse.ArgumentParser()\nparser._actions\n"
        "handler = ocp.StandardCheckpointHandler()\nhandler._impl = 1\n"
        "class F(argparse.HelpFormatter):\n    def _get_help_string(self, a):\n        return super()._get_help_string(a)\n"
        "class Mine:\n    def __init__(self):\n        self.recorder = ocp.Recorder()\n"
        "    def f(self, p: argparse.ArgumentParser):\n"
        "        return self.recorder._cloud_logger, y._fine, self._own, argparse.__name__, p._defaults\n"
        "ocp.utils.is_pathways_backend = bool\nparser.prog = 'fine'\n"
        "restore = lambda x, a: a.dtype._impl\n"
    )
    found = sorted(use.split(": ", 1)[1].split(" ")[0] for use in _underscore_uses(ast.parse(source)))
    assert found == sorted([
        "parser._actions", "handler._impl", "F._get_help_string", "super()._get_help_string",
        "self.recorder._cloud_logger", "p._defaults", "ocp.utils.is_pathways_backend", "a.dtype._impl",
    ])
