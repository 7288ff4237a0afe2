"""``elastic-dew k8s``: render and check the Kubernetes manifests of an elastic Pathways run.

Subcommands:

* ``render``: the elastic training JobSet (``--mtc`` for the multi-tier checkpointing variant).
* ``priority-class``: a PriorityClass for hot swap (the guide's ``high-prior-job``).
* ``checkpoint-config``: GKE's CheckpointConfiguration for multi-tier checkpointing.
* ``validate``: check manifest files against the JobSet schema shipped in the package,
  Kubernetes' schemas and the semantics of an elastic run (needs the ``test`` extras:
  jsonschema, kubernetes-validate).

Every rendered file starts with the exact command that re-creates it. A bad parameter exits
with status 2 and a message naming the flag and the fix, and writes nothing: each
subcommand's flags are the fields of its parameters (``JobSetParams`` for ``render``, whose
documented entries are their help), built by the one settings builder
(:mod:`elastic_dew.settings`), and a refusal, a :class:`~elastic_dew.settings.SettingError`
that carries its field and the fields it names as data, is worded with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

import yaml

from elastic_dew.cli import HelpFormatter
from elastic_dew.k8s import cluster
from elastic_dew.k8s.comments import jobset_comments
from elastic_dew.k8s import render as R
from elastic_dew.k8s.yaml_text import dump
from elastic_dew.k8s.params import (CHECKPOINT_DIR_ENV, KNOWN_RECIPES, RUN_DIR_ENV, JobSetParams, check_quantity,
                                    check_subdomain)
from elastic_dew.rundir import atomic_write
from elastic_dew.flags import Flag, Flags, add_flags, command_line_text, flag_name, given
from elastic_dew.settings import SettingError, mention
from elastic_dew.k8s.tpus import TPU_TYPES, lookup_tpu_type

__all__ = ["configure", "run"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Out:
    out: str | None = None


@dataclasses.dataclass(frozen=True)
class _PriorityClass:
    name: str
    value: int
    description: str = ""


@dataclasses.dataclass(frozen=True)
class _CheckpointConfig:
    name: str
    bucket: str
    tpu_type: str
    in_memory_size: str


@dataclasses.dataclass(frozen=True)
class _Validate:
    crd: str | None = None


_OUT = {"out": Flag("write here instead of stdout (written whole, or not at all)")}

#: ``render``'s flags, ``JobSetParams``' fields, in ``--help``'s order.
_RENDER: Flags = {field: Flag() for field in (
    "name", "tpu_type", "topology", "slices", "elastic_slices", "image", "recipe", "command", "bucket", "mtc",
    "sidecar_image",
    "priority", "proxy_flag_spelling", "queue", "on_controller_failure", "namespace", "pathways_version",
    "head_node_pool", "grace_seconds", "max_restarts", "slice_restarts", "mtc_ramdisk_dir", "service_account")} | {
    "tpu_type": Flag(f"TPU type: {', '.join(TPU_TYPES)} (v5litepod = v5e), or TYPE-N as gcloud and xpk write it "
                     "(v6e-16, v5p-8, tpu7x-128), which implies the topology"),
    "topology": Flag(required=False),
    "recipe": Flag(f"recipe the controller trains, as elastic-dew train takes it: {', '.join(KNOWN_RECIPES)}, or a "
                   "module path with build() that the controller image can import (mypkg.myrecipe); give this or "
                   "--command"),
    "command": Flag(f"your own controller program as one quoted command line (a pathwaysutils loop, MaxText's "
                    f"trainer), run as given in --image; it finds its run and checkpoint directories in "
                    f"${RUN_DIR_ENV} and ${CHECKPOINT_DIR_ENV} (write $(NAME) to have Kubernetes put them in the "
                    "command); give this or --recipe"),
}

_PRIORITY_CLASS: Flags = {
    "name": Flag("the PriorityClass name that render's --priority refers to"),
    "value": Flag("higher wins; the guide's high-prior-job uses 2000"),
    "description": Flag("the PriorityClass's description"),
}

_CHECKPOINT_CONFIG: Flags = {
    "name": Flag("the CheckpointConfiguration's name"),
    "bucket": Flag("gs://BUCKET with hierarchical namespace enabled"),
    "tpu_type": Flag(f"TPU type of the node pool: {', '.join(TPU_TYPES)}"),
    "in_memory_size": Flag("RAM disk per node, e.g. 50Gi"),
}

_VALIDATE: Flags = {
    "crd": Flag("check JobSets against this JobSet CRD YAML instead of the shipped schema (default: the shipped "
                "schema)"),
}

#: Fields the header's command always writes, even at their default (the rest: when given
#: and not their default; switches last).
_ALWAYS = {"proxy_flag_spelling", "description"}


def _subcommand(sub: Any, name: str, params: type, flags: Flags, run: Callable[[argparse.Namespace], int], *,
                help: str, description: str, out: bool = True) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help, description=description, formatter_class=HelpFormatter)
    commands = [(params, flags), *([(_Out, _OUT)] if out else [])]
    for owner, owned in commands:
        add_flags(parser, owner, owned, defaults=True)
    parser.set_defaults(k8s_run=run, k8s_flags=commands)
    return parser


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare ``elastic-dew k8s`` and its subcommands (every flag's help shows its default)."""
    sub = parser.add_subparsers(dest="k8s_command", metavar="SUBCOMMAND")
    sub.required = True
    _subcommand(sub, "render", JobSetParams, _RENDER, _render, help="render the elastic training JobSet",
                description="Render the elastic Pathways training JobSet as YAML.")
    _subcommand(sub, "priority-class", _PriorityClass, _PRIORITY_CLASS, _priority_class,
                help="render a PriorityClass for hot swap",
                description="Render a PriorityClass (apply once per cluster): a JobSet rendered with --priority "
                            "NAME may take the TPU slices of lower-priority work when one of its own slices fails "
                            "(hot swap).")
    _subcommand(sub, "checkpoint-config", _CheckpointConfig, _CHECKPOINT_CONFIG, _checkpoint_config,
                help="render GKE's CheckpointConfiguration (multi-tier checkpointing)",
                description="Render GKE's CheckpointConfiguration (apply once per cluster): the bucket, the TPU "
                            "nodes that get the in-memory checkpoint volume, and its size, which a JobSet rendered "
                            "with --mtc needs.")
    v = _subcommand(sub, "validate", _Validate, _VALIDATE, _validate, out=False,
                    help="check manifest files (schemas and elastic-run semantics)",
                    description="Check manifest files offline: JobSets against the JobSet schema shipped in the "
                                "package (strict: unknown fields, wrong types and bad enum values are errors) and "
                                "the semantics of an elastic Pathways run, core kinds against Kubernetes' published "
                                "schemas. Exits 1 if any file has a problem.")
    v.add_argument("files", nargs="+", type=Path, help="manifest YAML files")


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``k8s`` subcommand; 2 for a bad parameter, 1 for invalid manifests."""
    try:
        return args.k8s_run(args)
    except SettingError as e:
        sys.stderr.write(f"elastic-dew k8s {args.k8s_command}: error: {command_line_text(e, args.k8s_flags)}\n")
        return 2


def _command(args: argparse.Namespace, params: type, flags: Flags) -> str:
    """The canonical command line that renders this output (written at the top of the file):
    each field of ``flags`` in their order that is required, in :data:`_ALWAYS` or not at its
    default, the switches that are on last."""
    defaults = {f.name: f.default for f in dataclasses.fields(params)}
    argv, switches = ["elastic-dew", "k8s", args.k8s_command], []
    for field, flag in flags.items():
        value = getattr(args, field)
        if value is None or (field not in _ALWAYS and value == defaults[field]):
            continue
        if value is True:
            switches.append(flag_name(field, flag))
        else:
            argv += [flag_name(field, flag), str(value)]
    return shlex.join(argv + switches)


def _emit(args: argparse.Namespace, build: Callable[[], tuple[list[dict[str, Any]], list[str], dict]]) -> int:
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.is_dir():
        raise SettingError(_Out, "out", args.out, problem=f"directory {str(out.parent)!r} does not exist; "
                           "create it first or write somewhere else")
    docs, header, comments = build()  # raises SettingError before any output
    text = dump(docs, header, comments)
    if out is None:
        sys.stdout.write(text)
        return 0
    atomic_write(out, lambda f: f.write(text.encode()))
    log.info("wrote %s", out)
    return 0


def _header(title: str, command: str) -> list[str]:
    return [title, "Rendered by elastic-dew; re-render instead of editing (tests check for drift):",
            f"  {command}", ""]


def _render(args: argparse.Namespace) -> int:
    params = JobSetParams(**{"topology": "", **given(args, JobSetParams, _RENDER)})

    def build():
        nonlocal params
        params = params.check()
        js = R.jobset(params)
        from elastic_dew.k8s.validate import semantic_errors

        problems = semantic_errors(js)
        if problems and params.command is not None:
            raise SettingError(JobSetParams, "command", params.command, problem="; ".join(problems) + (
                f"; fix the command, or pass {mention('recipe')} to have elastic-dew train run a recipe"))
        if problems:  # a renderer bug, not a user error
            raise RuntimeError("rendered JobSet fails its own checks: " + "; ".join(problems))
        program = f"recipe {params.recipe}" if params.recipe is not None else "your own program"
        title = (f"Elastic Pathways training JobSet: {program} on {params.slices} x "
                 f"{params.tpu.name} {params.topology}" + (", multi-tier checkpointing" if params.mtc else ""))
        return [js], _header(title, _command(args, JobSetParams, _RENDER)), jobset_comments(params)

    return _emit(args, build)


def _priority_class(args: argparse.Namespace) -> int:
    def build():
        check_subdomain("name", args.name)
        if not -(10**9) <= args.value <= 10**9:
            raise SettingError(_PriorityClass, "value", args.value, problem=(
                f"{args.value} is outside user priorities; use -1000000000..1000000000 (higher values are reserved "
                "for system classes)"))
        command = _command(args, _PriorityClass, _PRIORITY_CLASS)
        return ([cluster.priority_class(args.name, args.value, args.description)],
                _header(f"PriorityClass {args.name} for hot swap (apply once per cluster)", command), {})

    return _emit(args, build)


def _checkpoint_config(args: argparse.Namespace) -> int:
    def build():
        check_subdomain("name", args.name)
        tpu = lookup_tpu_type(args.tpu_type)
        if tpu is None:
            raise SettingError(_CheckpointConfig, "tpu_type", args.tpu_type,
                               problem=f"unknown TPU type {args.tpu_type!r}; use one of {', '.join(TPU_TYPES)}")
        check_quantity("in_memory_size", args.in_memory_size)
        doc = cluster.checkpoint_configuration(args.name, args.bucket, tpu.machine_type, args.in_memory_size)
        command = _command(args, _CheckpointConfig, _CHECKPOINT_CONFIG)
        title = f"CheckpointConfiguration for multi-tier checkpointing on {tpu.machine_type} nodes (apply once)"
        return [doc], _header(title, command), {}

    return _emit(args, build)


def _validate(args: argparse.Namespace) -> int:
    from elastic_dew.k8s.validate import document_errors

    failed = 0
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        raise SettingError(_Validate, "files", missing, problem=f"no such file: {', '.join(missing)}; pass existing "
                           "manifest files")
    for path in args.files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        try:
            problems = document_errors(docs, crd_path=args.crd)
        except ImportError as e:
            raise SettingError(_Validate, "validate", e.name, problem=f"{e.name} is not installed; install the test "
                               "extras: pip install -e '.[test]'") from e
        except FileNotFoundError as e:
            raise SettingError(_Validate, "crd", args.crd, problem=f"{e}; pass a JobSet CRD YAML, or leave "
                               f"{mention('crd')} out to use the shipped schema") from e
        for p in problems:
            sys.stderr.write(f"{path}: {p}\n")
        if problems:
            failed += 1
        else:
            sys.stdout.write(f"{path}: ok ({', '.join(d['kind'] for d in docs)})\n")
    return 1 if failed else 0
