"""pathwaysutils' own elastic workload (``simple_model_elastic.py``) started as a Pathways
program starts: ``pathwaysutils.initialize()`` first, which, under ``JAX_PLATFORMS=proxy``,
registers the IFRT proxy backend (elsewhere it changes nothing). It imports nothing of
elastic_dew; the proxy-boundary tests run it through the local Pathways backend.

    python pathways_initialized.py STEPS [MIN_SLICES|all] [POLL_INTERVAL|default]
"""

import sys

import pathwaysutils

pathwaysutils.initialize()

from simple_model_elastic import main  # noqa: E402 - after initialize(), as Pathways programs do

if __name__ == "__main__":
    argv = sys.argv[1:]
    minimum = None if len(argv) < 2 or argv[1] == "all" else int(argv[1])
    poll = None if len(argv) < 3 or argv[2] == "default" else float(argv[2])
    main(int(argv[0]), minimum, poll)
