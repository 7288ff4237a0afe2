"""A snapshot load's donation against a slice lost on another thread.

Orbax's Snapshotter loads a snapshot by joining its replicas with pathwaysutils'
``concatenate_by_mesh_axis``, which donates them; the simulator hands jaxlib views of the
replicas, which jaxlib's CPU client leaves broken, and it breaks them with the GIL
released. A ``lose`` or ``restore`` fired meanwhile by the fault clock's thread marks the
slice's arrays by walking ``jax.live_arrays()``, which asks every live array whether it is
deleted: a broken view among them killed the process with SIGSEGV (a slice lost and
restored a few milliseconds apart, at a loss every 0.1 s). The test makes that
interleaving happen every time, in a process of its own, so a crash fails the test
instead of ending the session."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = [pytest.mark.libraries, pytest.mark.slow]  # starts a process

#: One load, with pathwaysutils' join wrapped underneath the simulator's: once jaxlib has
#: taken the replicas (the views it was handed are broken from there until they are freed),
#: slice 3 is lost on another thread, as the fault clock loses it, and the join waits up to a
#: second for that loss to finish before it returns.
_PROGRAM = """
import threading
import jax, numpy as np
import pathwaysutils.jax as pw
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pathwaysutils.experimental.concatenate_by_mesh_axis import concatenate_by_mesh_axis
from pathwaysutils.experimental.split_by_mesh_axis import split_by_mesh_axis
from elastic_dew.simulate import SimulatedSlices

join, losses = pw.concatenate_by_mesh_axis, []

def join_then_lose(*args, **kwargs):
    joined = join(*args, **kwargs)
    loss = threading.Thread(target=sim.lose, args=(3,))
    loss.start()
    loss.join(timeout=1.0)
    losses.append((loss, loss.is_alive()))
    return joined

pw.concatenate_by_mesh_axis = join_then_lose  # beneath the simulator's wrapper, which it installs over it
with SimulatedSlices(4, 2) as sim:
    pinned = NamedSharding(Mesh(np.asarray(sim.devices).reshape(4, 2, 1), ("replica", "data", "model")),
                           PartitionSpec(), memory_kind="pinned_host")
    replicas = split_by_mesh_axis(jax.device_put(np.ones((64, 256), np.float32), pinned), "replica")
    joined = concatenate_by_mesh_axis(replicas, "replica")
    (loss, waited), = losses
    loss.join(timeout=60)
    print("waited", waited, "lost", sorted(sim.lost), "deleted", all(r.is_deleted() for r in replicas))
"""


def test_a_slice_lost_on_another_thread_while_a_snapshot_load_donates_waits_for_the_donation_to_end():
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _PROGRAM],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, f"exited {done.returncode}: {done.stderr[-3000:]}"
    # The loss waited for the join (its walk of the live arrays never met a broken view),
    # then happened; the replicas read as donated.
    assert done.stdout.splitlines()[-1] == "waited True lost [3] deleted True"
