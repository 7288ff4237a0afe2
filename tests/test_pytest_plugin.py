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
'''


@pytest.mark.slow
def test_a_users_test_directory_runs_under_the_plugin_and_failures_say_what_the_slices_did(tmp_path):
    """Four devices set before JAX starts; the example passes; a fault never reached, a
    marker wanting more devices than the host has and a lost slice each fail, saying why."""
    shutil.copy(REPO / "tests" / "plugin_example" / "example_my_loop.py", tmp_path / "test_my_loop.py")
    (tmp_path / "test_failing.py").write_text(FAILING)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--simulated-devices", "4", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "1 failed, 3 passed, 2 errors" in out, out  # the fixture fails: at setup (devices), at teardown (faults)
    assert "scheduled faults never fired: ['lose:1@50/step'] after 3 counted steps" in out
    assert "needs 8 host devices" in out and "pytest --simulated-devices 8" in out
    section = out[out.index("simulated slices"):]
    assert "schedule: lose:1@2/step" in section
    assert '"scheduled": "lose:1@2/step"' in section and "DATA_LOSS" in out


def test_the_documented_example_is_the_file_the_suite_runs():
    example = (REPO / "tests" / "plugin_example" / "example_my_loop.py").read_text()
    assert f"```python\n{example}```" in (REPO / "docs" / "testing.md").read_text()
