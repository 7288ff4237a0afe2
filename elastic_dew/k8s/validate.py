"""Check rendered manifests: schemas first, then what a schema cannot say.

* JobSets: against the JobSet CRD's ``openAPIV3Schema`` with ``jsonschema`` (by default the
  facts of it shipped in the package as ``jobset_schema.json``, produced from the CRD by
  ``scripts/jobset_schema.py``, so validation needs no file beside the code), made strict the
  way the API server's field validation is (an object schema that lists its properties and
  does not preserve unknown fields refuses any other field, so a misspelt key fails here
  rather than being pruned in the cluster); each replicated Job template also against
  Kubernetes' own ``batch/v1`` Job schema.
* Core kinds (PriorityClass): Kubernetes' published schemas, shipped offline in the
  ``kubernetes-validate`` package.
* CheckpointConfiguration: a GKE CRD with no published schema here, so semantic checks only.
* Every JobSet: the semantics of an elastic Pathways run (``semantic_errors``).

``jsonschema`` and ``kubernetes-validate`` are the project's ``k8s`` extra
(:data:`INSTALL_K8S`; the ``test`` extra holds them too); they are imported only when a
schema check runs, and a missing one is a ``SettingError`` naming that install command.
Every function returns a list of messages, empty when valid.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

import yaml

from elastic_dew.console import RUN_FLAGS, flag_of
from elastic_dew.elastic.state.persistence import checkpoint_dir_problem
from elastic_dew.k8s import render as R
from elastic_dew.k8s.params import BUCKET, MAX_BACKOFF_LIMIT, MIN_SLICE_RESTARTS, PROXY_FLAG_SPELLINGS, QUANTITY, pinned
from elastic_dew.k8s.tpus import by_accelerator
from elastic_dew.run import SimConfig
from elastic_dew.flags import flag_namer
from elastic_dew.mentions import name_mentions
from elastic_dew.settings import SettingError

__all__ = [
    "INSTALL_K8S",
    "KUBERNETES_VERSION",
    "SCHEMA_RESOURCE",
    "load_jobset_schema",
    "jobset_schema_errors",
    "core_schema_errors",
    "semantic_errors",
    "jobset_failure_action",
    "checkpoint_configuration_errors",
    "document_errors",
]

#: The Kubernetes minor version core kinds are checked against (a current GKE release).
KUBERNETES_VERSION = "1.32"
#: The package data file with the JobSet schema's facts (see scripts/jobset_schema.py).
SCHEMA_RESOURCE = "jobset_schema.json"


def _strict(schema: Any) -> Any:
    """A copy of ``schema`` whose closed objects refuse unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.lru_cache(maxsize=4)
def load_jobset_schema(path: str | None = None) -> dict[str, Any]:
    """The strict JSON Schema of a ``v1alpha2`` JobSet: the package's own by default, or the
    ``openAPIV3Schema`` of the JobSet CRD YAML at ``path`` (another JobSet release)."""
    if path is None:
        doc = json.loads(resources.files("elastic_dew.k8s").joinpath(SCHEMA_RESOURCE).read_text())
        return _strict(doc["schema"])
    crd_path = Path(path)
    if not crd_path.is_file():
        raise FileNotFoundError(f"JobSet CRD not found at {crd_path}")
    crd = yaml.safe_load(crd_path.read_text())
    version = next((v for v in crd.get("spec", {}).get("versions", []) if v.get("name") == "v1alpha2"), None)
    if version is None:
        raise FileNotFoundError(f"{crd_path} is not a JobSet CRD with a v1alpha2 version")
    return _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))


def _path(error: Any) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<root>"


#: What installs the schema checks' libraries (``jsonschema``, ``kubernetes-validate``).
INSTALL_K8S = "pip install 'elastic-dew[k8s]'"


