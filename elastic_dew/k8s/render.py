"""Build the Kubernetes objects of an elastic Pathways run, and write them as stable YAML.

``jobset(params)`` is the elastic training JobSet (``jobset.x-k8s.io/v1alpha2``):

* ``pathways-head`` (one pod): the Pathways resource manager and ``pathways-proxy`` run as
  native sidecars (init containers with ``restartPolicy: Always``), so they start before the
  controller, outlive its final checkpoint write, and stop when it ends; the ``controller``
  container runs ``elastic-dew train RECIPE`` with ``JAX_PLATFORMS=proxy`` and its run
  directory on ``--bucket``, mounted at ``/gcs`` by the Cloud Storage FUSE CSI driver (GKE
  injects the gcsfuse sidecar, a native sidecar too, ahead of the others: it starts first
  and stops last, after the controller's final write). Its Job's
  ``podFailurePolicy`` ignores exit code 143 (preempted after writing its checkpoint) and
  evictions, so such a restart resumes without using the failure budget.
* ``pathways-worker`` (one Job per slice, one pod per TPU host): TPU node selectors, the
  exclusive-topology annotation, and a ``backoffLimit`` large enough that a slice can be lost
  and come back many times without failing the JobSet, which is the point of elastic training.

``priority_class``, ``checkpoint_configuration`` build the one-time cluster objects that hot
swap and multi-tier checkpointing need, and ``dump`` writes any of them deterministically.
The layout mirrors pathwaysutils' ``PathwaysJobSet`` (ports, environment, backoff formula);
see docs/kubernetes.md for why this module does not call it.
"""

from __future__ import annotations

from typing import Any, Iterable

import yaml

from elastic_dew.k8s.params import RUN_MOUNT, JobSetParams, parse_bucket
from elastic_dew.runtime import PREEMPTED_EXIT

__all__ = [
    "HEAD_JOB",
    "WORKER_JOB",
    "CONTROLLER",
    "PREEMPTED_EXIT_CODE",
    "USAGE_EXIT_CODE",
    "jobset",
    "priority_class",
    "checkpoint_configuration",
    "dump",
    "JOBSET_COMMENTS",
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
#: argparse's exit code for a bad command line: restarting cannot fix it.
USAGE_EXIT_CODE = 2

EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"


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
        "imagePullPolicy": "Always",
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
        "imagePullPolicy": "Always",
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
    """The controller's command line: the trainer, on the real slices, resuming from run_dir.

    No ``--slices``: under ``JAX_PLATFORMS=proxy`` the allocation defines the slices and the
    train command refuses the simulator's flags (exit 2, which fails the JobSet). No
    ``--name``: ``--run-dir`` names the run directory already, and the two exclude each other.
    tests/test_k8s_train_seam.py runs this command through the train command's own checks.
    """
    command = [
        "elastic-dew", "train", p.recipe,
        "--run-dir", p.run_dir,
        "--min-slices", str(p.min_slices),
    ]
    if p.mtc:
        # The persistent tier is then the guide's ReplicatorCheckpointManager, writing through
        # the workers' colocated-Python sidecars into their multi-tier checkpoint volume.
        command += ["--checkpoint-kind", "multi_tier", "--checkpoint-dir", p.mtc_ramdisk_dir]
    return command


def _controller(p: JobSetParams) -> dict[str, Any]:
    return {
        "name": CONTROLLER,
        "image": p.image,
        "imagePullPolicy": "Always",
        "command": controller_command(p),
        "env": [
            _env("JAX_PLATFORMS", "proxy"),
            _env("JAX_BACKEND_TARGET", f"grpc://localhost:{PROXY_PORT}"),
            _env("IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS", "true"),
            _env("XCLOUD_ENVIRONMENT", "GCP"),
            _env("ENABLE_PATHWAYS_PERSISTENCE", "1"),
            _field_env("JOBSET_NAME", _JOBSET_NAME),
        ],
        "volumeMounts": [{"name": RUN_VOLUME, "mountPath": RUN_MOUNT}],
        "resources": {"limits": {"cpu": "24", "memory": "100G"}},
    }


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
    pod_spec: dict[str, Any] = {
        "nodeSelector": {NODE_POOL_LABEL: p.head_node_pool},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": p.grace_seconds,
        "serviceAccountName": p.service_account,
    }
    if p.priority:
        pod_spec["priorityClassName"] = p.priority
    pod_spec["initContainers"] = [_resource_manager(p), _proxy(p)]
    pod_spec["containers"] = [_controller(p)]
    pod_spec["volumes"] = [_run_volume(p)]
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
                "podFailurePolicy": {"rules": [
                    {"action": "Ignore", "onExitCodes": {
                        "containerName": CONTROLLER, "operator": "In", "values": [PREEMPTED_EXIT_CODE]}},
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    {"action": "FailJob", "onExitCodes": {
                        "containerName": CONTROLLER, "operator": "In", "values": [USAGE_EXIT_CODE]}},
                ]},
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
        "imagePullPolicy": "Always",
        "args": args,
        "env": env,
        "ports": _ports(WORKER_PORT, WORKER_PORT + 1, 8471, 8080),
        "resources": {"limits": {"google.com/tpu": str(p.tpu.chips_per_host)}},
    }
    if p.mtc:
        args.append(f"--cloud_pathways_sidecar_shm_directory={SIDECAR_SHM_DIR}")
        env.append(_env("CLOUD_PATHWAYS_SIDECAR_SHM_DIRECTORY", SIDECAR_SHM_DIR))
        container["volumeMounts"] = _mtc_mounts(p)
    return container


