"""One name per concept: no two module-level classes of the package share a name, and each
word the glossary (``docs/architecture.md``, "One word, one meaning") defines names one thing.
"""

from __future__ import annotations

import ast
import collections
import re

from conftest import REPO

GLOSSARY = REPO / "docs" / "architecture.md"


def _trees():
    for path in sorted((REPO / "elastic_dew").rglob("*.py")):
        yield path.relative_to(REPO), ast.parse(path.read_text())


def _glossary() -> list[tuple[str, str, str]]:
    """Each row of the glossary: (word, what it means, what it never is)."""
    text = GLOSSARY.read_text()
    section = text.split("## One word, one meaning", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("*"):
            rows.append((cells[0].strip("*"), cells[1], cells[2]))
    return rows


def test_no_two_module_level_classes_of_the_package_share_a_name():
    homes = collections.defaultdict(list)
    for path, tree in _trees():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(str(path))
    shared = {name: paths for name, paths in homes.items() if len(paths) > 1}
    assert not shared, f"module-level classes sharing a name (give each concept its own): {shared}"


def test_a_noun_of_the_glossary_is_a_module_level_name_only_where_the_glossary_says():
    """A capitalised word (``Program``, ``Fault``, ``Plan``, ``Outcome``) may be a class or a
    function at module level only in the modules its meaning names (``elastic_dew.x.Word``)."""
    nouns = [(word, means) for word, means, _ in _glossary() if word[:1].isupper()]
    assert {"Program", "Fault", "Plan", "Outcome", "Bound"} <= {word for word, _ in nouns}
    wrong = []
    for word, means in nouns:
        allowed = {m.rsplit(".", 1)[0] for m in re.findall(rf"elastic_dew(?:\.\w+)*\.{word}\b", means)}
        for path, tree in _trees():
            module = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
            for node in tree.body:
                if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == word:
                    if not any(module == a or module.startswith(a + ".") for a in allowed):
                        wrong.append(f"{module}.{word}")
    assert not wrong, f"glossary nouns defined where the glossary does not say they mean it: {wrong}"


def test_no_function_or_method_of_the_package_goes_by_a_name_the_glossary_rules_out():
    never = {name: word for word, _, no in _glossary() for name in re.findall(r"`(\w+)`", no)}
    assert {"slices_changed", "bind", "slices_lost"} <= set(never)
    found = [f"{path}:{node.lineno} {node.name} (say {never[node.name]})"
             for path, tree in _trees() for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in never]
    assert not found, f"names the glossary rules out: {found}"
