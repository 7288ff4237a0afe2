"""Build the Kubernetes objects of an elastic Pathways run, and write them as stable YAML.

``jobset(params)`` is the elastic training JobSet (``jobset.x-k8s.io/v1alpha2``):

* ``pathways-head`` (one pod): the Pathways resource manager and ``pathways-proxy`` run as
  native sidecars (init containers with ``restartPolicy: Always``), so they start before the
  controller, outlive its final checkpoint write, and stop when it ends; the ``controller``
  container runs ``elastic-dew train RECIPE`` (or the user's ``command`` as given, told its
  directories and the grace period in its environment) with ``JAX_PLATFORMS=proxy``, its small run
  record on ``--bucket`` mounted at ``/gcs`` by the Cloud Storage FUSE CSI driver (GKE injects
  the gcsfuse sidecar, a native sidecar too, ahead of the others: it starts first and stops
  last, after the controller's final write), and its checkpoints at a ``gs://`` URL, which
  the TPU workers write themselves under Pathways persistence.
  By default (``recreate-jobset``, as pathwaysutils' and xpk's generators do) the head Job's
  ``podFailurePolicy`` fails the Job on exit 143 (preempted after writing its checkpoint),
  on an eviction and on exit 2 (a bad command line), and the JobSet's ``failurePolicy``
  rules read the Job's failure message: 143 and evictions recreate the whole JobSet without
  using ``maxRestarts``, 2 fails it. ``restart-head`` instead ignores 143 and evictions, so
  the head pod restarts alone (not verified on a real cluster).
* ``pathways-worker`` (one Job per slice, one pod per TPU host): TPU node selectors, the
  exclusive-topology annotation, the shared ``/tmp`` host directory and
  ``MEGASCALE_GRPC_ENABLE_XOR_TRACER=false`` (as pathwaysutils' generator), and a ``backoffLimit`` large enough that a slice can be lost
  and come back many times without failing the JobSet, which is the point of elastic training.

The one-time cluster objects that hot swap and multi-tier checkpointing need are
:mod:`elastic_dew.k8s.cluster`'s; :func:`elastic_dew.k8s.yaml_text.dump` writes any of them
deterministically.
The layout mirrors pathwaysutils' ``PathwaysJobSet`` (ports, environment, ``/tmp`` volume,
backoff formula) and xpk's Pathways template (``hostNetwork``, ``dnsPolicy``, the Kueue queue
label); see docs/kubernetes.md for why this module does not call it.
"""

from __future__ import annotations

from typing import Any

from elastic_dew.console import flag_of
from elastic_dew.elastic.state.storage import GRACE_ENV
from elastic_dew.k8s.params import CHECKPOINT_DIR_ENV, RUN_DIR_ENV, RUN_MOUNT, JobSetParams, program_words
from elastic_dew.run import USAGE_EXIT
from elastic_dew.runtime import PREEMPTED_EXIT

__all__ = [
    "HEAD_JOB",
    "WORKER_JOB",
    "CONTROLLER",
    "PREEMPTED_EXIT_CODE",
    "USAGE_EXIT_CODE",
    "QUEUE_LABEL",
    "pod_failure_message",
    "jobset",
]

HEAD_JOB = "pathways-head"
WORKER_JOB = "pathways-worker"
CONTROLLER = "controller"
RESOURCE_MANAGER = "pathways-rm"
PROXY = "pathways-proxy"
SIDECAR = "colocated-python-sidecar"