def _schema_library(module: str) -> Any:
    """Import a schema check's library, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise SettingError("validate", "validate", module, problem=(
            f"{error.name or module} is not installed (the schema checks need it); install the k8s extra: "
            f"{INSTALL_K8S}")) from error


def jobset_schema_errors(jobset: dict[str, Any], crd_path: str | None = None) -> list[str]:
    """Schema violations of a JobSet (CRD schema) and of its Job templates (batch/v1 schema)."""
    jsonschema = _schema_library("jsonschema")

    validator = jsonschema.Draft7Validator(load_jobset_schema(crd_path))
    errors = [f"JobSet {_path(e)}: {e.message}" for e in validator.iter_errors(jobset)]
    for rjob in jobset.get("spec", {}).get("replicatedJobs", []):
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": f"{jobset.get('metadata', {}).get('name', 'x')}-{rjob.get('name')}"},
               "spec": rjob.get("template", {}).get("spec", {})}
        errors += [f"replicatedJobs[{rjob.get('name')}] as a Job: {m}" for m in core_schema_errors(job)]
    return errors


def core_schema_errors(obj: dict[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """Violations of Kubernetes' published (strict) schema for a core kind."""
    kubernetes_validate = _schema_library("kubernetes_validate")

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{obj.get('kind')} {_path(e)}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [e.message]
    return []


# -- semantics ------------------------------------------------------------------------

def _rjob(jobset: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((j for j in jobset.get("spec", {}).get("replicatedJobs", []) if j.get("name") == name), None)


def _pod(rjob: dict[str, Any]) -> dict[str, Any]:
    return rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})


def _container(pod: dict[str, Any], name: str, init: bool | None = None) -> dict[str, Any] | None:
    pools = {None: ("initContainers", "containers"), True: ("initContainers",), False: ("containers",)}[init]
    for pool in pools:
        for c in pod.get(pool, []) or []:
            if c.get("name") == name:
                return c
    return None


def _env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", []) or []}


def _flags(c: dict[str, Any]) -> dict[str, str]:
    out = {}
    for a in c.get("args", []) or []:
        k, _, v = a.partition("=")
        out[k] = v
    return out


def _mounts(c: dict[str, Any] | None) -> dict[str, str]:
    return {m["name"]: m["mountPath"] for m in (c or {}).get("volumeMounts", []) or []}


#: Flags of ``elastic-dew train`` that only the simulator takes: under ``JAX_PLATFORMS=proxy``
#: the command refuses them with exit 2, which fails the head Job and the JobSet.
_SIMULATOR_FLAGS = tuple(flag_of(f.name) for f in dataclasses.fields(SimConfig))


def _controller_command_errors(head: dict[str, Any], controller: dict[str, Any]) -> list[str]:
    """The controller's ``elastic-dew train`` command against what the train command accepts
    on real slices, and its run directory against the pod's persistent volumes."""
    where = f"{R.HEAD_JOB}/{R.CONTROLLER}"
    cmd = [str(a) for a in controller.get("command", []) or []]
    given = {a.partition("=")[0] for a in cmd}
    errs = [f"{where}: {flag} applies only to simulated slices; elastic-dew train refuses it under "
            "JAX_PLATFORMS=proxy (exit 2 fails the JobSet)" for flag in _SIMULATOR_FLAGS if flag in given]
    if "--name" in given and "--run-dir" in given:
        errs.append(f"{where}: give --run-dir or --name, not both (elastic-dew train refuses the pair)")
    if "--run-dir" not in cmd or cmd.index("--run-dir") + 1 >= len(cmd):
        return errs + [f"{where}: the command must pass --run-dir on persistent storage"]
    run_dir = cmd[cmd.index("--run-dir") + 1]
    if not run_dir.startswith("/"):
        return errs + [f"{where}: --run-dir {run_dir} must be an absolute path on a mounted volume "
                       "(elastic-dew train refuses URLs such as gs://: mount the bucket with Cloud Storage FUSE)"]
    pod_template = head.get("template", {}).get("spec", {}).get("template", {})
    volumes = {v.get("name"): v for v in pod_template.get("spec", {}).get("volumes", []) or []}
    mounts = [(m.get("mountPath", "").rstrip("/"), volumes.get(m.get("name"), {}))
              for m in controller.get("volumeMounts", []) or []]
    under = [v for path, v in mounts if path and (run_dir == path or run_dir.startswith(path + "/"))]
    persistent = [v for v in under
                  if v.get("csi", {}).get("driver") == R.GCSFUSE_CSI_DRIVER or "persistentVolumeClaim" in v]
    if not persistent:
        return errs + [f"{where}: --run-dir {run_dir} must lie under a mount of a persistent volume "
                       f"(a {R.GCSFUSE_CSI_DRIVER} CSI volume or a PersistentVolumeClaim), or a restarted "
                       "pod cannot resume the run"]
    if any(v.get("csi", {}).get("driver") == R.GCSFUSE_CSI_DRIVER for v in volumes.values()):
        annotations = pod_template.get("metadata", {}).get("annotations", {}) or {}
        if annotations.get(R.GCSFUSE_ANNOTATION) != "true":
            errs.append(f"{R.HEAD_JOB}: a {R.GCSFUSE_CSI_DRIVER} volume needs the pod annotation "
                        f"{R.GCSFUSE_ANNOTATION}: \"true\" (else GKE injects no gcsfuse sidecar and the mount hangs)")
        for name, v in volumes.items():
            if v.get("csi", {}).get("driver") == R.GCSFUSE_CSI_DRIVER and \
                    not v["csi"].get("volumeAttributes", {}).get("bucketName"):
                errs.append(f"{R.HEAD_JOB}: volume {name} needs csi.volumeAttributes.bucketName")
    return errs


