"""Test-wide setup: simulated CPU devices, set before JAX starts.

Eight host devices are enough for four simulated slices of two devices. Tests that need
another device count, or a fresh process (anything about process start-up, signals or
pools), run a subprocess.
"""

import os
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