PROXY_PORT = 29000
RM_PORT = 29001
WORKER_PORT = 29005
SIDECAR_PORT = 50051
SIDECAR_SHM_DIR = "/tmp/sidecar"
SIDECAR_SHM_VOLUME = "sidecar-shm"
#: The colocated-Python sidecar's resource requests (Google's Pathways launcher template).
SIDECAR_REQUESTS = {"cpu": "4", "memory": "16Gi"}
#: pathwaysutils' generator shares the node's /tmp with the head's workload and the workers.
SHARED_TMP = "shared-tmp"
#: Images are pinned (``--pathways-version``, tagged ``--image``), so a restarted pod reuses
#: the node's copy of the very same image.
PULL_POLICY = "IfNotPresent"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MTC_CSI_DRIVER = "multitier-checkpoint.csi.storage.gke.io"
GCSFUSE_CSI_DRIVER = "gcsfuse.csi.storage.gke.io"
#: The pod annotation that makes GKE's webhook inject the gcsfuse sidecar.
GCSFUSE_ANNOTATION = "gke-gcsfuse/volumes"
#: The head pod's volume that holds the run directory (``--bucket`` through Cloud Storage FUSE).
RUN_VOLUME = "run-storage"
#: gcsfuse flags: implicit-dirs shows folders that exist only as object name prefixes (a
#: run directory written by another pod, or made with gcloud), so a restarted controller
#: finds its run.
GCSFUSE_MOUNT_OPTIONS = "implicit-dirs"
IMAGE_REPO = "us-docker.pkg.dev/cloud-tpu-v2-images/pathways"

#: The controller's exit code after SIGTERM once its checkpoint is written (128 + 15): the
#: runtime's own constant, so the manifest and the program cannot disagree.
PREEMPTED_EXIT_CODE = PREEMPTED_EXIT
#: The exit code of a bad command line (the run's own constant): restarting cannot fix it.
USAGE_EXIT_CODE = USAGE_EXIT

EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"


def pod_failure_message(container: str, exit_code: int, action: str = "FailJob", index: int = 0) -> str:
    """The Job failure message Kubernetes writes when a ``podFailurePolicy`` exit-code rule
    fires (``pkg/controller/job/pod_failure_policy.go``); the JobSet's failure rules match it."""
    return (f"Container {container} for pod NAMESPACE/POD failed with exit code {exit_code} "
            f"matching {action} rule at index {index}")


def _exit_pattern(code: int) -> str:
    return f"failed with exit code {code} matching FailJob rule"


_EVICTION_PATTERN = "has condition DisruptionTarget matching FailJob rule"


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


_COORDINATOR = "metadata.labels['jobset.sigs.k8s.io/coordinator']"
_JOBSET_NAME = "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"
_RJOB_NAME = "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"


def _ports(*numbers: int) -> list[dict[str, Any]]:
    return [{"containerPort": n, "protocol": "TCP"} for n in numbers]


def _resource_manager(p: JobSetParams) -> dict[str, Any]:
    return {
        "name": RESOURCE_MANAGER,
        "image": f"{IMAGE_REPO}/server:{p.pathways_version}",
        "imagePullPolicy": PULL_POLICY,
        "restartPolicy": "Always",
        "args": [
            f"--server_port={RM_PORT}",
            f"--gcs_scratch_location={p.scratch_location}",
            "--node_type=resource_manager",
            f"--instance_count={p.slices}",
            f"--instance_type={p.tpu.instance_type(p.topology)}",
        ],
        "env": [
            _field_env("REPLICATED_JOB_NAME", _RJOB_NAME),
            _field_env("JOBSET_NAME", _JOBSET_NAME),
            _field_env("HOST_ADDRESS", _COORDINATOR),
            _env("TPU_SKIP_MDS_QUERY", "true"),
        ],
        "ports": _ports(RM_PORT, RM_PORT + 1),
        "resources": {"limits": {"cpu": "8", "memory": "32G"}},
    }


def _proxy(p: JobSetParams) -> dict[str, Any]:
    from elastic_dew.k8s.params import PROXY_FLAG_SPELLINGS

    args = [
        f"--resource_manager_address=$(PATHWAYS_HEAD):{RM_PORT}",
        f"--server_port={PROXY_PORT}",
        f"--gcs_scratch_location={p.scratch_location}",
    ]
    if p.elastic_slices > 0:
        args.append(f"{PROXY_FLAG_SPELLINGS[p.proxy_flag_spelling]}={p.elastic_slices}")
    if p.mtc:
        args.append("--sidecar_name=external")
    return {
        "name": PROXY,
        "image": f"{IMAGE_REPO}/proxy_server:{p.pathways_version}",
        "imagePullPolicy": PULL_POLICY,
        "restartPolicy": "Always",
        "args": args,
        "env": [
            _field_env("PATHWAYS_HEAD", _COORDINATOR),
            _env("IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS", "true"),
        ],
        "ports": _ports(PROXY_PORT),
        "resources": {"limits": {"cpu": "16", "memory": "100G"}},
    }


