"""The example of the own-loop page (``docs/your-own-loop.md``), as the page gives it for a real cluster.

Schedules: lose:3@8,restore:3@16; lose:1@4,lose:2@8; hang:1@5,lose:1@+2; preempt@22

The page's one Python block, read from the page at run time, with ``SIMULATE = False`` (as
on a cluster: the simulator stands in for the slices), run in a directory ``own`` under the
working directory.

    python own_loop_page.py [DIRECTORY [STEPS]]

Prints ``done at step N`` at the end.
"""

import os
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "your-own-loop.md"


def _code() -> str:
    (code,) = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    return code.replace("SIMULATE = True", "SIMULATE = False")


def main(argv=None):
    """The page's ``main`` in this process (the caller has started JAX and the simulator)."""
    argv = list(argv or [])
    namespace = {"__name__": "own_loop_page_example", "__file__": str(PAGE)}
    exec(compile(_code(), str(PAGE), "exec"), namespace)
    run_dir = Path(argv[0] if argv else "own").absolute()
    run_dir.mkdir(parents=True, exist_ok=True)
    namespace["main"](run_dir, *(int(a) for a in argv[1:2]))


if __name__ == "__main__":
    # As the page runs: its exit hook, its process preparation, its main.
    sys.argv = [str(PAGE), *(sys.argv[1:] or [os.path.abspath("own")])]
    exec(compile(_code(), str(PAGE), "exec"), {"__name__": "__main__", "__file__": str(PAGE)})
