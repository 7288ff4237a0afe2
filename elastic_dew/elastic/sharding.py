"""Deprecated: this module moved to :mod:`elastic_dew.elastic.slices.sharding`; its names resolve there with a warning."""

from elastic_dew.elastic._moved import moved

__getattr__ = moved(__name__, "elastic_dew.elastic.slices.sharding")