def controller_command(p: JobSetParams) -> list[str]:
    """The controller's command line: ``command``'s words as given, or the trainer, on the
    real slices, resuming from run_dir.

    No ``--slices``: under ``JAX_PLATFORMS=proxy`` the allocation defines the slices and the
    train command refuses the simulator's flags (exit 2, which fails the JobSet). No
    ``--name``: ``--run-dir`` names the run directory already, and the two exclude each other.
    tests/test_k8s_train_seam.py runs this command through the train command's own checks.
    """
    if p.command is not None:
        return program_words(p)
    settings: dict[str, Any] = {"run_dir": p.run_dir, "minimum_slice_count": p.min_slices}
    if p.mtc:
        # The persistent tier is then the guide's ReplicatorCheckpointManager, writing through
        # the workers' colocated-Python sidecars into their multi-tier checkpoint volume.
        settings.update(checkpoint_kind="multi_tier", checkpoint_dir=p.mtc_ramdisk_dir)
    else:
        # Under ENABLE_PATHWAYS_PERSISTENCE the workers write the arrays themselves: a gs://
        # URL they can all reach, not the FUSE mount that exists only in this pod.
        settings.update(checkpoint_dir=p.checkpoint_dir)
    # Each flag is the one its setting declares (elastic_dew.console.flag_of).
    return ["elastic-dew", "train", str(p.recipe),
            *(word for field, value in settings.items() for word in (flag_of(field), str(value)))]


def _controller(p: JobSetParams) -> dict[str, Any]:
    return {
        "name": CONTROLLER,
        "image": p.image,
        "imagePullPolicy": PULL_POLICY,
        "command": controller_command(p),
        "env": [
            _env("JAX_PLATFORMS", "proxy"),
            _env("JAX_BACKEND_TARGET", f"grpc://localhost:{PROXY_PORT}"),
            _env("IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS", "true"),
            _env("XCLOUD_ENVIRONMENT", "GCP"),
            _env("ENABLE_PATHWAYS_PERSISTENCE", "1"),
            _field_env("JOBSET_NAME", _JOBSET_NAME),
            # The pod's terminationGracePeriodSeconds: a preemption's checkpoint gets what is
            # left of it, so the controller exits 143 before the kubelet's SIGKILL.
            _env(GRACE_ENV, str(p.grace_seconds)),
            *_program_env(p),
        ],
        "volumeMounts": [{"name": RUN_VOLUME, "mountPath": RUN_MOUNT}, _shared_tmp_mount()],
        "resources": {"limits": {"cpu": "24", "memory": "100G"}},
    }


def _program_env(p: JobSetParams) -> list[dict[str, Any]]:
    """Where a ``command`` program keeps its run record and its checkpoints (none for a recipe,
    whose command line carries them)."""
    if p.command is None:
        return []
    return [_env(RUN_DIR_ENV, p.run_dir), _env(CHECKPOINT_DIR_ENV, p.mtc_ramdisk_dir if p.mtc else p.checkpoint_dir)]


def _shared_tmp_mount() -> dict[str, Any]:
    return {"name": SHARED_TMP, "mountPath": "/tmp"}


def _shared_tmp_volume() -> dict[str, Any]:
    return {"name": SHARED_TMP, "hostPath": {"path": "/tmp", "type": "DirectoryOrCreate"}}


def _pod_spec(p: JobSetParams, node_selector: dict[str, str], restart_policy: str) -> dict[str, Any]:
    """What every pod of the JobSet shares: its nodes, restart policy, grace period, service
    account, the node's network with cluster DNS (xpk's Pathways template) and the priority
    class (hot swap), when one is given."""
    pod_spec: dict[str, Any] = {
        "nodeSelector": node_selector,
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": p.grace_seconds,
        "serviceAccountName": p.service_account,
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
    }
    if p.priority:
        pod_spec["priorityClassName"] = p.priority
    return pod_spec


