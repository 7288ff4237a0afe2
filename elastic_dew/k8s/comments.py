"""The comments ``elastic-dew k8s jobset`` writes above the lines of the JobSet they explain
(:func:`jobset_comments`, for :func:`elastic_dew.k8s.yaml_text.dump`)."""

from __future__ import annotations

from elastic_dew.k8s.params import RUN_MOUNT, JobSetParams
from elastic_dew.k8s.render import ACCELERATOR_LABEL, GCSFUSE_ANNOTATION, PREEMPTED_EXIT_CODE, RUN_VOLUME, USAGE_EXIT_CODE, WORKER_JOB

__all__ = ["JOBSET_COMMENTS", "jobset_comments"]


#: Comments written above the first line that starts with the key (after indentation).
JOBSET_COMMENTS: dict[str, str] = {
    "successPolicy:": "The run is done when the controller (in pathways-head) finishes; workers never 'complete'.",
    "failurePolicy:": (
        f"Rules read the head Job's failure message: exit {PREEMPTED_EXIT_CODE} (preempted after its checkpoint) and "
        f"evictions recreate the JobSet without counting against maxRestarts; exit {USAGE_EXIT_CODE} (a bad command "
        "line) fails it; any other failure restarts it, counted."
    ),
    "podFailurePolicy:": (
        f"Exit {PREEMPTED_EXIT_CODE} = preempted after the checkpoint was written; exit {USAGE_EXIT_CODE} = bad "
        "command line; DisruptionTarget = evicted. The JobSet's failurePolicy decides what each one does."
    ),
    "hostNetwork:": "As xpk's Pathways template: the node's network, with cluster DNS (ClusterFirstWithHostNet).",
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


def jobset_comments(p: JobSetParams) -> dict[str, str]:
    """The comments of ``jobset(p)``'s YAML (the failure policy's depend on the mode)."""
    if p.on_controller_failure != "restart-head":
        return JOBSET_COMMENTS
    return {
        **JOBSET_COMMENTS,
        "failurePolicy:": (
            "restart-head (not verified on a real cluster): a bad command line fails the JobSet; any other "
            "head failure restarts the JobSet, counted against maxRestarts."
        ),
        "podFailurePolicy:": (
            f"Exit {PREEMPTED_EXIT_CODE} = preempted after the checkpoint was written, and evictions "
            "(DisruptionTarget): restart the head pod alone, resume from the run directory, do not count "
            "against backoffLimit."
        ),
    }
