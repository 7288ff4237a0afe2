"""The check that keeps the persistent tier where the TPU workers can write under Pathways
persistence (``elastic_dew.elastic.state.persistence``): a pure function of the directory and the
environment, so no Pathways server is needed (or mocked)."""

from __future__ import annotations

import pytest

from elastic_dew.elastic.state.persistence import checkpoint_dir_problem, persistence_enabled
from elastic_dew.mentions import name_mentions

PERSISTENT = {"JAX_PLATFORMS": "proxy", "ENABLE_PATHWAYS_PERSISTENCE": "1"}


@pytest.mark.parametrize("local", ["/gcs/runs/dew-lm/checkpoints", "runs/x/checkpoints", "s3://b/ckpt",
                                   "file:///tmp/ckpt"])
def test_a_directory_the_workers_cannot_see_is_refused_under_persistence_with_the_reason_and_the_fix(local):
    problem = checkpoint_dir_problem(local, PERSISTENT)
    assert problem is not None
    problem = name_mentions(problem)  # as Python names the setting
    assert f"checkpoint_dir={local} is not a gs:// URL" in problem
    assert "TPU workers write the checkpoint arrays" in problem  # the reason
    assert "checkpoint_dir=gs://BUCKET/runs/NAME/checkpoints" in problem  # the fix
    assert "ENABLE_PATHWAYS_PERSISTENCE=0" in problem  # the other way out


def test_a_gs_directory_is_fine_under_persistence_but_one_without_a_bucket_is_not():
    assert checkpoint_dir_problem("gs://dew-bucket/runs/dew-lm/checkpoints", PERSISTENT) is None
    assert "names no bucket" in checkpoint_dir_problem("gs:///runs/x", PERSISTENT)


@pytest.mark.parametrize("env", [
    {},
    {"JAX_PLATFORMS": "cpu", "ENABLE_PATHWAYS_PERSISTENCE": "1"},  # no proxy: no Pathways array handler
    {"JAX_PLATFORMS": "proxy", "ENABLE_PATHWAYS_PERSISTENCE": "0"},
    {"JAX_PLATFORMS": "proxy"},
])
def test_a_local_directory_is_fine_when_pathwaysutils_would_not_install_its_array_handler(env):
    assert not persistence_enabled(env)
    assert checkpoint_dir_problem("/tmp/run/checkpoints", env) is None


def test_a_persistence_value_pathwaysutils_rejects_is_reported_before_it_raises_at_start_up():
    problem = checkpoint_dir_problem("gs://b/c", {"JAX_PLATFORMS": "proxy", "ENABLE_PATHWAYS_PERSISTENCE": "yes"})
    assert problem is not None and "'yes' is not understood" in problem and "1, 0 or unset" in problem


def test_the_check_agrees_with_pathwaysutils_own_reading_of_the_variable(monkeypatch):
    """pathwaysutils' private helper (through the seam) is the authority on which values mean 'on'."""
    from elastic_dew._compat import pathwaysutils as pw_private

    pathwaysutils_reading = pw_private.PERSISTENCE_ENABLED.get()
    for value, on in (("1", True), ("0", False)):
        monkeypatch.setenv("ENABLE_PATHWAYS_PERSISTENCE", value)
        assert pathwaysutils_reading() is on
        assert persistence_enabled({"JAX_PLATFORMS": "proxy", "ENABLE_PATHWAYS_PERSISTENCE": value}) is on
    monkeypatch.setenv("ENABLE_PATHWAYS_PERSISTENCE", "yes")
    with pytest.raises(ValueError):
        pathwaysutils_reading()
