"""``python -m elastic_dew.chaos --seed N``: the chaos command's replay entry point.

Every failed scenario prints this one-line replay command, so it keeps working as a module
of its own. It is only an entry point: the harness (scenarios, runner, invariants) lives in
:mod:`elastic_dew.testing` and the command in :mod:`elastic_dew.commands.chaos`; import
those, not this.
"""

from __future__ import annotations

import sys

from elastic_dew.commands.chaos import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
