"""The documentation: the site builds with ``mkdocs build --strict`` (broken links fail), and the
pages a user reads (``README.md`` and every ``docs/*.md``) are written for that user, not as the
project's development log: no issue numbers, no commit hashes, no narrative of who built or
measured something, in which sitting or under what machine load.

Each pattern is tested on sentences it must flag and on technical sentences it must leave alone
(a pytest or gRPC session, an upstream bug such as ``orbax#392``, a link anchor ``page.md#4-x``,
a checksum in a program's printed output).
"""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO
import pytest

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# One of this project's issues: "issue 12", "Issues 31 and 42", "issue #5", or a bare "#12". An
# upstream project's issue written as ``name#123`` (a word right before the ``#``), a link anchor
# (``page.md#4-compilation-cache``, ``(#4-x)``) and an HTML entity (``&#123;``) are not.
ISSUE = re.compile(r"\bissues?\s+#?\d+\b|(?<![\w/&#.-])#\d+(?![\w-])", re.IGNORECASE)

# A commit hash: 7 to 40 lowercase hex characters as a word, with at least one digit and one letter
# (so neither "deadbeef", nor "1000000", nor a 64-character image digest counts). Fenced code blocks
# are left out of this check only: a program's printed output holds digests and ids in hex.
COMMIT = re.compile(r"(?<![\w:])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w])")

# The development log: who built or measured something, in which sitting, under what load.
DIARY = re.compile(
    r"\bthis session\b|\b(?:in|through|during) (?:one|that|an earlier|a later|the same) session\b"
    r"|\bsittings?\b|\bengineers?\b|\bload averages?\b|\bat (?:a )?load (?:of )?(?:about )?\d"
    r"|\b(?:was|were) shared (?:by|with)\b|\bshared with (?:\w+ )?(?:other )?(?:tests|sessions|runs)\b",
    re.IGNORECASE,
)


def _prose_lines(text: str):
    """Each line with its number and whether it is inside a fenced code block."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            yield number, line, True
            continue
        yield number, line, fenced


def violations(text: str) -> list[str]:
    """Every issue number, commit hash and development-log phrase of one page, as ``line N: ...``."""
    found = []
    for number, line, fenced in _prose_lines(text):
        hits = [m.group(0) for m in ISSUE.finditer(line)] + [m.group(0) for m in DIARY.finditer(line)]
        if not fenced:
            hits += [m.group(0) for m in COMMIT.finditer(line)]
        found += [f"line {number}: {hit!r}" for hit in hits]
    return found


@pytest.mark.parametrize(
    "sentence",
    [
        "The fix for issue 12 made it faster.",
        "Issues 31 and 42 asked for it.",
        "## Recovery scaling (Issue #5)",
        "as #12 reported",
        "Measured at f18f0f7 on the same machine.",
        "commit 85d7bad fixed the leak",
        "(`9447af9`)",
        "new this session",
        "built in one sitting",
        "the 2-core VM was shared by five engineers",
        "2 s on an idle laptop core and 15 s here at load 18.",
        "at a load average of 10-14",
        "at load about 7",
        "on 2 cores shared with four other tests",
    ],
)
def test_the_hygiene_patterns_flag_development_log_sentences(sentence):
    assert violations(sentence), sentence


@pytest.mark.parametrize(
    "sentence",
    [
        "Each test runs in one pytest session; the fixture is session-scoped.",
        "The proxy keeps one gRPC session per controller, and that session's stream closes.",
        "Buckets misbehave (orbax#392: a fifth of saves hanging; Megatron-LM#5281).",
        "See [the cache](runtime.md#4-compilation-cache) and [above](#2-the-mesh).",
        "The digest is a sha256: 0f3c9a1b2d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8.",
        "deadbeef and 1000000 and 0x7f3a2b1c are not hashes.",
        "The loader reloads the payload; the load balancer spreads the load.",
        "Shared memory is shared by the processes of one host.",
        "ML engineering on TPUs.",
        "version 0.2.0, jax 0.10.1, 1,022 passed in 558 s",
    ],
)
def test_the_hygiene_patterns_leave_technical_sentences_alone(sentence):
    assert not violations(sentence), violations(sentence)


def test_a_hash_in_a_programs_printed_output_is_not_a_commit():
    page = "Run it:\n\n```text\nstate digest       4ae549b5bd...\n```\n\nthen commit 4ae549b out of a block.\n"
    assert violations(page) == ["line 7: '4ae549b'"]


@pytest.mark.parametrize("page", PAGES, ids=lambda path: str(path.relative_to(REPO)))
def test_a_user_page_holds_no_issue_numbers_commit_hashes_or_development_log(page):
    found = violations(page.read_text())
    assert not found, f"{page.relative_to(REPO)}:\n" + "\n".join(found)


def test_the_performance_page_shows_the_current_figures_in_about_300_lines():
    lines = (REPO / "docs" / "performance.md").read_text().splitlines()
    assert len(lines) <= 300, f"docs/performance.md has {len(lines)} lines; past measurements live in git"


def test_the_readme_says_what_has_not_run_yet_and_how_to_install_it():
    readme = (REPO / "README.md").read_text()
    status = readme.split("## ", 1)[0]  # the status box comes before the first section
    for words in ("simulated CPU slices", "IFRT proxy", "not yet run", "TPU", "Pathways cluster", "GKE"):
        assert words in status, f"the README's status box does not say {words!r}"
    assert "pip install " in readme and "python -m build --wheel" in readme


def test_the_readmes_set_up_commands_are_the_two_dev_commands():
    readme = (REPO / "README.md").read_text()
    assert re.findall(r"^\./dev \w+", readme, re.M) == ["./dev demo", "./dev test"]


def test_every_page_is_in_the_sites_navigation():
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    listed = set(re.findall(r":\s*([\w-]+\.md)\s*$", nav, re.M))
    pages = {path.name for path in (REPO / "docs").glob("*.md")}
    assert pages == listed, f"not in the nav: {sorted(pages - listed)}; in the nav, missing: {sorted(listed - pages)}"


@pytest.mark.slow
def test_the_docs_site_builds_strictly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()
