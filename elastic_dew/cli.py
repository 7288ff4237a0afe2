"""The ``elastic-dew`` command line.

Each subcommand lives in its own module, imported only when that subcommand runs, so
``elastic-dew launch`` and ``elastic-dew k8s render`` never start JAX. A subcommand module
exposes ``configure(parser)`` to declare its arguments and ``run(args) -> int`` to run.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import importlib
import logging
import sys
from typing import Any

from elastic_dew._compat.argparse import DefaultsHelpFormatter

__all__ = ["main", "SUBCOMMANDS", "HelpFormatter"]


#: name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "launch": ("elastic_dew.launch", "start N local ranks of a JAX process pool"),
    "train": ("elastic_dew.commands.train", "train a recipe on (simulated) slices"),
    "demo": ("elastic_dew.commands.demo", "the main job: a simulated elastic run that survives faults"),
    "report": ("elastic_dew.commands.report", "print a run's summary and redraw its timeline"),
    "plan": ("elastic_dew.commands.plan", "expected goodput and the elastic settings to pick at N slices"),
    "simulate": ("elastic_dew.commands.simulate", "run any Python training program, unmodified, on simulated slices"),
    "chaos": ("elastic_dew.commands.chaos", "run seeded random fault schedules and check every invariant"),
    "k8s": ("elastic_dew.k8s.cli", "render JobSet manifests for Pathways on GKE"),
    "data": ("elastic_dew.commands.data", "prepare text files as ArrayRecord shards for training"),
    "gcs-server": ("elastic_dew.commands.gcs_server", "serve a local Cloud Storage bucket for gs:// runs on one machine"),
    "proxy": ("elastic_dew.commands.proxy", "serve a local Pathways backend: the IFRT proxy protocol on CPU slices"),
}


class HelpFormatter(DefaultsHelpFormatter):
    """Every flag's help shows its default, except where there is none to show (nothing, off,
    an empty list of a repeatable flag) and for a required flag or a positional."""

    def shows_default(self, action: argparse.Action) -> bool:
        return not (
            action.default in (None, False, [], argparse.SUPPRESS) or action.required or not action.option_strings
        )


class _Parser(argparse.ArgumentParser):
    """A parser that keeps the subcommands' action its ``add_subparsers`` returns (its
    subcommands' parsers are of this class too, however deep)."""

    subcommands: argparse.Action | None = None

    def add_subparsers(self, **kwargs: Any) -> Any:
        self.subcommands = super().add_subparsers(**kwargs)
        return self.subcommands


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Options every command takes, before or after the subcommand's name.

    On a subcommand they default to ``SUPPRESS``, so one given before the subcommand is
    not reset by the subcommand's own defaults.
    """
    default: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging", **default)


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parsers of ``parser``'s own subcommands (``k8s render``, ``k8s validate``, ...)."""
    subcommands = getattr(parser, "subcommands", None)
    return [] if subcommands is None else list(subcommands.choices.values())


def _global_options_everywhere(parser: argparse.ArgumentParser) -> None:
    """Give every nested subcommand the global options too, however deep."""
    for sub in _subparsers(parser):
        _global_options(sub, top=False)
        _global_options_everywhere(sub)


def _parser(argv: list[str]) -> tuple[argparse.ArgumentParser, Any]:
    parser = _Parser(
        prog="elastic-dew",
        description="Elastic JAX training on Pathways, and its CPU simulator.",
        formatter_class=HelpFormatter,
    )
    _global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    module = None
    for name, (modname, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=HelpFormatter)
        if name == chosen:
            module = importlib.import_module(modname)
            _global_options(p, top=False)
            module.configure(p)
            _global_options_everywhere(p)
    return parser, module


def _collect_then_freeze() -> None:
    """Finalise what is garbage now, then keep the interpreter's last collections off the rest.

    Runs at exit (an ``atexit`` handler), after the non-daemon threads are joined and after
    every handler registered during the command (Orbax's, JAX's, TensorBoard's): those have
    closed, flushed and written what the run keeps, and the run record is closed by then.
    Interpreter finalisation would otherwise walk every object left by the thousands of
    modules a training command imports (JAX, Orbax, Grain, matplotlib) several times, only to
    free memory the ending process gives back anyway. The collection here still finalises
    every object already unreachable (an unclosed file is flushed and closed, as at any exit);
    the freeze only spares the objects still reachable, whose finalisers Python never
    promises to run at exit. Handlers registered before the command (``logging.shutdown``)
    run after this one, as before.
    """
    gc.collect()
    gc.freeze()


@functools.cache
def _end_quickly() -> None:
    """Register :func:`_collect_then_freeze` once per process."""
    atexit.register(_collect_then_freeze)


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` (default: the program's own arguments); its exit status.

    Run as the program (``argv`` not given), a command that stopped at a preemption notice
    ends the process itself once its stop is durable, with status 143
    (:func:`~elastic_dew.runtime.preemption.exit_preempted`): the interpreter's
    finalisation would only hold the exit inside the grace window.

    Args:
        argv: the command line after the program's name, or ``None`` for ``sys.argv[1:]``.

    Returns:
        The exit status.
    """
    from elastic_dew.runtime import PREEMPTED_EXIT, install_exit_hook

    as_program = argv is None
    install_exit_hook()  # program start: an uncaught Preempted ends any command with 143
    _end_quickly()  # registered first, so it runs after the handlers of the libraries the command imports
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, module = _parser(argv)
    args = parser.parse_args(argv)
    from elastic_dew.observe.logs import TEXT_FORMAT, set_verbose

    # -v is elastic_dew's debug lines; third-party libraries stay at INFO.
    logging.basicConfig(level=logging.INFO, format=TEXT_FORMAT)
    set_verbose(args.verbose)
    if module is None:  # argparse already refused an unknown command
        parser.error(f"unknown command {args.command!r}")
    from elastic_dew.elastic.state import storage

    before = storage.mark()
    code = int(module.run(args) or 0)
    storage.end_if_stuck(code, since=before)  # a storage call given up on would keep the process alive
    if as_program and code == PREEMPTED_EXIT:
        from elastic_dew.runtime.preemption import exit_preempted

        atexit.unregister(_collect_then_freeze)  # it only spares the finalisation, skipped here
        exit_preempted()
    return code


if __name__ == "__main__":
    sys.exit(main())
