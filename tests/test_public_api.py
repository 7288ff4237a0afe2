"""The public API keeps its word: its signatures are a checked-in snapshot, its names a docs
page, and each public routine's docstring has its Args/Returns/Raises.

The list of public names, the snapshot and the page are :mod:`public_api`'s (this directory);
``python tests/public_api.py --write`` regenerates both files after a deliberate change.
"""

from __future__ import annotations

from pathlib import Path

import public_api
from conftest import REPO

_HOW = (
    "If the change is deliberate, regenerate with `{command}` and add a line to CHANGELOG.md "
    "under the coming version (Added, Changed, Deprecated or Removed; a renamed or moved public name "
    "keeps working from its old place for one minor version, with a DeprecationWarning naming "
    "the new one: elastic_dew._deprecation)."
).format(command=public_api.REGENERATE)

def _fail_with_diff(path: Path, expected: str, actual: str) -> None:
    raise AssertionError(
        f"the public API differs from {path.relative_to(REPO)}:\n"
        f"{public_api.diff(expected, actual, str(path.relative_to(REPO)))}\n{_HOW}"
    )


def test_every_public_signature_matches_the_checked_in_snapshot():
    expected, actual = public_api.SNAPSHOT.read_text(), public_api.snapshot()
    if expected != actual:
        _fail_with_diff(public_api.SNAPSHOT, expected, actual)


def test_the_docs_page_lists_every_public_name_with_its_contract_and_is_in_the_site_nav():
    expected, actual = public_api.DOCS_PAGE.read_text(), public_api.docs_page()
    if expected != actual:
        _fail_with_diff(public_api.DOCS_PAGE, expected, actual)
    missing = [name for name, obj in public_api.public_names().items() if not public_api.contract(name, obj)]
    assert not missing, f"public names without a docstring or #: comment to take a contract from: {missing}"
    assert "api.md" in (REPO / "mkdocs.yml").read_text()


def test_each_public_routine_documents_its_arguments_what_it_returns_and_what_it_raises():
    """Args when it takes arguments (a dataclass: its fields), Returns when it returns
    something, Raises when its own body raises."""
    lacking = public_api.sections_lacking()
    assert not lacking, f"public docstrings without the sections they owe (write Args:, Returns:, Raises:): {lacking}"


def test_the_snapshot_fails_with_a_diff_and_how_to_regenerate_when_a_signature_changes(tmp_path):
    expected = public_api.SNAPSHOT.read_text()
    line = next(line for line in expected.splitlines() if line.startswith("elastic_dew.TrainConfig: "))
    changed = expected.replace(line, line.replace("log_every: int = 10", "log_every: int = 20"))
    assert changed != expected
    try:
        _fail_with_diff(public_api.SNAPSHOT, changed, expected)
    except AssertionError as error:
        text = str(error)
    assert f"-{line.replace('log_every: int = 10', 'log_every: int = 20')}" in text
    assert f"+{line}" in text
    assert "python tests/public_api.py --write" in text and "CHANGELOG.md" in text


def test_a_wrong_keyword_to_any_public_constructor_names_the_class_and_no_private_method():
    import inspect
    import re
    import typing

    for qualified, cls in public_api.public_names().items():
        if not inspect.isclass(cls) or issubclass(cls, BaseException) or typing.Protocol in cls.__mro__:
            continue
        try:
            cls(wrong_keyword=1)
        except TypeError as error:
            text = str(error)
        else:
            raise AssertionError(f"{qualified}(wrong_keyword=1) was accepted")
        assert text.startswith(cls.__name__), f"{qualified}: {text}"
        assert not re.search(r"(?<![\w.])_[A-Za-z]|\._[A-Za-z]", text), f"{qualified} names a private name: {text}"


def test_the_package_version_is_the_one_pyproject_declares_and_the_changelog_heads():
    import importlib.metadata
    import re
    import tomllib

    import elastic_dew

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert elastic_dew.__version__ == declared == importlib.metadata.version("elastic-dew")
    first = re.search(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert first and first.group(1) == declared


def test_the_signature_snapshot_stays_a_surface_a_user_can_hold_in_their_head():
    """Not more than 300 lines (275 before the pieces for a loop of your own joined): a name that
    joins the public list is a decision."""
    assert len(public_api.SNAPSHOT.read_text().splitlines()) <= 300