def _head_failure_rules(p: JobSetParams) -> list[dict[str, Any]]:
    exit_rule = lambda action, code: {"action": action, "onExitCodes": {  # noqa: E731
        "containerName": CONTROLLER, "operator": "In", "values": [code]}}
    eviction = {"onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    if p.on_controller_failure == "restart-head":
        return [exit_rule("Ignore", PREEMPTED_EXIT_CODE), {"action": "Ignore", **eviction},
                exit_rule("FailJob", USAGE_EXIT_CODE)]
    return [exit_rule("FailJob", PREEMPTED_EXIT_CODE), exit_rule("FailJob", USAGE_EXIT_CODE),
            {"action": "FailJob", **eviction}]


def _jobset_failure_rules(p: JobSetParams) -> list[dict[str, Any]]:
    bad_command = {
        "name": "BadCommandLineFailsTheJobSet",
        "action": "FailJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "targetReplicatedJobs": [HEAD_JOB],
    }
    if p.on_controller_failure == "restart-head":
        return [bad_command]
    return [
        {
            "name": "PreemptedControllerRecreatesTheJobSet",
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": ["PodFailurePolicy"],
            "onJobFailureMessagePatterns": [_exit_pattern(PREEMPTED_EXIT_CODE), _EVICTION_PATTERN],
            "targetReplicatedJobs": [HEAD_JOB],
        },
        {**bad_command, "onJobFailureMessagePatterns": [_exit_pattern(USAGE_EXIT_CODE)]},
    ]


def _run_volume(p: JobSetParams) -> dict[str, Any]:
    """``--bucket`` as a CSI ephemeral volume of the Cloud Storage FUSE driver."""
    return {
        "name": RUN_VOLUME,
        "csi": {
            "driver": GCSFUSE_CSI_DRIVER,
            "volumeAttributes": {"bucketName": p.bucket_name, "mountOptions": GCSFUSE_MOUNT_OPTIONS},
        },
    }


def _head_job(p: JobSetParams) -> dict[str, Any]:
    pod_spec = _pod_spec(p, {NODE_POOL_LABEL: p.head_node_pool}, "Never")
    pod_spec["initContainers"] = [_resource_manager(p), _proxy(p)]
    pod_spec["containers"] = [_controller(p)]
    pod_spec["volumes"] = [_run_volume(p), _shared_tmp_volume()]
    return {
        "name": HEAD_JOB,
        "replicas": 1,
        "template": {
            "metadata": {"annotations": {EXCLUSIVE_TOPOLOGY: "kubernetes.io/hostname"}},
            "spec": {
                "backoffLimit": 0,
                "completionMode": "Indexed",
                "completions": 1,
                "parallelism": 1,
                "podFailurePolicy": {"rules": _head_failure_rules(p)},
                "template": {"metadata": {"annotations": {GCSFUSE_ANNOTATION: "true"}}, "spec": pod_spec},
            },
        },
    }


def _worker_container(p: JobSetParams) -> dict[str, Any]:
    args = [
        f"--resource_manager_address=$(PATHWAYS_HEAD):{RM_PORT}",
        f"--server_port={WORKER_PORT}",
        f"--gcs_scratch_location={p.scratch_location}",
    ]
    env = [
        _env("TPU_MIN_LOG_LEVEL", "0"),
        _env("TF_CPP_MIN_LOG_LEVEL", "0"),
        _env("XCLOUD_ENVIRONMENT", "GCP"),
        _env("MEGASCALE_GRPC_ENABLE_XOR_TRACER", "false"),
        _field_env("MEGASCALE_NUM_SLICES", "metadata.labels['jobset.sigs.k8s.io/replicatedjob-replicas']"),
        _field_env("JOBSET_NAME", _JOBSET_NAME),
        _field_env("REPLICATED_JOB_NAME", _RJOB_NAME),
        _field_env("MEGASCALE_SLICE_ID", "metadata.labels['jobset.sigs.k8s.io/job-index']"),
        _field_env("PATHWAYS_HEAD", _COORDINATOR),
        _field_env("MEGASCALE_COORDINATOR_ADDRESS", _COORDINATOR),
    ]
    container: dict[str, Any] = {
        "name": WORKER_JOB,
        "image": f"{IMAGE_REPO}/server:{p.pathways_version}",
        "imagePullPolicy": PULL_POLICY,
        "args": args,
        "env": env,
        "ports": _ports(WORKER_PORT, WORKER_PORT + 1, 8471, 8080),
        "resources": {"limits": {"google.com/tpu": str(p.tpu.chips_per_host)}},
        "volumeMounts": [_shared_tmp_mount()],
    }
    if p.mtc:
        args.append(f"--cloud_pathways_sidecar_shm_directory={SIDECAR_SHM_DIR}")
        env.append(_env("CLOUD_PATHWAYS_SIDECAR_SHM_DIRECTORY", SIDECAR_SHM_DIR))
        container["volumeMounts"] += _mtc_mounts(p)
    return container


def _mtc_mounts(p: JobSetParams) -> list[dict[str, Any]]:
    return [
        {"name": SIDECAR_SHM_VOLUME, "mountPath": SIDECAR_SHM_DIR},
        {"name": "checkpoint-mount", "mountPath": p.mtc_ramdisk_dir},
    ]


def _sidecar(p: JobSetParams) -> dict[str, Any]:
    return {
        "name": SIDECAR,
        "image": p.sidecar_image,
        "imagePullPolicy": PULL_POLICY,
        "restartPolicy": "Always",
        "env": [
            _env("GRPC_SERVER_ADDRESS", f"0.0.0.0:{SIDECAR_PORT}"),
            _env("CLOUD_PATHWAYS_SIDECAR_SHM_DIRECTORY", SIDECAR_SHM_DIR),
        ],
        "ports": _ports(SIDECAR_PORT),
        # What Google's Pathways launcher template asks for the colocated-Python sidecar.
        "resources": {"requests": dict(SIDECAR_REQUESTS)},
        "volumeMounts": _mtc_mounts(p),
    }


def _worker_job(p: JobSetParams) -> dict[str, Any]:
    pod_spec = _pod_spec(p, {ACCELERATOR_LABEL: p.tpu.gke_accelerator, TOPOLOGY_LABEL: p.topology}, "OnFailure")
    if p.mtc:
        pod_spec["initContainers"] = [_sidecar(p)]
    pod_spec["containers"] = [_worker_container(p)]
    pod_spec["volumes"] = [_shared_tmp_volume()]
    if p.mtc:
        pod_spec["volumes"] += [
            {"name": SIDECAR_SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            {"name": "checkpoint-mount", "csi": {"driver": MTC_CSI_DRIVER}},
        ]
    hosts = p.hosts_per_slice
    return {
        "name": WORKER_JOB,
        "replicas": p.slices,
        "template": {
            "metadata": {"annotations": {EXCLUSIVE_TOPOLOGY: NODE_POOL_LABEL}},
            "spec": {
                "backoffLimit": hosts * p.slice_restarts,
                "completionMode": "Indexed",
                "completions": hosts,
                "parallelism": hosts,
                "template": {"spec": pod_spec},
            },
        },
    }


def jobset(p: JobSetParams) -> dict[str, Any]:
    """The elastic training JobSet for ``p`` (checked first; raises :class:`~elastic_dew.settings.SettingError`).

    Args:
        p: the JobSet's parameters.

    Returns:
        The JobSet, as the object ``kubectl apply`` takes (:func:`~elastic_dew.k8s.dump` writes it as YAML).
    """
    p = p.check()
    labels = {"app.kubernetes.io/name": "elastic-dew"}
    if p.recipe is not None:
        labels["elastic-dew/recipe"] = _label_value(p.recipe)
    if p.queue:
        labels[QUEUE_LABEL] = p.queue
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": p.name,
            "namespace": p.namespace,
            "labels": labels,
        },
        "spec": {
            "coordinator": {"replicatedJob": HEAD_JOB},
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [HEAD_JOB]},
            "failurePolicy": {
                "maxRestarts": p.max_restarts,
                "restartStrategy": "Recreate",
                "rules": _jobset_failure_rules(p),
            },
            "replicatedJobs": [_head_job(p), _worker_job(p)],
        },
    }


def _label_value(text: str) -> str:
    """``text`` as a label value (a module-path recipe such as ``mypkg.recipe`` is one already,
    up to 63 characters; longer ones are cut at a character the value may end with)."""
    return text[:63].rstrip("._-")
