"""A small synthetic English corpus for the language-model recipe.

Sentences come from a fixed grammar (determiner, adjective, noun, verb, place, with number
agreement between subject and verb) drawn by a seeded NumPy generator, so every machine
builds the same text byte for byte and no download is needed. The text has real structure
at three scales, which is what makes a language model's loss fall visibly within a few
hundred steps: spelling inside words, word order inside sentences, and agreement across them.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["VOCABULARY", "corpus", "encode", "decode"]

_DETERMINERS = ("the", "a", "one", "every", "that")
_ADJECTIVES = ("small", "quiet", "red", "old", "bright", "lazy", "brave", "green", "tall", "cold")
_NOUNS = (
    ("cat", "cats"), ("dog", "dogs"), ("bird", "birds"), ("child", "children"),
    ("river", "rivers"), ("farmer", "farmers"), ("robot", "robots"), ("tree", "trees"),
)
_VERBS = (
    ("sleeps", "sleep"), ("runs", "run"), ("sings", "sing"), ("waits", "wait"),
    ("jumps", "jump"), ("reads", "read"), ("rests", "rest"),
)
_PLACES = (
    "by the sea", "under the bridge", "in the garden", "near the mill",
    "on the hill", "at the station", "inside the house",
)
_ENDINGS = (".", ".", ".", "!", "?")

#: Every character the corpus uses; a character's index is its token id.
VOCABULARY: str = " !.?" + "abcdefghijklmnopqrstuvwxyz"


def _sentence(rng: np.random.Generator) -> str:
    plural = bool(rng.integers(2))
    noun = _NOUNS[rng.integers(len(_NOUNS))][int(plural)]
    verb = _VERBS[rng.integers(len(_VERBS))][int(plural)]
    determiner = "the" if plural else _DETERMINERS[rng.integers(len(_DETERMINERS))]
    words = [determiner]
    if rng.random() < 0.6:
        words.append(_ADJECTIVES[rng.integers(len(_ADJECTIVES))])
    words += [noun, verb]
    if rng.random() < 0.7:
        words.append(_PLACES[rng.integers(len(_PLACES))])
    return " ".join(words) + _ENDINGS[rng.integers(len(_ENDINGS))]


@functools.cache
def corpus(num_chars: int = 200_000, seed: int = 0) -> str:
    """``num_chars`` characters of the synthetic text; the same for the same arguments."""
    if num_chars < 1:
        raise ValueError(f"num_chars={num_chars} must be >= 1")
    rng = np.random.default_rng(seed)
    parts: list[str] = []
    length = 0
    while length < num_chars:
        sentence = _sentence(rng)
        parts.append(sentence)
        length += len(sentence) + 1
    return " ".join(parts)[:num_chars]


def encode(text: str) -> np.ndarray:
    """Token ids (``int32``) of ``text``; a character outside the vocabulary is an error."""
    table = {c: i for i, c in enumerate(VOCABULARY)}
    try:
        return np.fromiter((table[c] for c in text), dtype=np.int32, count=len(text))
    except KeyError as err:
        raise ValueError(f"character {err.args[0]!r} is not in the corpus vocabulary") from None


def decode(tokens) -> str:
    """The text of a sequence of token ids."""
    return "".join(VOCABULARY[int(t)] for t in tokens)
