"""``elastic-dew k8s``: render and check the Kubernetes manifests of an elastic Pathways run.

Subcommands:

* ``render``: the elastic training JobSet (``--mtc`` for the multi-tier checkpointing variant).
* ``priority-class``: a PriorityClass for hot swap (the guide's ``high-prior-job``).
* ``checkpoint-config``: GKE's CheckpointConfiguration for multi-tier checkpointing.
* ``validate``: check manifest files against the JobSet schema shipped in the package,
  Kubernetes' schemas and the semantics of an elastic run (needs the ``test`` extras:
  jsonschema, kubernetes-validate).

Every rendered file starts with the exact command that re-creates it. A bad parameter exits
with status 2 and a message naming the flag and the fix, and writes nothing: the
``ParameterError`` names fields as Python does (``tpu_type``, ``raise slices=``), and only
here is it worded with the flags (``--tpu-type``, ``raise --slices``), read from each
subcommand's table of flags, which argparse registers and the header's command writes from.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
import tempfile
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import yaml

from elastic_dew._compat.argparse import DefaultsHelpFormatter
from elastic_dew.console import in_flags
from elastic_dew.k8s import render as R
from elastic_dew.k8s.params import (
    CONTROLLER_FAILURE_MODES,
    KNOWN_RECIPES,
    PROXY_FLAG_SPELLINGS,
    JobSetParams,
    ParameterError,
    check_quantity,
    check_subdomain,
)
from elastic_dew.k8s.tpus import TPU_TYPES, lookup_tpu_type

__all__ = ["configure", "run"]

log = logging.getLogger(__name__)

_DEFAULTS = JobSetParams(name="", tpu_type="", topology="", slices=0, elastic_slices=0,
                         image="", recipe="", bucket="")


class _FORMATTER(DefaultsHelpFormatter):
    """Shows each flag's default, except where there is none to show."""

    def shows_default(self, action: argparse.Action) -> bool:
        return not (action.default in (None, False) or action.required)


_Shown = Literal["given", "changed", ""]


@dataclasses.dataclass(frozen=True)
class _Flag:
    """One flag of a subcommand, declared once: argparse registers it from here
    (:func:`_declare`), a refusal words its field as it (:func:`_refusal`), and the header's
    command writes it (:func:`_command`).

    ``shown`` says when the header's command writes it: ``"given"`` whenever it has a value
    (a switch when on, after the others), ``"changed"`` when it is not its default, ``""``
    never. ``options`` are argparse's keywords.
    """

    flag: str
    options: Mapping[str, Any]
    shown: _Shown = "given"

    @property
    def field(self) -> str:
        """What the flag sets: argparse's ``dest``, and for ``render`` the ``JobSetParams`` field."""
        return self.flag[2:].replace("-", "_")

    @property
    def switch(self) -> bool:
        return self.options.get("action") == "store_true"


def _flag(flag: str, help: str, *, shown: _Shown = "given", **options: Any) -> _Flag:
    return _Flag(flag, {"help": help, **options}, shown)


def _declare(parser: argparse.ArgumentParser, flags: Sequence[_Flag]) -> None:
    """Register ``flags`` on a subcommand's ``parser``, and the field-to-flag map its
    refusals are worded with (``args.k8s_flags``: each field, its flag and, for a switch,
    ``bool``)."""
    for f in flags:
        parser.add_argument(f.flag, dest=f.field, **f.options)
    parser.set_defaults(k8s_flags={f.field: (f.flag, bool if f.switch else str) for f in flags})


#: ``--out FILE``: where a render command writes (written whole, or not at all).
_OUT = _flag("--out", "write here instead of stdout (written whole, or not at all)", shown="")

