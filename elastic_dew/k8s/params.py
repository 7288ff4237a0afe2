"""What a rendered Pathways JobSet is made of, checked before anything is rendered.

``JobSetParams`` holds the renderer's inputs; ``check()`` refuses any combination that
would give a manifest Kubernetes rejects or a run that cannot work, with a
:class:`~elastic_dew.settings.SettingError` that carries the field and names any other
field it mentions as data (:func:`~elastic_dew.settings.mention`): ``raise slices=`` from
Python, ``raise --slices`` on the ``elastic-dew k8s`` command line.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass
from typing import Any

from elastic_dew.k8s.tpus import TPU_TYPES, TpuType, lookup_tpu_type, parse_tpu_type
from elastic_dew.elastic.config import MULTI_TIER_DIR
from elastic_dew.run import available_recipes
from elastic_dew.settings import Bound, SettingError, check_fields, mention, setting

__all__ = [
    "KNOWN_RECIPES",
    "RUN_MOUNT",
    "PROXY_FLAG_SPELLINGS",
    "CONTROLLER_FAILURE_MODES",
    "MIN_SLICE_RESTARTS",
    "MAX_BACKOFF_LIMIT",
    "PATHWAYS_VERSION",
    "RUN_DIR_ENV",
    "CHECKPOINT_DIR_ENV",
    "check_recipe",
    "program_words",
    "JobSetParams",
    "parse_bucket",
    "check_rfc1123_label",
    "check_quantity",
    "check_subdomain",
    "pinned",
]

#: The recipes shipped with elastic_dew (the run's own list); ``recipe`` also takes a module
#: path (``pkg.recipe``).
KNOWN_RECIPES: tuple[str, ...] = tuple(available_recipes())

_MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def check_recipe(field: str, recipe: str) -> None:
    """Refuse ``recipe`` unless ``elastic-dew train`` takes it: a shipped recipe name, or a
    module path with build() (``mypkg.myrecipe``). A module path is checked for its form only:
    it must be importable in the controller image, which need not be this machine."""
    if recipe in KNOWN_RECIPES or _MODULE_PATH.match(recipe):
        return
    raise _refused(field, f"unknown recipe {recipe!r}",
                   f"use one of {', '.join(KNOWN_RECIPES)}, or a module path with build() that "
                   "the controller image can import (mypkg.myrecipe)")


#: The default Pathways release of the resource manager, proxy and worker images
#: (``jax-VERSION``): the JAX the controller image (k8s/Dockerfile.controller) pins, as the
#: resilience guide requires the workload's JAX to match the Pathways release.
PATHWAYS_VERSION = "jax-0.10.2"

#: ``on_controller_failure``: what a failed controller (exit 143, an eviction) does.
#: ``recreate-jobset`` is what pathwaysutils' and xpk's generators do; ``restart-head``
#: restarts the head pod alone, which no real cluster run has verified yet.
CONTROLLER_FAILURE_MODES: tuple[str, ...] = ("recreate-jobset", "restart-head")

#: Where the controller container mounts ``bucket`` (Cloud Storage FUSE): the run directory
#: is a local path under it, since ``elastic-dew train`` appends and fsyncs its run record there.
RUN_MOUNT = "/gcs"

#: The environment variables a ``command`` controller gets: its run directory (on the FUSE
#: mount, kept across restarts) and its checkpoint directory (a gs:// URL the TPU workers
#: write under Pathways persistence, or the multi-tier volume with ``mtc``).
RUN_DIR_ENV = "ELASTIC_DEW_RUN_DIR"
CHECKPOINT_DIR_ENV = "ELASTIC_DEW_CHECKPOINT_DIR"

#: ``proxy_flag_spelling`` -> the pathways-proxy flag that sets the number of elastic slices.
#: The resilience guide writes ``--num_elastic_instances``; pathwaysutils' ``PathwaysJobSet``
#: writes ``--num_elastic_slices``.
PROXY_FLAG_SPELLINGS: dict[str, str] = {
    "instances": "--num_elastic_instances",
    "slices": "--num_elastic_slices",
}

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: A Cloud Storage bucket name, and a Kubernetes quantity (50Gi): the renderer and the
#: validator read these two.
BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
#: The largest ``backoffLimit`` a Job takes (an int32).
MAX_BACKOFF_LIMIT = 2**31 - 1
#: The fewest restarts per TPU host a slice's Job may allow: an elastic slice must be able
#: to fail and come back again and again without failing its Job, and with it the JobSet.
MIN_SLICE_RESTARTS = 100


def _refused(field: str, problem: str, fix: str, value: Any = None) -> SettingError:
    """A renderer parameter that cannot work: which field, what is wrong, how to fix it."""
    return SettingError(JobSetParams, field, value, problem=f"{problem}; {fix}")


def _check_name(field: str, value: str, rule: re.Pattern[str], limit: int, what: str, fix: str) -> None:
    """Refuse ``value`` unless ``rule`` matches it and it has at most ``limit`` characters."""
    if not value or len(value) > limit or not rule.match(value):
        raise _refused(field, f"{value!r} is not {what}", fix)


def check_rfc1123_label(field: str, value: str, max_len: int = 63) -> None:
    """Refuse ``value`` unless it is an RFC 1123 label of at most ``max_len`` characters."""
    _check_name(field, value, _LABEL, max_len, "an RFC 1123 label", f"use at most {max_len} lowercase letters, "
                "digits and '-', starting and ending with a letter or digit (for example 'dew-lm-1')")


def parse_bucket(field: str, value: str) -> tuple[str, str]:
    """Split ``gs://BUCKET[/PREFIX]`` into (bucket name, prefix without slashes)."""
    if not value.startswith("gs://"):
        raise _refused(
            field, f"{value!r} is not a Cloud Storage URL",
            "pass gs://BUCKET_NAME (the bucket that holds Pathways scratch files and the run directory)",
        )
    name, _, prefix = value[len("gs://"):].partition("/")
    if not BUCKET.match(name) or ".." in name:
        raise _refused(
            field, f"{name!r} is not a valid bucket name",
            "bucket names are 3-63 lowercase letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit",
        )
    return name, prefix.strip("/")


