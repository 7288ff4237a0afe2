"""One rank of a test pool, started by ``elastic-dew launch`` from tests/test_launch_pool.py.

It joins the pool through ``prepare_process(multi_host=True)``, prints its pid, the run
timestamp (rank > 0 asks for it a moment later, so a local clock would differ), then
counts steps, asking the ``PreemptionNotice`` at each one, until the notice is reached
and it raises ``Preempted`` uncaught. Each line it prints is read by the test.
"""

import os
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"

from elastic_dew.runtime import (  # noqa: E402
    Preempted,
    PreemptionNotice,
    install_exit_hook,
    prepare_process,
    run_timestamp,
)

install_exit_hook()  # the uncaught Preempted below exits 143
prepare_process(multi_host=True)

import jax  # noqa: E402

rank = jax.process_index()
print(f"pid {os.getpid()} count {jax.process_count()}", flush=True)
if rank > 0:
    time.sleep(1.2)
print(f"timestamp {run_timestamp()}", flush=True)

notice = PreemptionNotice()
step = 0
while True:
    if notice.reached(step):
        # interrupts(): a pooled notice never cuts work between boundaries short.
        print(f"stopped at {step} interrupts {notice.interrupts()}", flush=True)
        notice.close()
        raise Preempted(step)
    if step == 3:
        print("running", flush=True)
    time.sleep(0.05)
    step += 1
    if step > 2000:
        print("no notice after 2000 steps", flush=True)
        sys.exit(3)
