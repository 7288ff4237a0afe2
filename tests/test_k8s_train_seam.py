"""The seam between the JobSet renderer and ``elastic-dew train``: the controller's command,
as rendered, must pass the train command's own argument parsing and checks, under the
environment the controller container gets (``JAX_PLATFORMS=proxy``).

A command the train command refuses exits 2, and the head Job's ``podFailurePolicy`` turns
exit 2 into ``FailJob``: the JobSet would fail at start. No cluster, TPU or Pathways proxy
exists here, so the command is not run: it is parsed by the real ``elastic-dew`` parser and
checked by the real ``train.plan`` (the library's ``run.plan_run``: it decides the run and touches nothing), with the
container's environment set in this process. JAX's backend is never started (``plan`` only
reads ``JAX_PLATFORMS``). The mounted bucket is played by a temporary directory: the run
directory's mount path is mapped onto it, so the run-directory checks look at a real,
writable directory, as they would at the Cloud Storage FUSE mount in the pod.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from elastic_dew import cli
from elastic_dew import run as runs
from elastic_dew.run import planning
from elastic_dew.commands import train
from elastic_dew.elastic.config import MULTI_TIER_DIR
from elastic_dew.elastic.state.persistence import checkpoint_dir_problem
from elastic_dew.k8s import JobSetParams, jobset
from elastic_dew.k8s import render as R

BASE = dict(name="dew-lm", tpu_type="v6e", topology="4x4", slices=4, elastic_slices=4,
            image="us-docker.pkg.dev/p/dew/controller:1", recipe="lm", bucket="gs://my-dew-bucket")

PARAMETER_SETS = {
    "the-k8s-default": {},
    "mtc-with-priority": dict(name="dew-lm-mtc", mtc=True, sidecar_image="s/side:1", priority="high-prior-job"),
    "elasticity-off": dict(elastic_slices=0),
    "mlp-in-a-bucket-prefix": dict(recipe="mlp", bucket="gs://dew-bucket/team/", slices=2, elastic_slices=1,
                                   tpu_type="v5p", topology="2x2x2"),
    "one-slice-own-service-account": dict(slices=1, elastic_slices=1, service_account="dew-runner",
                                          namespace="ml"),
}


def _head_pod(js: dict) -> dict:
    head = next(j for j in js["spec"]["replicatedJobs"] if j["name"] == R.HEAD_JOB)
    return head["template"]["spec"]["template"]


def _controller(js: dict) -> dict:
    return next(c for c in _head_pod(js)["spec"]["containers"] if c["name"] == R.CONTROLLER)


def _container_env(js: dict, controller: dict) -> dict[str, str]:
    """The controller's environment as Kubernetes would set it (field references resolved)."""
    resolved = {R._JOBSET_NAME: js["metadata"]["name"]}
    env = {}
    for entry in controller["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            env[entry["name"]] = resolved[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def _bucket_mount(js: dict, controller: dict) -> tuple[str, dict]:
    """The controller's mount of a Cloud Storage FUSE volume: (mount path, volume)."""
    volumes = {v["name"]: v for v in _head_pod(js)["spec"].get("volumes", [])}
    for mount in controller.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if volume.get("csi", {}).get("driver") == "gcsfuse.csi.storage.gke.io":
            return mount["mountPath"], volume
    raise AssertionError("the controller mounts no Cloud Storage FUSE volume for its run directory")


def _map_into(path: str, mount_path: str, bucket_root: Path) -> Path:
    relative = PurePosixPath(path).relative_to(mount_path)  # raises unless under the mount
    return bucket_root.joinpath(*relative.parts)


@pytest.mark.parametrize("over", PARAMETER_SETS.values(), ids=PARAMETER_SETS.keys())
def test_the_rendered_controller_command_passes_the_train_commands_own_checks_under_the_proxy(
        over, tmp_path, monkeypatch):
    p = JobSetParams(**{**BASE, **over})
    js = jobset(p)
    controller = _controller(js)
    command, env = list(controller["command"]), _container_env(js, controller)
    assert command[:2] == ["elastic-dew", "train"]
    assert env["JAX_PLATFORMS"] == "proxy"

    # The run directory is a local path on the mounted bucket, which is --bucket itself.
    mount_path, volume = _bucket_mount(js, controller)
    bucket_name, prefix = p.bucket.removeprefix("gs://").partition("/")[::2]
    assert volume["csi"]["volumeAttributes"]["bucketName"] == bucket_name
    run_dir = command[command.index("--run-dir") + 1]
    assert PurePosixPath(run_dir) == PurePosixPath(mount_path, *filter(None, prefix.split("/")), "runs", p.name)
    bucket_root = tmp_path / "bucket"
    bucket_root.mkdir()
    local_run_dir = _map_into(run_dir, mount_path, bucket_root)
    command[command.index("--run-dir") + 1] = str(local_run_dir)

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    parser, module = cli._parser(command[1:])
    assert module is train
    args = parser.parse_args(command[1:])  # argparse exits 2 on an unknown flag
    try:
        plan = train.plan(args)
    except runs.UsageError as err:
        pytest.fail(f"elastic-dew train would exit 2 in the head pod (FailJob): {err}")

    assert plan.simulate is False  # real slices: the allocation defines them
    assert plan.run_dir == local_run_dir
    assert plan.recipe == f"elastic_dew.recipes.{p.recipe}"
    assert plan.elastic.minimum_slice_count == p.min_slices <= p.slices
    # The multi-tier variant's manifest is only worth its sidecars if the trainer uses them.
    assert plan.elastic.checkpoint_kind == ("multi_tier" if p.mtc else "orbax")
    if p.mtc:
        assert plan.elastic.checkpoint_dir == p.mtc_ramdisk_dir == MULTI_TIER_DIR
    else:  # the workers write the arrays under Pathways persistence: a gs:// URL, not the FUSE mount
        assert plan.elastic.checkpoint_dir == p.checkpoint_dir
        assert checkpoint_dir_problem(plan.elastic.checkpoint_dir, env) is None
    assert list(bucket_root.iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["bucket"]


def test_the_controllers_environment_makes_the_train_command_use_the_real_slices(tmp_path, monkeypatch):
    """The seam check above is only meaningful in the pod's environment: the train command tells
    simulated and real slices apart by JAX_PLATFORMS alone, and the head sets it to proxy."""
    js = jobset(JobSetParams(**BASE))
    monkeypatch.setenv("JAX_PLATFORMS", _container_env(js, _controller(js))["JAX_PLATFORMS"])
    monkeypatch.delenv("JOBSET_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert not planning.simulating()
    planned = planning.plan_run(runs.RunConfig("mlp"))
    assert planning.process_options(planned) == {}  # no simulated host devices asked for


@pytest.mark.parametrize("url", ["gs://my-dew-bucket/runs/dew-lm", "s3://b/runs/x", "file:///tmp/run"])
@pytest.mark.parametrize("platforms", ["proxy", "cpu"])
def test_a_run_directory_url_is_refused_naming_the_fuse_mount_fix_before_anything_is_touched(
        url, platforms, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "mlp", "--run-dir", url]) == 2
    err = capsys.readouterr().err
    assert f"--run-dir {url}" in err
    assert "local directory" in err and "Cloud Storage FUSE" in err and "mounted path" in err
    assert list(tmp_path.iterdir()) == []  # no ./gs:/... directory made from the URL