def _checkpoint_errors(controller: dict[str, Any]) -> list[str]:
    """The persistent tier's directory against Pathways persistence (the workers write it)."""
    cmd = [str(a) for a in controller.get("command", []) or []]

    def value(flag: str) -> str | None:
        return cmd[cmd.index(flag) + 1] if flag in cmd and cmd.index(flag) + 1 < len(cmd) else None

    if value("--checkpoint-kind") == "multi_tier":
        return []  # written into the workers' own volume through their sidecars, on purpose
    run_dir = value("--run-dir") or "RUN_DIR"
    env = {k: str(v) for k, v in _env_of(controller).items() if isinstance(v, (str, int))}
    problem = checkpoint_dir_problem(value("--checkpoint-dir") or f"{run_dir}/checkpoints", env)
    return [f"{R.HEAD_JOB}/{R.CONTROLLER}: {name_mentions(problem, flag_namer(RUN_FLAGS.values()))}"] if problem else []


def jobset_failure_action(jobset: dict[str, Any], replicated_job: str, reason: str, message: str) -> str:
    """What the JobSet controller does when a child Job of ``replicated_job`` fails with
    ``reason`` and ``message``: the first matching ``failurePolicy`` rule's action, else
    ``RestartJobSet`` (the JobSet API's rule; patterns are searched as RE2 does, unanchored)."""
    for rule in jobset.get("spec", {}).get("failurePolicy", {}).get("rules", []) or []:
        targets = rule.get("targetReplicatedJobs") or [replicated_job]
        reasons = rule.get("onJobFailureReasons") or [reason]
        patterns = rule.get("onJobFailureMessagePatterns") or [""]
        if replicated_job in targets and reason in reasons and any(re.search(p, message) for p in patterns):
            return rule.get("action", "RestartJobSet")
    return "RestartJobSet"