_RENDER = (
    _flag("--name", "JobSet name (an RFC 1123 label); also names the run directory", required=True),
    _flag("--tpu-type", f"TPU type: {', '.join(TPU_TYPES)} (v5litepod = v5e), or TYPE-N as gcloud and xpk "
                        "write it (v6e-16, v5p-8, tpu7x-128), which implies the topology", required=True),
    _flag("--topology", "slice topology, e.g. 4x4 (v5e/v6e) or 2x2x2 (v4/v5p/tpu7x); "
                        "optional with a TYPE-N --tpu-type"),
    _flag("--slices", "TPU slices (pathways-worker replicas)", type=int, required=True),
    _flag("--elastic-slices", "slices the run may lose and regain (the proxy's elastic count); 0 turns "
                              "elasticity off", type=int, required=True),
    _flag("--image", "controller image (built from k8s/Dockerfile.controller)", required=True),
    _flag("--recipe", f"recipe the controller trains, as elastic-dew train takes it: {', '.join(KNOWN_RECIPES)}, "
                      "or a module path with build() that the controller image can import (mypkg.myrecipe)",
          required=True),
    _flag("--bucket", "gs://BUCKET[/FOLDER] for Pathways scratch files, the run record, which the controller "
                      "sees at /gcs[/FOLDER]/runs/NAME through Cloud Storage FUSE, and the checkpoints, "
                      "which the TPU workers write to gs://BUCKET[/FOLDER]/runs/NAME/checkpoints", required=True),
    _flag("--mtc", "multi-tier checkpointing variant (needs --sidecar-image)", action="store_true"),
    _flag("--sidecar-image", "colocated-Python sidecar image (built from k8s/Dockerfile.sidecar)"),
    _flag("--priority", "PriorityClass name for the head and worker pods (hot swap)"),
    _flag("--proxy-flag-spelling", "instances: --num_elastic_instances (the resilience guide); "
                                   "slices: --num_elastic_slices (pathwaysutils)",
          default=_DEFAULTS.proxy_flag_spelling, choices=PROXY_FLAG_SPELLINGS),
    _flag("--queue", "Kueue LocalQueue: sets the kueue.x-k8s.io/queue-name label (xpk clusters run Kueue)"),
    _flag("--on-controller-failure", "recreate-jobset: exit 143 or an eviction recreates the whole JobSet "
                                     "without using --max-restarts, as Google's generators do; restart-head: the "
                                     "head pod restarts alone (not verified on a real cluster)",
          shown="changed", default=_DEFAULTS.on_controller_failure, choices=CONTROLLER_FAILURE_MODES),
    _flag("--namespace", "Kubernetes namespace of the JobSet", shown="changed", default=_DEFAULTS.namespace),
    _flag("--pathways-version", "Pathways release tag of the resource manager, proxy and worker images "
                                "(jax-VERSION, matching the controller image's JAX); never latest",
          shown="changed", default=_DEFAULTS.pathways_version),
    _flag("--head-node-pool", "CPU node pool of the head pod", shown="changed", default=_DEFAULTS.head_node_pool),
    _flag("--grace-seconds", "terminationGracePeriodSeconds: time for the final checkpoint write",
          shown="changed", type=int, default=_DEFAULTS.grace_seconds),
    _flag("--max-restarts", "whole-JobSet restarts before it fails",
          shown="changed", type=int, default=_DEFAULTS.max_restarts),
    _flag("--slice-restarts", "restarts allowed per TPU host before its slice's Job fails (at least 100)",
          shown="changed", type=int, default=_DEFAULTS.slice_restarts),
    _flag("--mtc-ramdisk-dir", "where the multi-tier checkpoint volume is mounted on workers",
          shown="changed", default=_DEFAULTS.mtc_ramdisk_dir),
    _flag("--service-account", "Kubernetes service account of the pods; it needs Workload Identity access to "
                               "--bucket", shown="changed", default=_DEFAULTS.service_account),
)

_PRIORITY_CLASS = (
    _flag("--name", "the PriorityClass name that render's --priority refers to", required=True),
    _flag("--value", "higher wins; the guide's high-prior-job uses 2000", type=int, required=True),
    _flag("--description", "the PriorityClass's description", default=""),
)

