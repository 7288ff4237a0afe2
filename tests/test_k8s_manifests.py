"""The files in k8s/: each manifest is exactly its renderer's output, and all of them validate.

Each manifest's header names the command that renders it; re-running that command must give
the same bytes (no hand edits, no drift when the renderer changes). The Dockerfiles must pin
the same jax and jaxlib versions and the same Python as each other, as the resilience guide
requires of the workload and colocated-Python sidecar images.
"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from conftest import REPO
from elastic_dew.cli import main
from elastic_dew.k8s import validate as V

K8S = REPO / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def _command(path):
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("#   elastic-dew k8s ")]
    assert len(lines) == 1, f"{path.name} must name its render command once in its header"
    return shlex.split(lines[0][len("#   "):])


def _docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_k8s_holds_both_jobset_variants_the_priority_classes_and_the_checkpoint_configuration():
    kinds = {p.name: [d["kind"] for d in _docs(p)] for p in MANIFESTS}
    assert kinds["jobset-elastic.yaml"] == ["JobSet"]
    assert kinds["jobset-elastic-mtc.yaml"] == ["JobSet"]
    assert kinds["high-prior-job.yaml"] == ["PriorityClass"]
    assert kinds["checkpoint-configuration.yaml"] == ["CheckpointConfiguration"]
    mtc = _docs(K8S / "jobset-elastic-mtc.yaml")[0]
    assert "--sidecar_name=external" in yaml.safe_dump(mtc)
    assert "high-prior-job" in yaml.safe_dump(mtc)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_is_exactly_what_its_header_command_renders(path, tmp_path, capsys):
    argv = _command(path)
    assert argv[:2] == ["elastic-dew", "k8s"]
    out = tmp_path / path.name
    assert main(argv[1:] + ["--out", str(out)]) == 0, capsys.readouterr().err
    assert out.read_text() == path.read_text(), f"{path.name} drifted: re-render it with its header command"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_validates_against_its_schema_and_the_semantic_checks(path):
    assert V.document_errors(_docs(path)) == []


def _dockerfile(name):
    text = (K8S / name).read_text()
    (jax_version,) = re.findall(r"^ARG JAX_VERSION=(\S+)$", text, re.M)
    installs = re.findall(r'"(jax|jaxlib)==\$\{JAX_VERSION\}"', text)
    python = re.findall(r"python[_:-]?(3\.\d+)|PYTHON_VERSION=(3\.\d+)", text)
    return jax_version, sorted(installs), {a or b for a, b in python}


def test_the_controller_and_sidecar_images_pin_the_same_jax_jaxlib_and_python():
    controller, sidecar = _dockerfile("Dockerfile.controller"), _dockerfile("Dockerfile.sidecar")
    assert controller[0] == sidecar[0]
    assert controller[1] == sidecar[1] == ["jax", "jaxlib"]
    assert controller[2] == sidecar[2] == {"3.12"}
    major, minor, patch = (int(x) for x in controller[0].split("."))
    assert (major, minor, patch) >= (0, 10, 1)  # the guide's minimum for colocated Python
