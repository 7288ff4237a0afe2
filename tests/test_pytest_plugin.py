"""elastic_dew's pytest plugin, run as a user runs it: a fresh ``pytest`` process on a test
directory of their own, with the plugin loaded from its ``pytest11`` entry point.

The directory holds the complete example of ``docs/testing.md``
(``tests/plugin_example/example_my_loop.py``, a user's guide-style loop, copied in as
``test_my_loop.py``) and tests that fail on purpose, to read what the plugin reports."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import REPO

FAILING = '''
import jax
import pytest

DEVICES = len(jax.devices())  # JAX starts while this module is imported


def test_the_devices_were_set_before_jax_started():
    assert DEVICES == 4


@pytest.mark.slices(2, 2, schedule="lose:1@50")
def test_a_fault_the_loop_never_reaches(simulated_slices):
    step = jax.jit(lambda x: x + 1)
    x = jax.device_put(jax.numpy.zeros(8), simulated_slices.slice_to_devices[0][0])
    for _ in range(3):
        x = step(x)


@pytest.mark.slices(4, 2)
def test_more_slices_than_host_devices(simulated_slices):
    pass


@pytest.mark.slices(2, 2, schedule="lose:1@2")
def test_a_failing_simulated_test(simulated_slices):
    step = jax.jit(lambda x: x + 1)
    x = jax.device_put(jax.numpy.zeros(8), simulated_slices.slice_to_devices[1][0])
    for _ in range(3):
        x = step(x)


KEPT = []  # every step's state, at module level: the failed attempt's arrays stay referenced


def _a_loop_that_keeps_its_states():
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from pathwaysutils.elastic import manager

    elastic = manager.Manager()

    @elastic.elastic_retry(minimum_slice_count=1, poll_interval=0.05, timeout=30)
    def train():
        devices = [d for i in sorted(elastic.active_slice_indices) for d in elastic.slice_to_devices[i]]
        x = jax.device_put(jax.numpy.zeros(8), NamedSharding(Mesh(np.asarray(devices), ("d",)), PartitionSpec()))
        step = jax.jit(lambda x: x + 1)
        for _ in range(4):
            x = step(x)
            float(x[0])
            KEPT.append(x)

    train()


@pytest.mark.slices(2, 2, schedule="lose:1@2")
def test_a_loop_that_keeps_its_states_across_attempts(simulated_slices):
    _a_loop_that_keeps_its_states()


@pytest.mark.slices(2, 2, schedule="lose:1@2", allow=("held_across_attempts",))
def test_the_same_loop_with_its_mistake_allowed(simulated_slices):
    _a_loop_that_keeps_its_states()
'''


@pytest.mark.slow
def test_a_users_test_directory_runs_under_the_plugin_and_failures_say_what_the_slices_did(tmp_path):
    """Four devices set before JAX starts; the example passes; a fault never reached, a
    marker wanting more devices than the host has, a lost slice and a mistake the simulator
    names each fail, saying why; the mistake allowed by the marker passes."""
    shutil.copy(REPO / "tests" / "plugin_example" / "example_my_loop.py", tmp_path / "test_my_loop.py")
    (tmp_path / "test_failing.py").write_text(FAILING)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--simulated-devices", "4", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    # the fixture fails: at setup (devices), at teardown (faults never fired, a problem named)
    assert "1 failed, 5 passed, 3 errors" in out, out
    assert "scheduled faults never fired: ['lose:1@50/step'] after 3 counted steps" in out
    assert "needs 8 host devices" in out and "pytest --simulated-devices 8" in out
    section = out[out.index("simulated slices"):]
    assert "schedule: lose:1@2/step" in section
    assert '"scheduled": "lose:1@2/step"' in section and "DATA_LOSS" in out
    problem = out[out.index("the simulator named problems of the code under test (held_across_attempts)"):]
    assert "PROBLEM held_across_attempts (process 1, attempt 2)" in problem and "KEPT" in problem
    assert "fix: keep no reference to an attempt's device arrays" in problem
    assert "ERROR at teardown of test_the_same_loop_with_its_mistake_allowed" not in out


def test_the_documented_example_is_the_file_the_suite_runs():
    example = (REPO / "tests" / "plugin_example" / "example_my_loop.py").read_text()
    assert f"```python\n{example}```" in (REPO / "docs" / "testing.md").read_text()
