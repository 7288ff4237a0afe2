"""The prepared device check (``python -m benchmarks.device_check``, issue 32) in its tiny mode on
CPU, so that it never rots between the times an accelerator is at hand.

Not its figures: a CPU's snapshot copy is a memcpy inside the step, so the tiny run's
figures say nothing of an accelerator's (``docs/performance.md``). The run is in this
process, on the first of its CPU devices, as the script runs on the first device it finds.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import device_check
from benchmarks.device_check import ROWS, WORKLOADS, main, versions

pytestmark = pytest.mark.libraries  # Orbax's Snapshotter and CheckpointManager, pathwaysutils' split


@pytest.mark.slow
def test_the_tiny_device_check_reports_every_row_with_no_part_failing(tmp_path, capsys):
    assert main(["--tiny", "--out", str(tmp_path)]) == 0, capsys.readouterr().err[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert "failures" not in results
    for _, value, baseline, ratio, _ in ROWS:
        for key in filter(None, (value, baseline, ratio)):
            assert isinstance(results[key], float) and math.isfinite(results[key]), key
            if "overhead" not in key:
                assert results[key] > 0, key
    # Snapshots were taken (Orbax skips one while the previous is queued: on a loaded CPU
    # some are), and the blocks alternated.
    assert 0 < results["device_snapshots_taken_fraction_k1"] <= 1
    assert {k: len(v) for k, v in results["device_step_blocks"].items()} == {"0": 1, "1": 1, "5": 1}
    assert results["device"]["platform"] == "cpu" and results["versions"]["orbax-checkpoint"]
    saves = results["device_checkpoint_save_commit_s"]
    assert len(saves) == WORKLOADS["tiny"].later_saves + 1
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# elastic_dew device check (tiny mode)")
    assert "| snapshot every step: step-time overhead (%) |" in md and "Workload: lm recipe" in md


def test_a_package_older_than_the_projects_bound_stops_the_check_naming_the_wheel_to_carry(monkeypatch, tmp_path):
    real = device_check.importlib.metadata.version
    monkeypatch.setattr(
        device_check.importlib.metadata, "version",
        lambda name: "0.12.5" if name == "orbax-checkpoint" else real(name),
    )
    found, problems = versions()
    assert found["orbax-checkpoint"] == "0.12.5"
    assert problems == [
        "orbax-checkpoint 0.12.5 is older than the 0.12.8 elastic_dew needs: carry its wheel "
        "(pip download --no-deps orbax-checkpoint==0.12.8)"
    ]
    assert main(["--tiny", "--out", str(tmp_path)]) == 2
    assert json.loads((tmp_path / "results.json").read_text())["problems"] == problems


def test_a_part_that_fails_is_named_with_its_error_and_the_next_part_runs():
    results: dict = {}

    def split_fails():
        raise RuntimeError("split_by_mesh_axis: UNIMPLEMENTED on this platform")

    assert device_check._part("snapshot restore", split_fails, results) is None
    assert device_check._part("checkpoint save and restore", lambda: 7, results) == 7
    assert results["failures"] == {"snapshot restore": "RuntimeError: split_by_mesh_axis: UNIMPLEMENTED on this platform"}
    assert set(results["part_seconds"]) == {"snapshot restore", "checkpoint save and restore"}
