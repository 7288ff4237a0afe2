"""``elastic-dew k8s render --command``: the same elastic JobSet for any controller program
(a pathwaysutils loop, MaxText's trainer), with the failure rules, the grace period and every
check of the recipe variant. Manifests are checked against the shipped JobSet schema (generated
from the CRD; `scripts/jobset_schema.py --check` holds the two together) and the semantic
checks; no cluster exists here.
"""

from __future__ import annotations

import shlex

import pytest
import yaml

from elastic_dew.cli import main
from elastic_dew.k8s import JobSetParams, jobset
from elastic_dew.k8s import render as R
from elastic_dew.k8s import validate as V
from elastic_dew.elastic.config import MULTI_TIER_DIR
from elastic_dew.k8s.params import CHECKPOINT_DIR_ENV, RUN_DIR_ENV

MAXTEXT = ("python3 -m maxtext.trainers.pre_train.train maxtext/configs/base.yml "
           "base_output_directory=$(ELASTIC_DEW_CHECKPOINT_DIR) run_name=dew-mt "
           "enable_single_controller=True elastic_enabled=True")
RENDER = ["k8s", "render", "--name", "dew-mt", "--tpu-type", "v6e-16", "--slices", "2", "--elastic-slices", "1",
          "--image", "us-docker.pkg.dev/p/dew/maxtext:1", "--bucket", "gs://dew-bucket", "--command", MAXTEXT]


def params(**over) -> JobSetParams:
    base = dict(name="dew-mt", tpu_type="v6e", topology="4x4", slices=2, elastic_slices=1,
                image="us-docker.pkg.dev/p/dew/maxtext:1", bucket="gs://dew-bucket/team", command=MAXTEXT)
    return JobSetParams(**{**base, **over})


def head(js):
    return next(j for j in js["spec"]["replicatedJobs"] if j["name"] == R.HEAD_JOB)


def controller(js):
    return head(js)["template"]["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("mtc", [False, True])
def test_a_command_jobset_runs_the_program_as_given_and_passes_the_schema_and_the_semantic_checks(mtc):
    js = jobset(params(mtc=mtc, sidecar_image="r/side:1"))
    c = controller(js)
    assert c["command"] == shlex.split(MAXTEXT)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["JAX_PLATFORMS"] == "proxy" and env["ENABLE_PATHWAYS_PERSISTENCE"] == "1"
    assert env["ELASTIC_DEW_GRACE_PERIOD"] == "300"  # the pod's grace period, passed to the program
    assert env[RUN_DIR_ENV] == "/gcs/team/runs/dew-mt"
    assert env[CHECKPOINT_DIR_ENV] == (MULTI_TIER_DIR if mtc else "gs://dew-bucket/team/runs/dew-mt/checkpoints")
    assert "elastic-dew/recipe" not in js["metadata"]["labels"]
    assert V.jobset_schema_errors(js) == [] and V.semantic_errors(js) == []


def test_a_command_program_gets_the_exit_143_restart_and_the_exit_2_fail_fast_rules_of_the_recipe_variant():
    js, recipe_js = jobset(params()), jobset(params(command=None, recipe="lm"))
    assert js["spec"]["failurePolicy"] == recipe_js["spec"]["failurePolicy"]
    assert head(js)["template"]["spec"]["podFailurePolicy"] == head(recipe_js)["template"]["spec"]["podFailurePolicy"]

    def action(code, index):
        return V.jobset_failure_action(js, R.HEAD_JOB, "PodFailurePolicy",
                                       R.pod_failure_message(R.CONTROLLER, code, "FailJob", index))
    assert action(143, 0) == "RestartJobSetAndIgnoreMaxRestarts"
    assert action(2, 1) == "FailJobSet"
    js["spec"]["failurePolicy"]["rules"] = js["spec"]["failurePolicy"]["rules"][1:]
    assert any("exit code 143 must resume the run" in e for e in V.semantic_errors(js))


def test_the_rendered_command_jobset_validates_against_the_shipped_jobset_schema(tmp_path, capsys):
    out = tmp_path / "maxtext.yaml"
    assert main(RENDER + ["--out", str(out)]) == 0
    assert main(["k8s", "validate", str(out)]) == 0
    assert f"{out}: ok (JobSet)" in capsys.readouterr().out


def test_the_header_command_renders_the_same_bytes_again(tmp_path, capsys):
    assert main(RENDER) == 0
    text = capsys.readouterr().out
    assert "your own program on 2 x v6e 4x4" in text.splitlines()[0]
    again = shlex.split(text.splitlines()[2].strip("# "))
    assert again[:3] == ["elastic-dew", "k8s", "render"] and "--command" in again
    assert main(again[1:]) == 0
    assert capsys.readouterr().out == text
    doc = next(d for d in yaml.safe_load_all(text) if d)
    assert controller(doc)["command"][:3] == ["python3", "-m", "maxtext.trainers.pre_train.train"]


def _without(argv, flag):
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


@pytest.mark.parametrize("argv,fix", [
    (RENDER + ["--recipe", "lm"], "both of --recipe and --command given; pass --recipe to train a recipe"),
    (_without(RENDER, "--command"), "neither of --recipe and --command given"),
    (RENDER[:-1] + ["python3 -m 'unclosed"], "is not a shell-quoted command line"),
    (RENDER[:-1] + ["  "], "the command is empty"),
    (RENDER + ["--grace-seconds", "5"], "at least 30"),
    (_without(RENDER, "--image") + ["--image", "r/maxtext:latest"], "(not :latest) or @sha256:DIGEST"),
    (_without(RENDER, "--bucket") + ["--bucket", "s3://b"], "pass gs://BUCKET_NAME"),
])
def test_a_bad_command_render_exits_2_naming_the_fix_and_writes_nothing(argv, fix, tmp_path, capsys):
    out = tmp_path / "js.yaml"
    assert main(argv + ["--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and fix in captured.err and not out.exists()


def test_a_command_that_runs_elastic_dew_train_still_gets_the_train_commands_checks(capsys):
    js = jobset(params(command="elastic-dew train lm --slices 2"))
    errors = V.semantic_errors(js)
    assert any("--slices applies only to simulated slices" in e for e in errors)
    assert any("must pass --run-dir" in e for e in errors)
    assert main(_without(RENDER, "--command") + ["--command", "elastic-dew train lm --slices 2"]) == 2
    err = capsys.readouterr().err
    assert "error: --command:" in err and "--slices applies only to simulated slices" in err and "--recipe" in err
