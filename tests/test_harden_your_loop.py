"""The pieces a pathwaysutils loop of your own calls (docs/harden-your-loop.md), each with the
user's own objects: the mesh with the user's axes, the health checker, the step deadline, and
checkpoints on the user's own Orbax ``CheckpointManager``; and the page's example under
``elastic-dew simulate`` with a hang, a loss and its return, and a preemption.

Slices are simulated on the test process's CPU devices (TPU slices cannot exist here); the
real pathwaysutils Manager and Orbax's real ``CheckpointManager`` on a local directory run on
top. A storage that stops answering is the one stand-in: a manager whose wait never ends
(a stalled bucket cannot be made on demand here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from conftest import REPO
from elastic_dew.elastic import StepDeadline, build_mesh
from elastic_dew.elastic.events import Commit
from elastic_dew.elastic.slices import health
from elastic_dew.elastic.slices.retry import make_manager
from elastic_dew.elastic.state.storage import StorageTimeout
from elastic_dew.simulate import SimulatedSlices
from elastic_dew import your_loop

pytestmark = pytest.mark.libraries  # pathwaysutils' Manager, Orbax's CheckpointManager

PROGRAM = REPO / "tests" / "programs" / "harden_your_loop.py"
PAGE = REPO / "docs" / "harden-your-loop.md"


@pytest.fixture
def sim():
    with SimulatedSlices(4, 2) as simulated:
        yield simulated


# ------------------------------------------------------------------ the mesh, your axes


def test_the_mesh_takes_your_axes_and_slice_shape_with_replica_first_over_the_active_slices(sim):
    manager = make_manager()
    manager.active_slice_indices = {0, 2, 3}
    mesh = build_mesh(manager, axes=("replica", "fsdp", "tensor"), slice_shape=(-1, 2))
    assert mesh.axis_names == ("replica", "fsdp", "tensor") and mesh.devices.shape == (3, 1, 2)
    assert list(mesh.devices.flat) == sim.slice_to_devices[0] + sim.slice_to_devices[2] + sim.slice_to_devices[3]
    two = build_mesh(manager, axes=("replica", "data"))
    assert two.axis_names == ("replica", "data") and two.devices.shape == (3, 2)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(axes=("data", "replica"), slice_shape=(2,)), "must be distinct names starting with 'replica'"),
    (dict(axes=("replica", "a", "b"), slice_shape=(2,)), "has 1 dimensions; axes=('replica', 'a', 'b') need 2"),
    (dict(axes=("replica", "a", "b"), slice_shape=(3, -1)), "does not lay out the 2 devices of a slice"),
    (dict(axes=("replica", "a", "b", "c")), "need slice_shape"),
    (dict(model_axis=2, slice_shape=(1, 2)), "not both"),
])
def test_axes_or_a_shape_that_cannot_lay_out_a_slice_are_refused_naming_the_fix(sim, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_mesh(make_manager(), **kwargs)


# ------------------------------------------------------------------ health checker, deadline


def test_install_health_checker_makes_pathwaysutils_build_the_reusable_checker():
    was = health.installed()
    health.uninstall()
    try:
        assert not health.installed()
        your_loop.install_health_checker()
        your_loop.install_health_checker()  # idempotent
        assert health.installed()
    finally:
        if not was:
            health.uninstall()


def test_a_read_that_does_not_finish_becomes_the_slice_down_error_elastic_retry_handles():
    from pathwaysutils.elastic import elastic as pw_elastic

    deadline, never = StepDeadline(0.2), threading.Event()
    began = time.monotonic()
    with pytest.raises(jax.errors.JaxRuntimeError, match="DEADLINE_EXCEEDED") as caught:
        deadline.read(never.wait, step=7)
    assert time.monotonic() - began < 5
    assert pw_elastic.is_error_due_to_slice_down(caught.value)
    never.set()
    deadline.close()


# ------------------------------------------------------------------ checkpoints on your manager


def _state(value: float = 1.0):
    return {"w": jnp.full((4,), value, jnp.float32), "step": jnp.int32(3)}


def _manager(path, **options):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(str(path), options=ocp.CheckpointManagerOptions(**options))


def test_a_checkpoint_on_your_manager_keeps_the_data_position_and_its_commit_is_an_event(tmp_path):
    manager, seen = _manager(tmp_path / "ck"), []
    assert your_loop.save_checkpoint(manager, 3, _state(2.0), data={"global_next_index": 72})
    commit = your_loop.wait_for_checkpoint(manager, sink=seen.append)
    assert isinstance(commit, Commit) and commit.step == 3 and seen == [commit]
    assert commit.storage == str(tmp_path / "ck")
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("replica",))
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(
        mesh, PartitionSpec())), _state())
    state, position, step = your_loop.restore_checkpoint(_manager(tmp_path / "ck"), abstract)
    assert step == 3 and position == {"global_next_index": 72}
    np.testing.assert_array_equal(state["w"], np.full((4,), 2.0, np.float32))
    assert your_loop.restore_checkpoint(_manager(tmp_path / "empty"), abstract) is None


def test_the_preemption_save_commits_its_step_even_off_the_managers_interval(tmp_path):
    manager = _manager(tmp_path / "ck", save_interval_steps=5)
    assert your_loop.save_checkpoint(manager, 5, _state())
    assert not your_loop.save_checkpoint(manager, 7, _state())  # the manager's own interval skips it
    assert your_loop.save_at_preemption(manager, 7, _state(), data={"global_next_index": 9}, grace=30,
                                        received=time.monotonic())
    assert manager.all_steps() == [5, 7]


class _StalledManager:
    """A CheckpointManager whose save in flight never commits: a bucket that stopped answering."""

    directory = "gs://stalled"

    def __init__(self) -> None:
        self.stalled, self.saves = threading.Event(), []

    def wait_until_finished(self) -> None:
        self.stalled.wait()

    def save(self, step, args=None, force=False):  # never reached while the wait stalls
        self.saves.append(step)
        return True

    def latest_step(self):
        return None


def test_a_commit_that_makes_no_progress_is_given_up_on_after_the_storage_timeout(tmp_path):
    manager = _StalledManager()
    began = time.monotonic()
    with pytest.raises(StorageTimeout, match="no activity|did not"):
        your_loop.wait_for_checkpoint(manager, timeout=0.3)
    with pytest.raises(StorageTimeout):
        your_loop.save_checkpoint(manager, 5, _state(), timeout=0.3)
    assert manager.saves == [] and time.monotonic() - began < 10
    manager.stalled.set()


def test_the_preemption_save_gives_up_inside_the_grace_window_and_says_it_did_not_commit(tmp_path):
    manager = _StalledManager()
    began = time.monotonic()
    assert your_loop.save_at_preemption(manager, 5, _state(), grace=3, received=began) is False
    assert time.monotonic() - began < 3  # the window less its margin for the exit
    manager.stalled.set()


# ------------------------------------------------------------------ the page's example


def test_the_pages_example_is_the_program_the_suite_runs_and_each_snippets_added_lines_are_in_it():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    program = PROGRAM.read_text()
    assert blocks[-1] == program
    added = [line.strip() for block in blocks[:-1] for line in block.splitlines() if "# +" in line]
    assert len(added) >= 5 and [line for line in added if line not in program] == []


@pytest.mark.slow
def test_the_hardened_loop_survives_a_hang_a_loss_and_return_and_a_preemption_with_no_problem(tmp_path):
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    schedule = "hang:1@4,restore:1@+8,lose:1@16,restore:1@19,preempt@23"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "simulate", "--run-dir", str(tmp_path / "run"), "--report", str(report),
         "--slices", "2", "--schedule", schedule, "--", sys.executable, str(PROGRAM),
         "--checkpoints", str(tmp_path / "ck"), "--steps", "28", "--step-timeout", "2", "--probe-timeout", "2"],
        capture_output=True, text=True, timeout=280, cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    verdict = json.loads(report.read_text())
    assert verdict["problems"] == []
    costs = {c["fault"]: c for c in verdict["costs"]}
    assert costs["hang:1@4/step"]["detected"] == "deadline"  # the program's own, not the schedule's loss
    assert costs["preempt@23/step"]["resumed_from"] == "checkpoint"
    assert costs["preempt@23/step"]["redone_steps"] == 0
    assert "done at step 28" in proc.stdout