_CHECKPOINT_CONFIG = (
    _flag("--name", "the CheckpointConfiguration's name", required=True),
    _flag("--bucket", "gs://BUCKET with hierarchical namespace enabled", required=True),
    _flag("--tpu-type", f"TPU type of the node pool: {', '.join(TPU_TYPES)}", required=True),
    _flag("--in-memory-size", "RAM disk per node, e.g. 50Gi", required=True),
)

_VALIDATE = (
    _flag("--crd", "check JobSets against this JobSet CRD YAML instead of the shipped schema "
                   "(default: the shipped schema)"),
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare ``elastic-dew k8s`` and its subcommands (every flag's help shows its default)."""
    sub = parser.add_subparsers(dest="k8s_command", metavar="SUBCOMMAND")
    sub.required = True

    r = sub.add_parser("render", help="render the elastic training JobSet", formatter_class=_FORMATTER,
                       description="Render the elastic Pathways training JobSet as YAML.")
    _declare(r, (*_RENDER, _OUT))
    r.set_defaults(k8s_run=_render)

    p = sub.add_parser("priority-class", help="render a PriorityClass for hot swap", formatter_class=_FORMATTER,
                       description="Render a PriorityClass (apply once per cluster): a JobSet rendered with "
                                   "--priority NAME may take the TPU slices of lower-priority work when one of "
                                   "its own slices fails (hot swap).")
    _declare(p, (*_PRIORITY_CLASS, _OUT))
    p.set_defaults(k8s_run=_priority_class)

    c = sub.add_parser("checkpoint-config", help="render GKE's CheckpointConfiguration (multi-tier checkpointing)",
                       formatter_class=_FORMATTER,
                       description="Render GKE's CheckpointConfiguration (apply once per cluster): the bucket, the "
                                   "TPU nodes that get the in-memory checkpoint volume, and its size, which a "
                                   "JobSet rendered with --mtc needs.")
    _declare(c, (*_CHECKPOINT_CONFIG, _OUT))
    c.set_defaults(k8s_run=_checkpoint_config)

    v = sub.add_parser("validate", help="check manifest files (schemas and elastic-run semantics)",
                       formatter_class=_FORMATTER,
                       description="Check manifest files offline: JobSets against the JobSet schema shipped in "
                                   "the package (strict: unknown fields, wrong types and bad enum values are "
                                   "errors) and the semantics of an elastic Pathways run, core kinds against "
                                   "Kubernetes' published schemas. Exits 1 if any file has a problem.")
    v.add_argument("files", nargs="+", type=Path, help="manifest YAML files")
    _declare(v, _VALIDATE)
    v.set_defaults(k8s_run=_validate)


def _refusal(error: ParameterError, flags: Mapping[str, tuple[str, type]]) -> str:
    """``error`` as the command line says it: its field, and each field its text names
    (``field=`` or ``field=value``), worded as the flag that sets it (``flags``)."""
    head = flags[error.field][0] if error.field in flags else error.field
    return in_flags(f"{head}: {error.problem}; {error.fix}", flags=flags)


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``k8s`` subcommand; 2 for a bad parameter, 1 for invalid manifests."""
    try:
        return args.k8s_run(args)
    except ParameterError as e:
        sys.stderr.write(f"elastic-dew k8s {args.k8s_command}: error: {_refusal(e, args.k8s_flags)}\n")
        return 2


def _command(args: argparse.Namespace, flags: Sequence[_Flag]) -> str:
    """The canonical command line that renders this output (written at the top of the file):
    each of ``flags`` as its ``shown`` says, in their order, the switches that are on last."""
    argv = ["elastic-dew", "k8s", args.k8s_command]
    for f in flags:
        value = getattr(args, f.field)
        if f.switch or not f.shown or value is None or (f.shown == "changed" and value == f.options["default"]):
            continue
        argv += [f.flag, str(value)]
    argv += [f.flag for f in flags if f.switch and f.shown and getattr(args, f.field)]
    return shlex.join(argv)


def _emit(args: argparse.Namespace, build: Callable[[], tuple[list[dict[str, Any]], list[str], dict]]) -> int:
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.is_dir():
        raise ParameterError("out", f"directory {str(out.parent)!r} does not exist",
                             "create it first or write somewhere else")
    docs, header, comments = build()  # raises ParameterError before any output
    text = R.dump(docs, header, comments)
    if out is None:
        sys.stdout.write(text)
        return 0
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", prefix=f".{out.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("wrote %s", out)
    return 0


def _header(title: str, command: str) -> list[str]:
    return [title, "Rendered by elastic-dew; re-render instead of editing (tests check for drift):",
            f"  {command}", ""]


def _render(args: argparse.Namespace) -> int:
    given = {f.field: getattr(args, f.field) for f in _RENDER}
    given["topology"] = given["topology"] or ""
    params = JobSetParams(**given)

    def build():
        nonlocal params
        params = params.check()
        js = R.jobset(params)
        from elastic_dew.k8s.validate import semantic_errors

        problems = semantic_errors(js)
        if problems:  # a renderer bug, not a user error
            raise RuntimeError("rendered JobSet fails its own checks: " + "; ".join(problems))
        title = (f"Elastic Pathways training JobSet: recipe {params.recipe} on {params.slices} x "
                 f"{params.tpu.name} {params.topology}" + (", multi-tier checkpointing" if params.mtc else ""))
        return [js], _header(title, _command(args, _RENDER)), R.jobset_comments(params)

    return _emit(args, build)


def _priority_class(args: argparse.Namespace) -> int:
    def build():
        check_subdomain("name", args.name)
        if not -(10**9) <= args.value <= 10**9:
            raise ParameterError("value", f"{args.value} is outside user priorities",
                                 "use -1000000000..1000000000 (higher values are reserved for system classes)")
        command = _command(args, _PRIORITY_CLASS)
        return ([R.priority_class(args.name, args.value, args.description)],
                _header(f"PriorityClass {args.name} for hot swap (apply once per cluster)", command), {})

    return _emit(args, build)


def _checkpoint_config(args: argparse.Namespace) -> int:
    def build():
        check_subdomain("name", args.name)
        tpu = lookup_tpu_type(args.tpu_type)
        if tpu is None:
            raise ParameterError("tpu_type", f"unknown TPU type {args.tpu_type!r}",
                                 f"use one of {', '.join(TPU_TYPES)}")
        check_quantity("in_memory_size", args.in_memory_size)
        doc = R.checkpoint_configuration(args.name, args.bucket, tpu.machine_type, args.in_memory_size)
        command = _command(args, _CHECKPOINT_CONFIG)
        title = f"CheckpointConfiguration for multi-tier checkpointing on {tpu.machine_type} nodes (apply once)"
        return [doc], _header(title, command), {}

    return _emit(args, build)


def _validate(args: argparse.Namespace) -> int:
    from elastic_dew.k8s.validate import document_errors

    failed = 0
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        raise ParameterError("files", f"no such file: {', '.join(missing)}", "pass existing manifest files")
    for path in args.files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        try:
            problems = document_errors(docs, crd_path=args.crd)
        except ImportError as e:
            raise ParameterError("validate", f"{e.name} is not installed",
                                 "install the test extras: pip install -e '.[test]'") from e
        except FileNotFoundError as e:
            raise ParameterError("crd", str(e), "pass a JobSet CRD YAML, or leave --crd out to use the "
                                 "shipped schema") from e
        for p in problems:
            sys.stderr.write(f"{path}: {p}\n")
        if problems:
            failed += 1
        else:
            sys.stdout.write(f"{path}: ok ({', '.join(d['kind'] for d in docs)})\n")
    return 1 if failed else 0