@dataclass(frozen=True)
class JobSetParams:
    """Inputs of one elastic Pathways JobSet (``elastic-dew k8s render``'s flags are these
    fields, each entry's first sentence its help); :meth:`check` refuses what cannot work.

    Args:
      name: JobSet name (an RFC 1123 label); also names the run directory.
      tpu_type: TPU type (:data:`~elastic_dew.k8s.tpus.TPU_TYPES`), or ``TYPE-N`` as gcloud
        and xpk write it, which implies the topology.
      topology: slice topology, for example 4x4 (v5e/v6e) or 2x2x2 (v4/v5p/tpu7x); optional
        with a TYPE-N ``tpu_type``.
      slices: TPU slices (pathways-worker replicas).
      elastic_slices: slices the run may lose and regain (the proxy's elastic count); 0
        turns elasticity off.
      image: controller image (built from k8s/Dockerfile.controller).
      recipe: recipe the controller trains, as ``elastic-dew train`` takes it
        (:data:`KNOWN_RECIPES`, or a module path with build()); give this or ``command``.
      command: the controller's own program as one shell-quoted line (a pathwaysutils loop,
        MaxText's trainer), run as given; it reads :data:`RUN_DIR_ENV`,
        :data:`CHECKPOINT_DIR_ENV` and the grace period from its environment, and
        ``$(NAME)`` in it is replaced by Kubernetes with that variable; give this or
        ``recipe``.
      bucket: gs://BUCKET[/FOLDER] for Pathways scratch files, the run record, which the
        controller sees at /gcs[/FOLDER]/runs/NAME through Cloud Storage FUSE, and the
        checkpoints, which the TPU workers write to gs://BUCKET[/FOLDER]/runs/NAME/checkpoints.
      mtc: multi-tier checkpointing variant (needs ``sidecar_image``).
      sidecar_image: colocated-Python sidecar image (built from k8s/Dockerfile.sidecar).
      priority: PriorityClass name for the head and worker pods (hot swap).
      proxy_flag_spelling: instances: --num_elastic_instances (the resilience guide); slices:
        --num_elastic_slices (pathwaysutils).
      namespace: Kubernetes namespace of the JobSet.
      pathways_version: Pathways release tag of the resource manager, proxy and worker images
        (jax-VERSION, matching the controller image's JAX); never latest.
      head_node_pool: CPU node pool of the head pod.
      grace_seconds: terminationGracePeriodSeconds: time for the final checkpoint write.
      max_restarts: whole-JobSet restarts before it fails.
      slice_restarts: restarts allowed per TPU host before its slice's Job fails (at least
        100).
      mtc_ramdisk_dir: where the multi-tier checkpoint volume is mounted on workers.
      service_account: Kubernetes service account of the pods; it needs Workload Identity
        access to ``bucket``.
      queue: Kueue LocalQueue: sets the kueue.x-k8s.io/queue-name label (xpk clusters run
        Kueue).
      on_controller_failure: recreate-jobset: exit 143 or an eviction recreates the whole
        JobSet without using ``max_restarts``, as Google's generators do; restart-head: the
        head pod restarts alone (not verified on a real cluster).
    """

    name: str
    tpu_type: str
    topology: str
    slices: int = setting(bound=Bound(1, whole=True))
    # setting() without a default gives the field none; mypy reads any assignment as one.
    elastic_slices: int  # type: ignore[misc]
    image: str  # type: ignore[misc]
    bucket: str  # type: ignore[misc]
    recipe: str | None = None
    command: str | None = None
    mtc: bool = False
    sidecar_image: str | None = None
    priority: str | None = None
    proxy_flag_spelling: str = setting("instances", choices=tuple(PROXY_FLAG_SPELLINGS))
    namespace: str = "default"
    pathways_version: str = PATHWAYS_VERSION
    head_node_pool: str = "cpu-np"
    grace_seconds: int = 300
    max_restarts: int = setting(5, bound=Bound(0, whole=True))
    slice_restarts: int = 1_000_000
    mtc_ramdisk_dir: str = MULTI_TIER_DIR
    service_account: str = "default"
    queue: str | None = None
    on_controller_failure: str = setting(CONTROLLER_FAILURE_MODES[0], choices=CONTROLLER_FAILURE_MODES)

    # -- derived values -------------------------------------------------------------
    @property
    def tpu(self) -> TpuType:
        t = lookup_tpu_type(self.tpu_type)
        assert t is not None, "call check() first"
        return t

    @property
    def hosts_per_slice(self) -> int:
        return self.tpu.hosts(self.topology)

    @property
    def scratch_location(self) -> str:
        """Where Pathways writes its temporary files (``--gcs_scratch_location``)."""
        return f"{self.bucket.rstrip('/')}/pathways-scratch"

    @property
    def bucket_name(self) -> str:
        """The bare bucket name of ``bucket`` (what the FUSE volume mounts)."""
        return parse_bucket("bucket", self.bucket)[0]

    @property
    def run_dir(self) -> str:
        """The run directory: ``bucket``'s ``runs/NAME`` as the controller sees it through the
        Cloud Storage FUSE mount at ``RUN_MOUNT``; stable across restarts, so a restarted
        controller resumes."""
        _, prefix = parse_bucket("bucket", self.bucket)
        return "/".join([RUN_MOUNT, *([prefix] if prefix else []), "runs", self.name])

    @property
    def checkpoint_dir(self) -> str:
        """The persistent tier's directory: ``bucket``'s ``runs/NAME/checkpoints`` as a
        ``gs://`` URL, which the TPU workers write to themselves under Pathways persistence
        (elastic_dew.elastic.state.persistence says why a FUSE path would not do)."""
        return f"{self.bucket.rstrip('/')}/runs/{self.name}/checkpoints"

    @property
    def min_slices(self) -> int:
        """Slices the run needs to keep training: all but the elastic ones, at least one."""
        return max(1, self.slices - self.elastic_slices)

    # -- validation -----------------------------------------------------------------
    def check(self) -> "JobSetParams":
        """Raise :class:`~elastic_dew.settings.SettingError` for the first parameter that cannot work; return the
        parameters with a sized TPU type (``v6e-16``) resolved to its type and topology.

        Returns:
            The parameters, the TPU type resolved.

        Raises:
            elastic_dew.settings.SettingError: the first parameter that cannot work, with the fix.
        """
        check_fields(self)  # the declared ranges and choices
        check_rfc1123_label("name", self.name)
        check_rfc1123_label("namespace", self.namespace)
        parsed = parse_tpu_type(self.tpu_type)
        if parsed is None:
            raise _refused(
                "tpu_type", f"unknown TPU type {self.tpu_type!r}",
                f"use one of {', '.join(TPU_TYPES)}, or TYPE-N as gcloud and xpk write it (v6e-16)",
            )
        tpu, size = parsed
        if size is not None:
            implied = tpu.topology_for(size)
            if implied is None:
                sizes = ", ".join(tpu.sized_name(t) for t in tpu.topologies)
                raise _refused("tpu_type", f"{self.tpu_type!r} is no {tpu.name} slice size",
                               f"use one of {sizes}")
            if self.topology and self.topology != implied:
                raise _refused("topology", f"{self.tpu_type} is a {implied} slice, not {self.topology}",
                               f"drop {mention('topology')} or pass {mention('topology', implied)}")
            return dataclasses.replace(self, tpu_type=tpu.name, topology=implied).check()
        if not self.topology:
            raise _refused("topology", f"TPU type {tpu.name} needs a topology",
                           f"pass {mention('topology')} (one of {', '.join(tpu.topologies)}) or a sized "
                           f"{mention('tpu_type')} such as {tpu.sized_name(tpu.topologies[2])}")
        if self.topology not in tpu.topologies:
            raise _refused(
                "topology", f"TPU type {tpu.name} has no topology {self.topology!r}",
                f"use one of {', '.join(tpu.topologies)}",
            )
        if not 0 <= self.elastic_slices <= self.slices:
            raise _refused(
                "elastic_slices",
                f"{self.elastic_slices} is outside 0..{mention('slices')} ({self.slices})",
                f"use at most {self.slices} (the number of slices), or raise {mention('slices')}",
            )
        # JobSet labels every pod with the coordinator's address, NAME-pathways-head-0-0.NAME,
        # and a label value is at most 63 characters: NAME can have at most 22.
        coordinator = f"{self.name}-pathways-head-0-0.{self.name}"
        if len(coordinator) > 63:
            raise _refused(
                "name", f"the coordinator label {coordinator!r} would be longer than 63 characters",
                f"shorten {mention('name')} to at most {(63 - len('-pathways-head-0-0.')) // 2} characters",
            )
        _check_image("image", self.image, "controller")
        self._check_program()
        if self.pathways_version == "latest" or not _IMAGE_TAG.match(self.pathways_version):
            raise _refused(
                "pathways_version", f"{self.pathways_version!r} is not a pinned Pathways release",
                f"pass a release tag such as {PATHWAYS_VERSION} (the JAX of your controller image): a "
                "moving tag lets a restarted worker pull another release than the running proxy")
        if self.queue is not None:
            _check_name("queue", self.queue, _LABEL, 63, "a Kueue LocalQueue name", "pass the LocalQueue's name "
                        "(lowercase letters, digits and '-', at most 63), as kubectl get localqueues lists it")
        _, prefix = parse_bucket("bucket", self.bucket)
        if prefix and any(part in ("", ".", "..") or any(c.isspace() for c in part) for part in prefix.split("/")):
            raise _refused(
                "bucket", f"the prefix {prefix!r} is not a plain folder path",
                "write gs://BUCKET or gs://BUCKET/FOLDER[/FOLDER...] without '.', '..', '//' or spaces "
                "(the run directory is FOLDER/runs/NAME in the bucket)",
            )
        if self.mtc and not self.sidecar_image:
            raise _refused("sidecar_image", f"{mention('mtc', True)} needs the colocated-Python sidecar image",
                           f"build k8s/Dockerfile.sidecar and pass its URI with {mention('sidecar_image')}")
        if self.sidecar_image is not None:
            _check_image("sidecar_image", self.sidecar_image, "sidecar")
        if self.priority is not None:
            _check_name("priority", self.priority, _SUBDOMAIN, 253, "a PriorityClass name",
                        "use a lowercase DNS subdomain name such as 'high-prior-job'")
        check_rfc1123_label("head_node_pool", self.head_node_pool)
        _check_name("service_account", self.service_account, _SUBDOMAIN, 253, "a Kubernetes service account name",
                    "use a lowercase DNS subdomain name such as 'elastic-dew' (the account needs "
                    f"Workload Identity access to {mention('bucket')}; see docs/kubernetes.md)")
        if self.grace_seconds < 30:
            raise _refused("grace_seconds", f"{self.grace_seconds}s is too short to write a checkpoint",
                           "use at least 30 (the default, 300, suits a multi-GB Orbax write)")
        hosts = tpu.hosts(self.topology)
        if not MIN_SLICE_RESTARTS <= self.slice_restarts <= MAX_BACKOFF_LIMIT // hosts:
            problem = (
                f"{self.slice_restarts} is under {MIN_SLICE_RESTARTS}: a slice must be able to fail and come "
                "back again and again without failing its Job" if self.slice_restarts < MIN_SLICE_RESTARTS
                else f"{self.slice_restarts} restarts x {hosts} hosts does not fit the Job's backoffLimit (2^31-1)"
            )
            raise _refused("slice_restarts", problem, f"use {MIN_SLICE_RESTARTS}..{MAX_BACKOFF_LIMIT // hosts}")
        if not self.mtc_ramdisk_dir.startswith("/"):
            raise _refused("mtc_ramdisk_dir", f"{self.mtc_ramdisk_dir!r} is not an absolute path",
                           f"use an absolute path such as {MULTI_TIER_DIR}")
        return self


    def _check_program(self) -> None:
        """Exactly one of ``recipe`` and ``command``, each in a form the controller can run."""
        if (self.recipe is None) == (self.command is None):
            given = "both" if self.recipe is not None else "neither"
            raise _refused("command", f"{given} of {mention('recipe')} and {mention('command')} given",
                           f"pass {mention('recipe')} to train a recipe with elastic-dew train, or "
                           f"{mention('command')} to run your own program (one of the two)")
        if self.recipe is not None:
            check_recipe("recipe", self.recipe)
            return
        try:
            words = shlex.split(self.command or "")
        except ValueError as e:
            raise _refused("command", f"{self.command!r} is not a shell-quoted command line ({e})",
                           "close every quote, e.g. 'python3 -m mypkg.train --steps 100'") from None
        if not words:
            raise _refused("command", "the command is empty",
                           "pass the program's command line, e.g. 'python3 -m mypkg.train --steps 100'")