def _head_failure_errors(jobset: dict[str, Any], head: dict[str, Any]) -> list[str]:
    """Exit 143 must resume the run without using the failure budget, exit 2 must end it."""
    rules = head.get("template", {}).get("spec", {}).get("podFailurePolicy", {}).get("rules", []) or []

    def first_rule(code: int) -> tuple[int, dict[str, Any]] | None:
        for i, r in enumerate(rules):
            codes = r.get("onExitCodes", {})
            if codes.get("operator") == "In" and code in codes.get("values", []) and \
                    codes.get("containerName", R.CONTROLLER) == R.CONTROLLER:
                return i, r
        return None

    def outcome(code: int) -> str:
        found = first_rule(code)
        if found is None:
            return "Count"
        i, rule = found
        if rule.get("action") != "FailJob":
            return rule.get("action", "")
        message = R.pod_failure_message(R.CONTROLLER, code, "FailJob", i)
        return jobset_failure_action(jobset, R.HEAD_JOB, "PodFailurePolicy", message)

    errs = []
    if outcome(R.PREEMPTED_EXIT_CODE) not in ("Ignore", "RestartJobSetAndIgnoreMaxRestarts"):
        errs.append(f"{R.HEAD_JOB}: exit code {R.PREEMPTED_EXIT_CODE} must resume the run without using the failure "
                    "budget: a podFailurePolicy Ignore rule, or FailJob with a JobSet failurePolicy rule "
                    "RestartJobSetAndIgnoreMaxRestarts matching its message")
    if outcome(R.USAGE_EXIT_CODE) != "FailJobSet":
        errs.append(f"{R.HEAD_JOB}: exit code {R.USAGE_EXIT_CODE} (a bad command line) must fail the JobSet: a "
                    "podFailurePolicy FailJob rule and a JobSet failurePolicy rule FailJobSet matching its message "
                    "(else the JobSet restarts into the same error)")
    return errs


def _pod_errors(name: str, pod: dict[str, Any]) -> list[str]:
    """Pinned images, and cluster DNS for a pod on the host network."""
    errs = []
    if pod.get("hostNetwork") and pod.get("dnsPolicy") != "ClusterFirstWithHostNet":
        errs.append(f"{name}: hostNetwork needs dnsPolicy: ClusterFirstWithHostNet, or the pods cannot resolve "
                    "the coordinator's JobSet DNS name")
    for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
        image = str(c.get("image", ""))
        if not pinned(image):
            errs.append(f"{name}/{c.get('name')}: image {image} is not pinned to a version: a restarted pod could "
                        "pull another release than the running ones (use a tag other than latest, or a digest)")
    return errs


