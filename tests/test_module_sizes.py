"""Modules with one job each: none past about 450 lines unless ``docs/architecture.md`` says
why, and the architecture's module table states no line counts (they go stale)."""

from __future__ import annotations

import re

from conftest import REPO

#: Lines past which a module is split, unless the architecture says why it is not ("about":
#: :data:`SLACK` more lines need no reason yet, so a module is not failed for a few lines).
LIMIT = 450
SLACK = 30
ARCHITECTURE = REPO / "docs" / "architecture.md"
_SECTION = "### Modules over 450 lines"


def _long_modules(limit: int = LIMIT) -> dict[str, int]:
    """Each module of the package (path under ``elastic_dew/``) over ``limit`` lines; a
    generated one (its docstring says ``do not edit``) is not counted."""
    long = {}
    for path in sorted((REPO / "elastic_dew").rglob("*.py")):
        text = path.read_text()
        if "do not edit" in text[:300]:
            continue
        lines = text.count("\n")
        if lines > limit:
            long[path.relative_to(REPO / "elastic_dew").as_posix()] = lines
    return long


def _explained() -> set[str]:
    """The modules the architecture's list explains: the paths that open each of its items
    (``- `a.py`, `b.py`: why``)."""
    text = ARCHITECTURE.read_text()
    start = text.index(_SECTION)
    end = text.find("\n#", start + len(_SECTION))
    heads = re.findall(r"^- ((?:`[\w/]+\.py`(?:, )?)+):", text[start:end if end != -1 else len(text)], flags=re.M)
    return {path for head in heads for path in re.findall(r"`([\w/]+\.py)`", head)}


def test_every_module_over_the_limit_is_named_where_the_architecture_says_why():
    unexplained = {path: lines for path, lines in _long_modules(LIMIT + SLACK).items() if path not in _explained()}
    assert not unexplained, (
        f"modules over about {LIMIT} lines with no reason in {ARCHITECTURE.name}'s '{_SECTION}': {unexplained}; "
        "split each along its seams, or say there why it holds one concept that does not split"
    )


def test_the_list_explains_only_modules_that_are_over_the_limit():
    stale = sorted(_explained() - set(_long_modules()))
    assert not stale, f"{ARCHITECTURE.name} explains modules that are no longer over {LIMIT} lines: {stale}"


def test_the_module_table_states_no_line_counts():
    counted = re.findall(r"^\| `[^`]+\.py` \| \d+ \|", ARCHITECTURE.read_text(), flags=re.M)
    assert not counted, f"hand-written line counts go stale; drop them: {counted[:5]}"
