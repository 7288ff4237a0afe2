"""Kubernetes objects as stable YAML: a ``#`` header, each object in build order, comments
above the lines they explain (:func:`dump`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

__all__ = ["dump"]


def _annotate(text: str, comments: dict[str, str]) -> str:
    """Insert each comment above the first line whose stripped text starts with its key.

    A key ``"A\\nB"`` matches only a line starting with ``A`` whose next line contains ``B``;
    a key ``"ANCHOR >> A"`` matches only after the first line starting with ``ANCHOR``.
    """
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    pending = dict(comments)
    seen: set[str] = set()
    for i, line in enumerate(lines):
        stripped = line.lstrip(" ")
        for key in list(pending):
            anchor, _, rule = key.rpartition(" >> ")
            first, _, nxt = rule.partition("\n")
            if anchor and not any(s.startswith(anchor) for s in seen):
                continue
            if stripped.startswith(first) and (not nxt or (i + 1 < len(lines) and nxt in lines[i + 1])):
                indent = line[: len(line) - len(stripped)]
                out.append(f"{indent}# {pending.pop(key)}\n")
        seen.add(stripped)
        out.append(line)
    return "".join(out)


def dump(docs: Iterable[dict[str, Any]], header: Iterable[str] = (),
         comments: dict[str, str] | None = None) -> str:
    """Deterministic multi-document YAML: a ``#`` header, then each object in build order.

    Args:
        docs: the objects (a JobSet, its priority class, ...).
        header: the header's lines, each written after ``# ``.
        comments: a comment to write above a key, by key.

    Returns:
        The YAML text.
    """
    head = "".join(f"# {line}".rstrip() + "\n" for line in header)
    bodies = [
        yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)
        for doc in docs
    ]
    text = head + "---\n".join(bodies)
    return _annotate(text, comments) if comments else text
