"""The files in k8s/: each manifest is exactly its renderer's output, and all of them validate.

Each manifest's header names the command that renders it; re-running that command must give
the same bytes (no hand edits, no drift when the renderer changes). They validate from a copy
of the package with nothing beside it, as from a fresh clone or a plain pip install. The Dockerfiles must pin
the same jax and jaxlib, orbax-checkpoint and pathwaysutils versions and the same Python as
each other, as the resilience guide requires of the workload and colocated-Python sidecar
images.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from elastic_dew.cli import main
from elastic_dew._compat import orbax as orbax_private
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
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    pins = dict(re.findall(r'"([\w-]+)==\$\{(\w+)\}"', text))
    python = re.findall(r"python[_:-]?(3\.\d+)|PYTHON_VERSION=(3\.\d+)", text)
    return args, pins, {a or b for a, b in python}, text


def test_the_controller_and_sidecar_images_pin_the_same_jax_orbax_pathwaysutils_and_python():
    """The sidecar unpickles what the controller sends, and multi-tier checkpointing runs Orbax
    on both sides (Orbax 0.12.9 changed what step 0 means): one version of each, the tested one."""
    (c_args, c_pins, c_python, _), (s_args, s_pins, s_python, sidecar) = (
        _dockerfile("Dockerfile.controller"), _dockerfile("Dockerfile.sidecar"))
    wanted = {"jax": "JAX_VERSION", "jaxlib": "JAX_VERSION", "orbax-checkpoint": "ORBAX_VERSION",
              "pathwaysutils": "PATHWAYSUTILS_VERSION"}
    assert c_pins == s_pins == wanted
    for arg in set(wanted.values()):
        assert c_args[arg] == s_args[arg], arg
    assert c_args["ORBAX_VERSION"] == orbax_private.ORBAX_VERSION_READ  # the Orbax read and tested
    assert c_python == s_python == {"3.12"}
    major, minor, patch = (int(x) for x in c_args["JAX_VERSION"].split("."))
    assert (major, minor, patch) >= (0, 10, 1)  # the guide's minimum for colocated Python
    # The sidecar's base is built for that jax and Python: nothing upgrades jax over it.
    base_python, base_jax = re.fullmatch(r".*python_(3\.\d+)-jax_(\S+)", s_args["SIDECAR_BASE"]).groups()
    assert (base_python, base_jax) == ("3.12", s_args["JAX_VERSION"])
    assert "--upgrade" not in sidecar


@pytest.mark.slow
def test_a_copy_of_the_package_with_nothing_beside_it_validates_the_shipped_manifests(tmp_path):
    """What a fresh clone or a plain pip install has: the package and the manifests, and no
    development-only directory beside them. The copy (the working tree's package and k8s/, so uncommitted changes are what
    is tested) runs ``elastic-dew k8s validate`` in a separate process whose import path holds
    only the copy and the installed libraries, in a directory with no sibling."""
    clone = tmp_path / "alone" / "elastic-dew"
    shutil.copytree(REPO / "elastic_dew", clone / "elastic_dew",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(K8S, clone / "k8s")
    assert sorted(p.name for p in clone.parent.parent.iterdir()) == ["alone"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ELASTIC_DEW_JOBSET_CRD")}
    env["PYTHONPATH"] = str(clone)
    code = ("import sys, elastic_dew; assert elastic_dew.__file__.startswith(sys.argv[1]), elastic_dew.__file__; "
            "from elastic_dew.cli import main; sys.exit(main(['k8s', 'validate', *sys.argv[2:]]))")
    files = sorted(str(p.relative_to(clone)) for p in (clone / "k8s").glob("*.yaml"))
    result = subprocess.run([sys.executable, "-c", code, str(clone), *files],
                            cwd=clone, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok (") == len(files) == len(MANIFESTS)


@pytest.mark.slow
def test_the_schema_generator_skips_its_drift_check_with_a_message_when_the_crd_is_absent(tmp_path):
    """CI's clean clone may have no CRD beside it: the check says so and passes; with a CRD given
    it compares (here a CRD that is not the JobSet one is refused by name)."""
    script = REPO / "scripts" / "jobset_schema.py"
    missing = subprocess.run([sys.executable, str(script), "--check", "--crd", str(tmp_path / "none.yaml")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 0 and "drift check skipped: no JobSet CRD at" in missing.stdout
    other = tmp_path / "other.yaml"
    other.write_text("kind: CustomResourceDefinition\nspec: {group: example.com, versions: []}\n")
    wrong = subprocess.run([sys.executable, str(script), "--check", "--crd", str(other)],
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode != 0 and "not the JobSet CustomResourceDefinition" in wrong.stderr


@pytest.mark.slow
def test_the_schema_generator_detects_drift_between_a_crd_and_the_schema_file(tmp_path):
    script = REPO / "scripts" / "jobset_schema.py"
    crd = tmp_path / "crd.yaml"
    crd.write_text(yaml.safe_dump({"kind": "CustomResourceDefinition", "spec": {
        "group": "jobset.x-k8s.io", "versions": [{"name": "v1alpha2", "schema": {"openAPIV3Schema": {
            "type": "object", "description": "prose that is not kept",
            "properties": {"spec": {"type": "object", "properties": {"suspend": {"type": "boolean"}}}}}}}]}}))
    out = tmp_path / "schema.json"
    assert subprocess.run([sys.executable, str(script), "--crd", str(crd), "--output", str(out)],
                          capture_output=True, timeout=60).returncode == 0
    assert "prose" not in out.read_text() and '"suspend"' in out.read_text()
    check = [sys.executable, str(script), "--check", "--crd", str(crd), "--output", str(out)]
    assert subprocess.run(check, capture_output=True, timeout=60).returncode == 0
    out.write_text(out.read_text().replace("boolean", "string"))
    drift = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert drift.returncode == 1 and "differs from the facts of" in drift.stderr


def test_every_port_and_host_network_pod_of_the_shipped_jobsets_is_in_the_docs_exposure_table():
    """docs/kubernetes.md#what-the-jobset-opens-on-the-network lists what each pod opens; a
    port the renderer adds, or a pod it puts on the node network, must be listed there too."""
    text = (REPO / "docs" / "kubernetes.md").read_text()
    section = text[text.index("## What the JobSet opens on the network"):]
    table = section[:section.index("The controller container itself")]
    rows = {line.split("|")[2].strip(" `"): line for line in table.splitlines() if line.startswith("| `")}
    for path in K8S.glob("jobset-*.yaml"):
        (jobset,) = _docs(path)
        for job in jobset["spec"]["replicatedJobs"]:
            pod = job["template"]["spec"]["template"]["spec"]
            assert pod.get("hostNetwork") is True and f"`{job['name']}`" in table, (path.name, job["name"])
            for container in pod.get("initContainers", []) + pod["containers"]:
                for port in container.get("ports", []):
                    assert container["name"] in rows, f"{path.name}: {container['name']} is not in the table"
                    assert str(port["containerPort"]) in rows[container["name"]], (
                        f"{path.name}: {container['name']} opens {port['containerPort']}, not in the docs' table")