def _mtc_mounts(p: JobSetParams) -> list[dict[str, Any]]:
    return [
        {"name": "shared-tmp", "mountPath": SIDECAR_SHM_DIR},
        {"name": "checkpoint-mount", "mountPath": p.mtc_ramdisk_dir},
    ]


def _sidecar(p: JobSetParams) -> dict[str, Any]:
    return {
        "name": SIDECAR,
        "image": p.sidecar_image,
        "imagePullPolicy": "Always",
        "restartPolicy": "Always",
        "env": [
            _env("GRPC_SERVER_ADDRESS", f"0.0.0.0:{SIDECAR_PORT}"),
            _env("CLOUD_PATHWAYS_SIDECAR_SHM_DIRECTORY", SIDECAR_SHM_DIR),
        ],
        "ports": _ports(SIDECAR_PORT),
        "volumeMounts": _mtc_mounts(p),
    }


def _worker_job(p: JobSetParams) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "nodeSelector": {
            ACCELERATOR_LABEL: p.tpu.gke_accelerator,
            TOPOLOGY_LABEL: p.topology,
        },
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": p.grace_seconds,
        "serviceAccountName": p.service_account,
    }
    if p.priority:
        pod_spec["priorityClassName"] = p.priority
    if p.mtc:
        pod_spec["initContainers"] = [_sidecar(p)]
    pod_spec["containers"] = [_worker_container(p)]
    if p.mtc:
        pod_spec["volumes"] = [
            {"name": "shared-tmp", "emptyDir": {"medium": "Memory"}},
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
    """The elastic training JobSet for ``p`` (checked first; raises ``ParameterError``)."""
    p.check()
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": p.name,
            "namespace": p.namespace,
            "labels": {"app.kubernetes.io/name": "elastic-dew", "elastic-dew/recipe": p.recipe},
        },
        "spec": {
            "coordinator": {"replicatedJob": HEAD_JOB},
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [HEAD_JOB]},
            "failurePolicy": {
                "maxRestarts": p.max_restarts,
                "restartStrategy": "Recreate",
                "rules": [{
                    "name": "BadCommandLineFailsTheJobSet",
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "targetReplicatedJobs": [HEAD_JOB],
                }],
            },
            "replicatedJobs": [_head_job(p), _worker_job(p)],
        },
    }


def priority_class(name: str, value: int, description: str) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1`` PriorityClass, as the guide's ``high-prior-job``."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": False,
        "description": description,
    }


