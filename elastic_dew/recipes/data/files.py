"""Training data from files: text tokenized into ArrayRecord shards, read back through Grain.

``elastic-dew data prepare --out DIR TEXT_FILE...`` calls :func:`prepare`; ``elastic-dew
train lm --set data=DIR`` reads the shards with :func:`load`. A prepared directory holds

- ``data-00000-of-0000N.array_record`` ... : one record per example, ``seq_len + 1`` token
  ids as little-endian ``int32`` (the ``lm`` recipe's characters, :data:`VOCABULARY`),
  written with ``group_size:1`` so that any record is read without its neighbours (what
  random access by global index needs);
- ``dataset.json``: the format, ``seq_len``, the vocabulary, the shard names and the
  example count, so a reader can refuse files it would misread.

The text is tokenized as the ``lm`` recipe's synthetic corpus is: lower-cased, every run of
whitespace one space, and characters outside the vocabulary dropped (their count is
reported). The token stream of all files, in the order given, is cut into non-overlapping
windows of ``seq_len + 1`` tokens (the last partial one dropped), and the windows are
split into ``shards`` contiguous shards of near-equal size.

:func:`load` returns a ``grain.MapDataset`` over ``grain.sources.ArrayRecordDataSource``
whose decoding is a module-level function, so Grain worker processes can unpickle it.
On GKE the directory is usually a Cloud Storage bucket mounted by Cloud Storage FUSE
(``/gcs/...``): ArrayRecord reads it as local files.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from elastic_dew.recipes.data.corpus import VOCABULARY

__all__ = ["FORMAT", "MANIFEST", "decode", "load", "prepare", "read_manifest", "tokenize"]

logger = logging.getLogger(__name__)

#: The manifest's file name and format tag.
MANIFEST = "dataset.json"
FORMAT = "elastic-dew-tokens-1"

_TABLE = np.full(0x110000, -1, dtype=np.int32)


def _table() -> np.ndarray:
    if _TABLE[ord("a")] < 0:
        for i, c in enumerate(VOCABULARY):
            _TABLE[ord(c)] = i
    return _TABLE


def tokenize(text: str) -> tuple[np.ndarray, int]:
    """``(token ids, characters dropped)`` of ``text`` under the ``lm`` recipe's vocabulary."""
    normal = re.sub(r"\s+", " ", text.lower())
    codes = np.frombuffer(normal.encode("utf-32-le"), dtype=np.uint32)
    ids = _table()[np.minimum(codes, 0x10FFFF)]
    kept = ids[ids >= 0]
    return kept.astype(np.int32), int(len(ids) - len(kept))


def decode(record: bytes) -> dict[str, np.ndarray]:
    """One example: ``{"tokens": int32[seq_len + 1]}`` from its ArrayRecord record."""
    return {"tokens": np.frombuffer(record, dtype="<i4").astype(np.int32)}


def _shard_name(index: int, count: int) -> str:
    return f"data-{index:05d}-of-{count:05d}.array_record"


def prepare(texts: Iterable[str | Path], out: str | Path, *, seq_len: int = 64, shards: int = 4) -> dict[str, Any]:
    """Tokenize ``texts`` (paths of UTF-8 text files) into ArrayRecord shards under ``out``.

    Returns the manifest written to ``out/dataset.json``. Raises ``ValueError`` (before
    anything is written) for a bad ``seq_len``/``shards``, a missing file, text too short
    for ``shards`` examples, or an ``out`` that already holds a prepared dataset or other
    files.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be an int >= 1")
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards={shards!r} must be an int >= 1")
    paths = [Path(p) for p in texts]
    if not paths:
        raise ValueError("no text file given; name one or more UTF-8 text files")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"{', '.join(missing)}: no such file; name UTF-8 text files")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; choose a new --out directory")
    streams, dropped = [], 0
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
        ids, lost = tokenize(text)
        streams.append(ids)
        dropped += lost
    tokens = np.concatenate(streams) if streams else np.zeros(0, np.int32)
    width = seq_len + 1
    examples = len(tokens) // width
    if examples < shards:
        raise ValueError(
            f"the text gives {len(tokens)} tokens, {examples} examples of seq_len + 1 = {width}: "
            f"fewer than the {shards} shards; give more text, a smaller seq_len or fewer shards"
        )
    windows = tokens[: examples * width].reshape(examples, width).astype("<i4")
    out.mkdir(parents=True, exist_ok=True)
    names, bounds = [], np.linspace(0, examples, shards + 1).astype(int)
    for index in range(shards):
        name = _shard_name(index, shards)
        writer = ArrayRecordWriter(str(out / name), "group_size:1")
        for row in windows[bounds[index] : bounds[index + 1]]:
            writer.write(row.tobytes())
        writer.close()
        names.append(name)
    manifest = {
        "format": FORMAT, "seq_len": seq_len, "vocabulary": VOCABULARY, "examples": int(examples),
        "shards": names, "tokens": int(examples * width), "dropped_characters": dropped,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    logger.info("%d examples of %d tokens in %d shards under %s (%d characters dropped)",
                examples, width, shards, out, dropped)
    return manifest


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The checked manifest of a prepared directory; ``ValueError`` saying what is wrong."""
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise ValueError(
            f"{directory} holds no {MANIFEST}: prepare it with `elastic-dew data prepare --out {directory} TEXT_FILE...`"
        )
    try:
        manifest = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); prepare the directory again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not an {FORMAT} manifest; prepare the directory again")
    if manifest.get("vocabulary") != VOCABULARY:
        raise ValueError(f"{directory} was tokenized with another vocabulary; prepare it again with this version")
    missing = [name for name in manifest["shards"] if not (directory / name).is_file()]
    if missing:
        raise ValueError(f"{directory} lacks the shards {', '.join(missing)} its {MANIFEST} lists")
    return manifest


def load(directory: str | Path):
    """``(grain.MapDataset of {"tokens": int32[seq_len + 1]}, manifest)`` of a prepared directory."""
    import grain

    manifest = read_manifest(directory)
    source = grain.sources.ArrayRecordDataSource([str(Path(directory) / name) for name in manifest["shards"]])
    if len(source) != manifest["examples"]:
        raise ValueError(
            f"{directory}'s shards hold {len(source)} records, its {MANIFEST} says {manifest['examples']}; "
            "prepare the directory again"
        )
    return grain.MapDataset.source(source).map(decode), manifest
