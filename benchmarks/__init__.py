"""Benchmarks of elastic_dew against what users would do instead, measured in one run.

``python -m benchmarks [--quick] [--out DIR]`` writes ``DIR/results.json`` and
``DIR/results.md``. Each metric lives in its own module; :mod:`benchmarks.common` holds the
statistics, the targets and the table. Anything about process start-up, signals or exit
runs as real subprocesses of :mod:`benchmarks.worker`.
"""
