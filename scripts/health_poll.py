"""How long one poll of the slices' health takes, with pathwaysutils' own checker and with
elastic_dew's (docs/harden-your-loop.md), on N simulated slices of one CPU device each.

    python scripts/health_poll.py [N]        # default 32

Prints the first poll and the median of the next five for each checker. The first poll of
elastic_dew's checker compiles each slice's probe once; pathwaysutils' compiles them at every
poll.
"""

import os
import sys
import time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 32
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={N}"

from pathwaysutils.elastic import elastic as pw_elastic  # noqa: E402

from elastic_dew.elastic.slices import health  # noqa: E402
from elastic_dew.simulate import SimulatedSlices  # noqa: E402

with SimulatedSlices(N, 1) as simulated:
    slice_to_devices = {index: simulated.slice_to_devices[index] for index in range(N)}
    for name, use in (("pathwaysutils' DefaultSliceHealthChecker", health.uninstall),
                      ("elastic_dew's ReusableSliceHealthChecker", health.install)):
        use()
        times = []
        for _ in range(6):
            began = time.perf_counter()
            active = pw_elastic.get_active_slice_indices(slice_to_devices, None)
            times.append(time.perf_counter() - began)
        assert len(active) == N, active
        print(f"{name}: first poll {times[0]:.3f} s, next polls (median) {sorted(times[1:])[2]:.3f} s")
