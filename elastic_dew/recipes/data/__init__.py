"""Deterministic training data for the recipes, generated in code (nothing is downloaded)."""

from elastic_dew.recipes.data.corpus import VOCABULARY, corpus, decode, encode

__all__ = ["VOCABULARY", "corpus", "decode", "encode"]
