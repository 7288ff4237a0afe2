"""Run a program as a Pathways program starts: ``pathwaysutils.initialize()`` first, then the program.

On a Pathways cluster, and through the local Pathways backend, a program reaches its devices
only once ``pathwaysutils.initialize()`` has registered the proxy backend; a program written
to be imported into a launcher that does so leaves it out. This launcher runs such a program
(``runpy``, as ``python PROGRAM ARGS`` would) after it; in-process it changes nothing.

    python as_pathways_program.py PROGRAM [ARGS...]
"""

import os
import runpy
import sys

import pathwaysutils

pathwaysutils.initialize()

if __name__ == "__main__":
    program = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    runpy.run_path(program, run_name="__main__")
