"""The JobSet renderer, its parameter checks, and manifest validation.

No cluster exists here: manifests are checked against the JobSet CRD's openAPIV3Schema
(../shared/schemas), Kubernetes' published schemas (kubernetes-validate, offline) and the
semantic checks in elastic_dew.k8s.validate. The CLI runs in-process except for one real
``python -m elastic_dew`` process that proves the dispatcher reaches it.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from elastic_dew.cli import main
from elastic_dew.k8s import KNOWN_RECIPES, TPU_TYPES, JobSetParams, ParameterError, jobset, lookup_tpu_type
from elastic_dew.k8s import render as R
from elastic_dew.k8s import validate as V


def params(**over) -> JobSetParams:
    base = dict(name="dew-test", tpu_type="v6e", topology="4x4", slices=4, elastic_slices=3,
                image="us-docker.pkg.dev/p/dew/controller:1", recipe="lm", bucket="gs://dew-bucket")
    base.update(over)
    return JobSetParams(**base)


def head(js):
    return next(j for j in js["spec"]["replicatedJobs"] if j["name"] == "pathways-head")


def worker(js):
    return next(j for j in js["spec"]["replicatedJobs"] if j["name"] == "pathways-worker")


def pod(rjob):
    return rjob["template"]["spec"]["template"]["spec"]


def named(containers, name):
    return next(c for c in containers if c["name"] == name)


SHAPES = [(t.name, topo) for t in TPU_TYPES.values() for topo in (t.topologies[0], t.topologies[-1])]


@pytest.mark.parametrize("tpu_type,topology", SHAPES)
@pytest.mark.parametrize("mtc", [False, True])
def test_every_rendered_jobset_passes_the_crd_schema_the_job_schema_and_the_semantic_checks(
        tpu_type, topology, mtc):
    js = jobset(params(tpu_type=tpu_type, topology=topology, mtc=mtc, sidecar_image="s/side:1",
                       priority="high-prior-job" if mtc else None, name="dew"))
    assert V.jobset_schema_errors(js) == []
    assert V.semantic_errors(js) == []


def test_the_schema_check_refuses_a_misspelt_field_and_a_wrong_type():
    js = jobset(params())
    pod(head(js))["containers"][0]["enviroment"] = []
    worker(js)["replicas"] = "4"
    errors = "\n".join(V.jobset_schema_errors(js))
    assert "'enviroment' was unexpected" in errors
    assert "replicatedJobs.1.replicas" in errors and "is not of type 'integer'" in errors


def test_the_head_runs_the_resource_manager_and_proxy_as_native_sidecars_and_the_controller_as_its_main_container():
    hp = pod(head(jobset(params())))
    assert [c["name"] for c in hp["initContainers"]] == ["pathways-rm", "pathways-proxy"]
    assert all(c["restartPolicy"] == "Always" for c in hp["initContainers"])
    assert [c["name"] for c in hp["containers"]] == ["controller"]


def test_the_controller_trains_the_recipe_through_the_proxy_into_a_run_directory_that_survives_restarts():
    js = jobset(params(recipe="mlp", name="run-a", bucket="gs://dew-bucket/team"))
    c = named(pod(head(js))["containers"], "controller")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["JAX_PLATFORMS"] == "proxy"
    assert env["JAX_BACKEND_TARGET"] == f"grpc://localhost:{R.PROXY_PORT}"
    assert c["command"] == ["elastic-dew", "train", "mlp", "--run-dir", "/gcs/team/runs/run-a", "--min-slices", "1"]
    # The run directory is on --bucket, mounted through Cloud Storage FUSE (a local path: the
    # run record is appended and fsynced); GKE injects the gcsfuse sidecar on the annotation.
    assert c["volumeMounts"] == [{"name": "run-storage", "mountPath": "/gcs"}]
    hp = head(js)["template"]["spec"]["template"]
    assert hp["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    assert hp["spec"]["volumes"] == [{"name": "run-storage", "csi": {
        "driver": "gcsfuse.csi.storage.gke.io",
        "volumeAttributes": {"bucketName": "dew-bucket", "mountOptions": "implicit-dirs"}}}]
    # One service account, with Workload Identity access to the bucket, on head and workers.
    assert hp["spec"]["serviceAccountName"] == pod(worker(js))["serviceAccountName"] == "default"
    assert pod(head(jobset(params(service_account="dew-runner"))))["serviceAccountName"] == "dew-runner"


def test_the_proxy_gets_the_guides_elastic_flag_by_default_and_pathwaysutils_spelling_on_request():
    def proxy_args(**over):
        return named(pod(head(jobset(params(**over))))["initContainers"], "pathways-proxy")["args"]

    default = proxy_args()
    assert "--num_elastic_instances=3" in default
    assert not any(a.startswith("--num_elastic_slices") for a in default)
    assert {"--resource_manager_address=$(PATHWAYS_HEAD):29001", "--server_port=29000",
            "--gcs_scratch_location=gs://dew-bucket/pathways-scratch"} <= set(default)
    slices = proxy_args(proxy_flag_spelling="slices")
    assert "--num_elastic_slices=3" in slices and not any("instances" in a for a in slices)
    assert not any("elastic" in a for a in proxy_args(elastic_slices=0))


def test_exit_143_restarts_the_head_without_using_the_failure_budget_and_the_grace_period_covers_the_checkpoint():
    js = jobset(params(grace_seconds=420))
    spec = head(js)["template"]["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    first_143 = next(r for r in rules if 143 in r.get("onExitCodes", {}).get("values", []))
    assert first_143["action"] == "Ignore" and first_143["onExitCodes"]["containerName"] == "controller"
    assert any(r["action"] == "Ignore" and r.get("onPodConditions", [{}])[0].get("type") == "DisruptionTarget"
               for r in rules)
    assert pod(head(js))["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert pod(head(js))["terminationGracePeriodSeconds"] == 420
    assert pod(worker(js))["terminationGracePeriodSeconds"] == 420
    # The JobSet's only rule fails fast on a bad command line, never on a preemption.
    (rule,) = js["spec"]["failurePolicy"]["rules"]
    assert rule["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert next(r for r in rules if r["action"] == "FailJob")["onExitCodes"]["values"] == [2]


def test_workers_have_one_job_per_slice_tpu_selectors_exclusive_placement_and_a_backoff_limit_for_repeated_slice_loss():
    js = jobset(params(tpu_type="v5p", topology="2x2x4", slices=3, elastic_slices=2))
    w = worker(js)
    assert w["replicas"] == 3
    assert w["template"]["spec"]["completions"] == 4 == w["template"]["spec"]["parallelism"]
    assert w["template"]["spec"]["backoffLimit"] == 4 * 1_000_000
    assert w["template"]["metadata"]["annotations"] == {
        "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"}
    assert pod(w)["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
                                      "cloud.google.com/gke-tpu-topology": "2x2x4"}
    assert named(pod(w)["containers"], "pathways-worker")["resources"]["limits"] == {"google.com/tpu": "4"}
    rm = named(pod(head(js))["initContainers"], "pathways-rm")["args"]
    assert "--instance_count=3" in rm and "--instance_type=tpuv5:2x2x4" in rm


def test_the_mtc_variant_puts_the_sidecar_shared_memory_and_csi_volume_on_workers_only():
    js = jobset(params(mtc=True, sidecar_image="s/side:1"))
    proxy = named(pod(head(js))["initContainers"], "pathways-proxy")
    assert "--sidecar_name=external" in proxy["args"]
    wp = pod(worker(js))
    sidecar = named(wp["initContainers"], "colocated-python-sidecar")
    pw = named(wp["containers"], "pathways-worker")
    assert sidecar["image"] == "s/side:1"
    assert "--cloud_pathways_sidecar_shm_directory=/tmp/sidecar" in pw["args"]
    volumes = {v["name"]: v for v in wp["volumes"]}
    assert volumes["checkpoint-mount"]["csi"]["driver"] == "multitier-checkpoint.csi.storage.gke.io"
    assert volumes["shared-tmp"]["emptyDir"]["medium"] == "Memory"
    for c in (sidecar, pw):
        assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]} == {
            "shared-tmp": "/tmp/sidecar", "checkpoint-mount": "/tmp/mtc_checkpoints"}
    assert [v["csi"]["driver"] for v in pod(head(js))["volumes"]] == ["gcsfuse.csi.storage.gke.io"]  # no MTC volume
    assert "--sidecar_name=external" not in named(
        pod(head(jobset(params())))["initContainers"], "pathways-proxy")["args"]


def test_a_priority_class_lands_on_both_the_head_and_the_worker_pods():
    js = jobset(params(priority="high-prior-job"))
    assert pod(head(js))["priorityClassName"] == pod(worker(js))["priorityClassName"] == "high-prior-job"
    assert "priorityClassName" not in pod(head(jobset(params())))


def _drop_143(js):
    head(js)["template"]["spec"]["podFailurePolicy"]["rules"] = [
        r for r in head(js)["template"]["spec"]["podFailurePolicy"]["rules"]
        if 143 not in r.get("onExitCodes", {}).get("values", [])]


def _sidecar_without_flag(js):
    named(pod(head(js))["initContainers"], "pathways-proxy")["args"].remove("--sidecar_name=external")


def _proxy_as_main_container(js):
    hp = pod(head(js))
    proxy = named(hp["initContainers"], "pathways-proxy")
    hp["initContainers"].remove(proxy)
    proxy.pop("restartPolicy")
    hp["containers"].append(proxy)


def _csi_on_head(js):
    pod(head(js))["volumes"] = [{"name": "m", "csi": {"driver": "multitier-checkpoint.csi.storage.gke.io"}}]


def _elastic_above_slices(js):
    args = named(pod(head(js))["initContainers"], "pathways-proxy")["args"]
    args[args.index("--num_elastic_instances=4")] = "--num_elastic_instances=9"


def _small_backoff(js):
    worker(js)["template"]["spec"]["backoffLimit"] = 6


def _controller_command(js):
    return named(pod(head(js))["containers"], "controller")["command"]


def _simulator_flag(js):
    _controller_command(js).extend(["--slices", "4"])


def _name_and_run_dir(js):
    _controller_command(js).extend(["--name", "dew-test"])


def _url_run_dir(js):
    cmd = _controller_command(js)
    cmd[cmd.index("--run-dir") + 1] = "gs://dew-bucket/runs/dew-test"


def _run_dir_off_the_mount(js):
    cmd = _controller_command(js)
    cmd[cmd.index("--run-dir") + 1] = "/tmp/runs/dew-test"


def _fuse_without_annotation(js):
    head(js)["template"]["spec"]["template"]["metadata"]["annotations"] = {}


@pytest.mark.parametrize("break_it,expected", [
    (_drop_143, "exit code 143"),
    (_sidecar_without_flag, "needs --sidecar_name=external"),
    (_proxy_as_main_container, "native sidecar"),
    (_csi_on_head, "must not mount the multi-tier checkpoint volume"),
    (_elastic_above_slices, "--num_elastic_instances=9 must be 1..4"),
    (_small_backoff, "backoffLimit must allow"),
    (_simulator_flag, "--slices applies only to simulated slices"),
    (_name_and_run_dir, "give --run-dir or --name, not both"),
    (_url_run_dir, "must be an absolute path on a mounted volume"),
    (_run_dir_off_the_mount, "must lie under a mount of a persistent volume"),
    (_fuse_without_annotation, 'gke-gcsfuse/volumes: "true"'),
])
def test_the_semantic_checks_catch_what_the_schema_allows(break_it, expected):
    js = jobset(params(mtc=True, sidecar_image="s/side:1", elastic_slices=4))
    break_it(js)
    assert V.jobset_schema_errors(js) == []  # the schema alone would let it through
    assert any(expected in e for e in V.semantic_errors(js)), V.semantic_errors(js)


def test_priority_classes_are_checked_against_kubernetes_published_schema():
    good = R.priority_class("high-prior-job", 2000, "high")
    assert V.core_schema_errors(good) == []
    bad = dict(good, value="2000", preemptionPolicy="Sometimes")
    assert V.core_schema_errors(bad)


def test_a_checkpoint_configuration_gets_semantic_checks_since_gke_publishes_no_schema_here():
    good = R.checkpoint_configuration("mtc", "gs://dew-mtc", "ct6e-standard-4t", "50Gi")
    assert good["spec"]["cloudStorageBucketName"] == "dew-mtc"
    assert V.checkpoint_configuration_errors(good) == []
    bad = copy.deepcopy(good)
    bad["spec"].update(cloudStorageBucketName="gs://dew-mtc", inMemoryVolumeSize="lots", nodeSelector={})
    assert len(V.checkpoint_configuration_errors(bad)) == 3


def test_the_tpu_table_counts_hosts_per_slice_and_accepts_the_v5litepod_name():
    assert lookup_tpu_type("v5litepod") is TPU_TYPES["v5e"]
    assert TPU_TYPES["v5e"].hosts("16x16") == 64
    assert TPU_TYPES["v5p"].hosts("2x2x1") == 1
    assert TPU_TYPES["v4"].gke_accelerator == "tpu-v4-podslice"
    assert TPU_TYPES["v6e"].instance_type("2x4") == "tpuv6e:2x4"


def test_the_recipe_is_checked_against_the_one_list_of_known_recipes():
    assert KNOWN_RECIPES == ("lm", "mlp")
    with pytest.raises(ParameterError) as e:
        jobset(params(recipe="gpt"))
    assert e.value.field == "--recipe" and "lm, mlp" in e.value.fix


# -- the command line -------------------------------------------------------------------

RENDER = ["k8s", "render", "--name", "dew-cli", "--tpu-type", "v5e", "--topology", "4x8", "--slices", "2",
          "--elastic-slices", "2", "--image", "r/controller:1", "--recipe", "lm", "--bucket", "gs://dew-bucket"]


def _with(argv, flag, value):
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


@pytest.mark.parametrize("argv,field,fix", [
    (_with(RENDER, "--elastic-slices", "3"), "--elastic-slices", "use at most 2"),
    (_with(RENDER, "--topology", "2x2x2"), "--topology", "use one of 2x2, 2x4"),
    (_with(RENDER, "--name", "Dew_Run"), "--name", "lowercase letters"),
    (_with(RENDER, "--name", "d" * 23), "--name", "shorten --name to at most 22 characters"),
    (_with(RENDER, "--bucket", "s3://dew-bucket"), "--bucket", "pass gs://BUCKET_NAME"),
    (_with(RENDER, "--recipe", "bert"), "--recipe", "use one of lm, mlp"),
    (_with(RENDER, "--tpu-type", "v3"), "--tpu-type", "use one of v4, v5e, v5p, v6e"),
    (RENDER + ["--mtc"], "--sidecar-image", "build k8s/Dockerfile.sidecar"),
    (RENDER + ["--proxy-flag-spelling", "both"], "--proxy-flag-spelling", "instances, slices"),
    (RENDER + ["--grace-seconds", "5"], "--grace-seconds", "at least 30"),
    (_with(RENDER, "--bucket", "gs://dew-bucket/../other"), "--bucket", "without '.', '..'"),
    (RENDER + ["--service-account", "Dew_SA"], "--service-account", "Workload Identity access to --bucket"),
])
def test_bad_parameters_exit_nonzero_naming_the_field_and_the_fix_and_write_nothing(
        argv, field, fix, tmp_path, capsys):
    out = tmp_path / "jobset.yaml"
    out.write_text("previous contents\n")
    assert main(argv + ["--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"error: {field}:" in captured.err and fix in captured.err
    assert out.read_text() == "previous contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobset.yaml"]  # no temporary left behind


def test_an_out_path_in_a_missing_directory_is_refused_before_rendering(tmp_path, capsys):
    assert main(RENDER + ["--out", str(tmp_path / "nowhere" / "js.yaml")]) == 2
    assert "error: --out: directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_rendering_twice_gives_identical_bytes_and_out_matches_stdout(tmp_path, capsys):
    assert main(RENDER) == 0
    first = capsys.readouterr().out
    assert main(RENDER) == 0
    assert capsys.readouterr().out == first
    assert main(RENDER + ["--out", str(tmp_path / "js.yaml")]) == 0
    assert (tmp_path / "js.yaml").read_text() == first
    (doc,) = list(yaml.safe_load_all(first))
    assert doc["metadata"]["name"] == "dew-cli"
    assert first.splitlines()[2].strip("# ") == "elastic-dew " + " ".join(RENDER)  + \
        " --proxy-flag-spelling instances"


def test_validate_accepts_good_files_and_reports_each_problem_of_a_bad_one(tmp_path, capsys):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    assert main(RENDER + ["--out", str(good)]) == 0
    js = yaml.safe_load(good.read_text())
    pod(head(js))["containers"][0]["env"] = []
    bad.write_text(yaml.safe_dump(js))
    assert main(["k8s", "validate", str(good)]) == 0
    capsys.readouterr()
    assert main(["k8s", "validate", str(good), str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "JAX_PLATFORMS must be 'proxy'" in err and "good.yaml" not in err


def test_the_elastic_dew_command_reaches_the_k8s_renderer_in_a_real_process_without_starting_jax():
    code = ("import sys; from elastic_dew.cli import main; rc = main(sys.argv[1:]); "
            "assert 'jax' not in sys.modules, 'rendering imported jax'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, *RENDER], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["kind"] == "JobSet"