def semantic_errors(jobset: dict[str, Any]) -> list[str]:
    """What an elastic Pathways JobSet must get right beyond its schema."""
    errs: list[str] = []
    spec = jobset.get("spec", {})
    head, worker = _rjob(jobset, R.HEAD_JOB), _rjob(jobset, R.WORKER_JOB)
    if head is None or worker is None:
        return [f"replicatedJobs must include {R.HEAD_JOB!r} and {R.WORKER_JOB!r}"]
    if spec.get("coordinator", {}).get("replicatedJob") != R.HEAD_JOB:
        errs.append(f"spec.coordinator.replicatedJob must be {R.HEAD_JOB!r} (PATHWAYS_HEAD comes from it)")
    if spec.get("successPolicy", {}).get("targetReplicatedJobs") != [R.HEAD_JOB]:
        errs.append(f"spec.successPolicy must target only {R.HEAD_JOB!r}: workers run until the head is done")

    hpod, wpod = _pod(head), _pod(worker)
    # Head: resource manager and proxy as native sidecars, controller as the main container.
    for name in (R.RESOURCE_MANAGER, R.PROXY):
        c = _container(hpod, name, init=True)
        if c is None or c.get("restartPolicy") != "Always":
            errs.append(f"{R.HEAD_JOB}: {name} must be an initContainer with restartPolicy: Always (native sidecar)")
    controller = _container(hpod, R.CONTROLLER, init=False)
    if controller is None:
        errs.append(f"{R.HEAD_JOB}: no {R.CONTROLLER!r} container")
    else:
        env = _env_of(controller)
        if env.get("JAX_PLATFORMS") != "proxy":
            errs.append(f"{R.HEAD_JOB}/{R.CONTROLLER}: JAX_PLATFORMS must be 'proxy'")
        if not str(env.get("JAX_BACKEND_TARGET", "")).startswith("grpc://"):
            errs.append(f"{R.HEAD_JOB}/{R.CONTROLLER}: JAX_BACKEND_TARGET must be grpc://HOST:{R.PROXY_PORT}")
        if [str(a) for a in controller.get("command", []) or []][:2] == ["elastic-dew", "train"]:
            errs += _controller_command_errors(head, controller) + _checkpoint_errors(controller)
        elif not controller.get("command"):
            errs.append(f"{R.HEAD_JOB}/{R.CONTROLLER}: no command (the program the controller runs)")
    if hpod.get("restartPolicy") != "Never":
        errs.append(f"{R.HEAD_JOB}: restartPolicy must be Never (podFailurePolicy requires it)")
    errs += _head_failure_errors(jobset, head)
    errs += _pod_errors(R.HEAD_JOB, hpod) + _pod_errors(R.WORKER_JOB, wpod)
    grace = hpod.get("terminationGracePeriodSeconds", 30)
    if grace < 30:
        errs.append(f"{R.HEAD_JOB}: terminationGracePeriodSeconds {grace} leaves no time for the checkpoint write")

    # Proxy flags.
    proxy = _container(hpod, R.PROXY) or {}
    pflags = _flags(proxy)
    for flag in ("--resource_manager_address", "--server_port", "--gcs_scratch_location"):
        if flag not in pflags:
            errs.append(f"{R.PROXY}: missing {flag}")
    if not pflags.get("--gcs_scratch_location", "gs://").startswith("gs://"):
        errs.append(f"{R.PROXY}: --gcs_scratch_location must be a gs:// URL")
    elastic = [f for f in PROXY_FLAG_SPELLINGS.values() if f in pflags]
    slices = worker.get("replicas", 0)
    if len(elastic) > 1:
        errs.append(f"{R.PROXY}: give the number of elastic slices once, not as {' and '.join(elastic)}")
    for f in elastic:
        if not pflags[f].isdigit() or not 0 < int(pflags[f]) <= slices:
            errs.append(f"{R.PROXY}: {f}={pflags[f]} must be 1..{slices} (the worker replicas)")
    rm_flags = _flags(_container(hpod, R.RESOURCE_MANAGER) or {})
    if rm_flags.get("--instance_count") != str(slices):
        errs.append(f"{R.RESOURCE_MANAGER}: --instance_count must equal the {slices} worker replicas")

    # Workers: TPU placement and a failure budget large enough for repeated slice loss.
    selector = wpod.get("nodeSelector", {})
    tpu = by_accelerator(selector.get(R.ACCELERATOR_LABEL, ""))
    topology = selector.get(R.TOPOLOGY_LABEL, "")
    if tpu is None:
        errs.append(f"{R.WORKER_JOB}: nodeSelector {R.ACCELERATOR_LABEL} names no known TPU accelerator")
    elif topology not in tpu.topologies:
        errs.append(f"{R.WORKER_JOB}: {tpu.name} has no topology {topology!r}")
    else:
        jspec = worker.get("template", {}).get("spec", {})
        hosts = tpu.hosts(topology)
        if jspec.get("completions") != hosts or jspec.get("parallelism") != hosts:
            errs.append(f"{R.WORKER_JOB}: completions and parallelism must be {hosts} (hosts in a {topology} slice)")
        if not hosts * MIN_SLICE_RESTARTS <= jspec.get("backoffLimit", 0) <= MAX_BACKOFF_LIMIT:
            errs.append(f"{R.WORKER_JOB}: backoffLimit must allow at least {MIN_SLICE_RESTARTS} restarts per host "
                        f"({hosts * MIN_SLICE_RESTARTS}) so a slice can fail repeatedly without failing the JobSet")
        worker_container = _container(wpod, R.WORKER_JOB, init=False) or {}
        if worker_container.get("resources", {}).get("limits", {}).get("google.com/tpu") != str(tpu.chips_per_host):
            errs.append(f"{R.WORKER_JOB}: each pod must request google.com/tpu: {tpu.chips_per_host}")
        if rm_flags.get("--instance_type") != tpu.instance_type(topology):
            errs.append(f"{R.RESOURCE_MANAGER}: --instance_type must be {tpu.instance_type(topology)}")
    if worker.get("template", {}).get("metadata", {}).get("annotations", {}).get(R.EXCLUSIVE_TOPOLOGY) \
            != R.NODE_POOL_LABEL:
        errs.append(f"{R.WORKER_JOB}: annotate {R.EXCLUSIVE_TOPOLOGY}: {R.NODE_POOL_LABEL} (one slice per node pool)")
    if hpod.get("priorityClassName") != wpod.get("priorityClassName"):
        errs.append("priorityClassName must be the same on the head and worker pods (hot swap)")

    # Multi-tier checkpointing: sidecar, shared memory and CSI volume on workers, not the head.
    if pflags.get("--sidecar_name") == "external":
        sidecar = _container(wpod, R.SIDECAR)
        wc = _container(wpod, R.WORKER_JOB, init=False)
        volumes = {v["name"]: v for v in wpod.get("volumes", []) or []}
        csi = [n for n, v in volumes.items() if v.get("csi", {}).get("driver") == R.MTC_CSI_DRIVER]
        shm = [n for n, v in volumes.items() if v.get("emptyDir", {}).get("medium") == "Memory"]
        if sidecar is None:
            errs.append(f"{R.WORKER_JOB}: --sidecar_name=external needs the {R.SIDECAR} container")
        if not csi or not shm:
            errs.append(f"{R.WORKER_JOB}: needs a {R.MTC_CSI_DRIVER} CSI volume and a Memory emptyDir")
        shm_dir = _flags(wc or {}).get("--cloud_pathways_sidecar_shm_directory")
        for c in (sidecar, wc):
            if c is None or not csi or not shm:
                continue
            mounts = _mounts(c)
            if csi[0] not in mounts or shm[0] not in mounts:
                errs.append(f"{R.WORKER_JOB}/{c['name']}: must mount both the CSI volume and the shared memory")
            elif mounts[shm[0]] != shm_dir:
                errs.append(f"{R.WORKER_JOB}/{c['name']}: shared memory must be mounted at "
                            f"--cloud_pathways_sidecar_shm_directory ({shm_dir})")
        if any(v.get("csi", {}).get("driver") == R.MTC_CSI_DRIVER for v in hpod.get("volumes", []) or []):
            errs.append(f"{R.HEAD_JOB}: must not mount the multi-tier checkpoint volume (workers only)")
    elif _container(wpod, R.SIDECAR) is not None:
        errs.append(f"{R.PROXY}: the {R.SIDECAR} container needs --sidecar_name=external on the proxy")
    return errs