def checkpoint_configuration(
    name: str, bucket: str, machine_type: str, in_memory_size: str
) -> dict[str, Any]:
    """GKE's ``CheckpointConfiguration`` for multi-tier checkpointing on one TPU machine type.

    ``bucket`` is ``gs://BUCKET`` (a bucket with hierarchical namespace); the resource names
    the bare bucket. The node selector picks the TPU nodes that get the in-memory CSI volume.
    """
    bucket_name, _ = parse_bucket("--bucket", bucket)
    return {
        "apiVersion": "checkpointing.gke.io/v1",
        "kind": "CheckpointConfiguration",
        "metadata": {"name": name},
        "spec": {
            "cloudStorageBucketName": bucket_name,
            "nodeSelector": {"node.kubernetes.io/instance-type": machine_type},
            "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
            "inMemoryVolumeSize": in_memory_size,
            "gcsFuseMountOptions": [
                "implicit-dirs",
                "metadata-cache:negative-ttl-secs:0",
                "metadata-cache:ttl-secs:-1",
                "metadata-cache:stat-cache-max-size-mb:-1",
                "metadata-cache:type-cache-max-size-mb:-1",
                "file-system:kernel-list-cache-ttl-secs:0",
                "read_ahead_kb=1024",
                "write:enable-streaming-writes:true",
            ],
        },
    }


#: Comments written above the first line that starts with the key (after indentation).
JOBSET_COMMENTS: dict[str, str] = {
    "successPolicy:": "The run is done when the controller (in pathways-head) finishes; workers never 'complete'.",
    "failurePolicy:": "A whole-JobSet restart (counted against maxRestarts) is the last resort; a bad command line fails at once.",
    "podFailurePolicy:": (
        f"Exit {PREEMPTED_EXIT_CODE} = preempted after the checkpoint was written, and evictions (DisruptionTarget): "
        "restart the pod, resume from the run directory, do not count against backoffLimit."
    ),
    "initContainers:": "Native sidecars (restartPolicy: Always): up before the main container, stopped after it exits.",
    "terminationGracePeriodSeconds:": "Time for the final checkpoint write after SIGTERM.",
    "backoffLimit: 0": "The head never restarts in place: its failures go to podFailurePolicy and the JobSet.",
    f"- name: {WORKER_JOB}": "One Job per slice, one pod per TPU host.",
    f"- name: {WORKER_JOB} >> backoffLimit:": (
        "TPU hosts x restarts per host: a slice can be lost and come back again and again "
        "without failing the Job, so elastic training, not a JobSet restart, handles it."
    ),
    f"- name: {WORKER_JOB} >> restartPolicy: OnFailure": "A failed TPU host restarts in place and rejoins its slice.",
    f"nodeSelector:\n{ACCELERATOR_LABEL}": "The slice's TPU type and topology (GKE node labels).",
    f"{GCSFUSE_ANNOTATION}:": (
        "GKE injects the Cloud Storage FUSE sidecar that serves the run-storage mount (as a native "
        "sidecar, first: it starts before and stops after every other container)."
    ),
    "serviceAccountName:": "Needs Workload Identity access to --bucket (roles/storage.objectUser): see docs/kubernetes.md.",
    f"volumes:\n- name: {RUN_VOLUME}": (
        f"--bucket mounted at {RUN_MOUNT}: the run directory outlives the pod, so a restarted controller resumes it."
    ),
}


def _annotate(text: str, comments: dict[str, str]) -> str:
    """Insert each comment above the first line whose stripped text starts with its key.

    A key ``"A\\nB"`` matches only a line starting with ``A`` whose next line contains ``B``;
    a key ``"ANCHOR >> A"`` matches only after the first line starting with ``ANCHOR``.
    """
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    pending = dict(comments)
    seen: set[str] = set()
    for i, line in enumerate(lines):
        stripped = line.lstrip(" ")
        for key in list(pending):
            anchor, _, rule = key.rpartition(" >> ")
            first, _, nxt = rule.partition("\n")
            if anchor and not any(s.startswith(anchor) for s in seen):
                continue
            if stripped.startswith(first) and (not nxt or (i + 1 < len(lines) and nxt in lines[i + 1])):
                indent = line[: len(line) - len(stripped)]
                out.append(f"{indent}# {pending.pop(key)}\n")
        seen.add(stripped)
        out.append(line)
    return "".join(out)


def dump(docs: Iterable[dict[str, Any]], header: Iterable[str] = (),
         comments: dict[str, str] | None = None) -> str:
    """Deterministic multi-document YAML: a ``#`` header, then each object in build order."""
    head = "".join(f"# {line}".rstrip() + "\n" for line in header)
    bodies = [
        yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=4096, allow_unicode=True)
        for doc in docs
    ]
    text = head + "---\n".join(bodies)
    return _annotate(text, comments) if comments else text
