"""Security: nothing executes code from a checkpoint or a run record, deletion stays inside the
run directory, and manifests carry no secrets.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from elastic_dew import cli, record
from elastic_dew import testing as chaos

from conftest import REPO

_SOURCES = sorted((REPO / "elastic_dew").rglob("*.py"))
_UNSAFE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def _unsafe_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found += [f"{where} imports {n}" for n in names if n.split(".")[0] in _UNSAFE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("eval", "exec"):
            found.append(f"{where} calls {func.id}")
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            keywords = {k.arg: k.value for k in node.keywords}
            if owner == "yaml" and func.attr in ("load", "load_all", "unsafe_load"):
                found.append(f"{where} calls yaml.{func.attr} (use safe_load)")
            if owner in ("np", "numpy") and func.attr == "load":
                safe = isinstance(keywords.get("allow_pickle"), ast.Constant) and keywords["allow_pickle"].value is False
                if not safe:
                    found.append(f"{where} calls np.load without allow_pickle=False")
    return found


def test_no_module_of_the_toolkit_unpickles_evaluates_or_loads_yaml_unsafely():
    assert len(_SOURCES) > 20
    problems = [p for path in _SOURCES for p in _unsafe_calls(path)]
    assert problems == []


class _Payload:
    """Unpickling this creates a file: proof that code from a file ran."""

    marker = ""

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_final_parameters_that_carry_a_pickle_are_refused_and_run_nothing(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = tmp_path / "code-ran"
    payload = _Payload()
    payload.marker = str(marker)
    np.savez(run_dir / record.PARAMS_FILE, w=np.array([payload], dtype=object))
    with pytest.raises(ValueError, match=r"pickled \(object\) data, which elastic_dew never writes and never loads"):
        record.load_params(run_dir)
    assert not marker.exists()


def test_the_report_of_a_run_whose_final_parameters_carry_a_pickle_runs_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / record.EVENTS_FILE).write_text('{"event":"start","wall":1.0}\n')
    marker = tmp_path / "code-ran"
    payload = _Payload()
    payload.marker = str(marker)
    np.savez(run_dir / record.PARAMS_FILE, w=np.array([payload], dtype=object))
    assert cli.main(["report", "--no-timeline", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "final_params.npz is not a parameters file elastic_dew wrote (it holds pickled (object) data" in err
    assert not marker.exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    outcome = chaos.run(chaos.Scenario(steps=4), tmp_path_factory.mktemp("secure") / "run")
    assert outcome.error is None
    return outcome.run_dir


def test_a_checkpoint_holds_json_and_arrays_only(finished_run):
    step = finished_run / "checkpoints" / "4"
    meta = json.loads((step / "meta" / "metadata").read_text())
    assert meta["step"] == 4 and "global_next_index" in meta["data"]
    for file in step.rglob("*"):
        if file.is_file():
            head = file.read_bytes()[:2]
            assert not (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")), f"{file} looks pickled"


def test_a_linked_partial_checkpoint_is_unlinked_and_what_it_points_to_is_untouched(finished_run, tmp_path):
    """A step directory that is a symbolic link to somewhere else is removed as a link only."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    (run_dir / "checkpoints" / "8").symlink_to(outside, target_is_directory=True)
    outcome = chaos.run(chaos.Scenario(steps=8), run_dir)
    assert outcome.error is None, repr(outcome.error)
    assert (outside / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt"]
    assert not (run_dir / "checkpoints" / "8").is_symlink()
    assert 8 in chaos.committed_checkpoints(run_dir / "checkpoints")


_SECRET_NAMES = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


def _env_entries(node):
    if isinstance(node, dict):
        if "name" in node and "value" in node and isinstance(node.get("name"), str):
            yield node
        for value in node.values():
            yield from _env_entries(value)
    elif isinstance(node, list):
        for value in node:
            yield from _env_entries(value)


def test_rendered_and_shipped_manifests_carry_no_secrets(monkeypatch, capsys):
    """Secrets in the renderer's environment never reach a manifest, which holds no Secret
    object and no literal credential; the manifests shipped in k8s/ likewise."""
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret123")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/home/me/sa-key.json")
    monkeypatch.setenv("WANDB_API_KEY", "wandbsecret456")
    argv = ["k8s", "render", "--name", "dew", "--tpu-type", "v5e", "--topology", "4x8", "--slices", "2",
            "--elastic-slices", "2", "--image", "r/c:1", "--recipe", "lm", "--bucket", "gs://dew-bucket"]
    assert cli.main(argv) == 0
    rendered = capsys.readouterr().out
    texts = {"rendered": rendered} | {p.name: p.read_text() for p in sorted((REPO / "k8s").glob("*.yaml"))}
    assert len(texts) > 1
    for name, text in texts.items():
        for leaked in ("hf_supersecret123", "sa-key.json", "wandbsecret456", "BEGIN PRIVATE KEY", "AKIA"):
            assert leaked not in text, (name, leaked)
        for document in yaml.safe_load_all(text):
            assert not (isinstance(document, dict) and document.get("kind") == "Secret"), name
            for entry in _env_entries(document):
                if any(word in entry["name"].upper() for word in _SECRET_NAMES):
                    # A switch (IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true) is not a secret.
                    assert str(entry["value"]).lower() in ("", "true", "false", "0", "1"), (name, entry)