def checkpoint_configuration_errors(obj: dict[str, Any]) -> list[str]:
    """Semantic checks of GKE's CheckpointConfiguration (no schema is published for it here)."""
    errs = []
    if obj.get("apiVersion") != "checkpointing.gke.io/v1":
        errs.append("CheckpointConfiguration: apiVersion must be checkpointing.gke.io/v1")
    spec = obj.get("spec", {})
    bucket = spec.get("cloudStorageBucketName", "")
    if not BUCKET.match(bucket):
        errs.append("CheckpointConfiguration: spec.cloudStorageBucketName must be a bare bucket name (no gs://)")
    if not spec.get("nodeSelector"):
        errs.append("CheckpointConfiguration: spec.nodeSelector must select the TPU nodes")
    if not QUANTITY.match(str(spec.get("inMemoryVolumeSize", ""))):
        errs.append("CheckpointConfiguration: spec.inMemoryVolumeSize must be a quantity such as 50Gi")
    return errs


def document_errors(docs: Iterable[dict[str, Any]], crd_path: str | None = None,
                    schemas: bool = True) -> list[str]:
    """All problems of a stream of manifests, dispatched by kind."""
    errs: list[str] = []
    for doc in docs:
        kind = doc.get("kind")
        where = f"{kind}/{doc.get('metadata', {}).get('name')}"
        if kind == "JobSet":
            found = (jobset_schema_errors(doc, crd_path) if schemas else []) + semantic_errors(doc)
        elif kind == "CheckpointConfiguration":
            found = checkpoint_configuration_errors(doc)
        else:
            found = core_schema_errors(doc) if schemas else []
        errs += [f"{where}: {m}" for m in found]
    return errs