def program_words(p: JobSetParams) -> list[str]:
    """``command`` as the words of the controller container's ``command`` (no shell)."""
    return shlex.split(p.command or "")


def _check_image(field: str, image: str, what: str) -> None:
    """Refuse an image reference that is malformed or not pinned to a tag or digest."""
    if not image or any(c.isspace() for c in image):
        raise _refused(field, f"{image!r} is not an image reference",
                       f"pass REGISTRY/REPOSITORY:TAG of the {what} image")
    if not pinned(image):
        raise _refused(field, f"{image!r} is not pinned to a version",
                       f"pass REGISTRY/REPOSITORY:TAG (not :latest) or @sha256:DIGEST of the {what} "
                       "image, so a restarted pod runs the same code (imagePullPolicy is IfNotPresent)")


def pinned(image: str) -> bool:
    """Whether an image reference names a digest, or a tag other than ``latest``."""
    name, at, _ = image.partition("@")
    return bool(at) or name.rpartition("/")[2].partition(":")[2] not in ("", "latest")


def check_quantity(field: str, value: str) -> None:
    """Refuse ``value`` unless it is a Kubernetes resource quantity such as ``50Gi``."""
    if not QUANTITY.match(value):
        raise _refused(field, f"{value!r} is not a Kubernetes quantity",
                       "use a size such as 50Gi or 200G")


def check_subdomain(field: str, value: str) -> None:
    """Refuse ``value`` unless it is a DNS subdomain name (the rule for most object names)."""
    _check_name(field, value, _SUBDOMAIN, 253, "a valid object name",
                "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit")
