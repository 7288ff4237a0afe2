"""``elastic-dew proxy``: a local Pathways backend, the IFRT proxy protocol on 127.0.0.1.

It starts :class:`elastic_dew.proxy.LocalPathways` (jaxlib's CPU client behind the proxy
protocol the installed jaxlib's client speaks, ``--slices`` virtual slices of
``--devices-per-slice`` devices), prints the variables to export in the shell that runs the
program, and serves until interrupted (Ctrl-C or SIGTERM)::

    elastic-dew proxy --slices 2 --devices-per-slice 4 &
    export JAX_PLATFORMS=proxy JAX_BACKEND_TARGET=grpc://127.0.0.1:PORT ...
    python my_loop.py       # calls pathwaysutils.initialize(), as on Pathways

``--schedule`` fires ``lose``/``restore`` faults at the steps the backend counts; ``kill
-USR1 PID`` loses the lowest-numbered whole slice, ``kill -USR2 PID`` restores the
lowest-numbered lost one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from elastic_dew.commands.serve import serve
from elastic_dew.console import add_flag, refusal
from elastic_dew.run import USAGE_EXIT

__all__ = ["configure", "run"]

_PROG = "elastic-dew proxy"


def configure(parser: argparse.ArgumentParser) -> None:
    for name in ("slices", "devices_per_slice", "schedule"):
        add_flag(parser, name)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--step-function", metavar="NAME",
                        help="count a step at each dispatch of the function of this name "
                             "(docs/pathways-boundary.md)")
    parser.add_argument("--log", type=Path, default=Path("elastic-dew-proxy.log"), help="the server's log file")


def run(args: argparse.Namespace) -> int:
    from elastic_dew.proxy import LocalPathways
    from elastic_dew.run import SimConfig

    try:
        sim = SimConfig(**{name: value for name in ("slices", "devices_per_slice", "schedule")
                           if (value := getattr(args, f"sim.{name}", None)) is not None})
        backend = LocalPathways(sim.slices, sim.devices_per_slice, port=args.port, schedule=sim.schedule or "",
                                step_function=args.step_function, log=args.log)
    except ValueError as error:
        print(f"{_PROG}: error: {refusal(error)}", file=sys.stderr)
        return USAGE_EXIT

    def announce() -> None:
        print(f"local Pathways backend at {backend.target}: {sim.slices} slices of {sim.devices_per_slice} "
              f"devices (server pid {backend.pid}, log {args.log})")
        print("In the shell that runs the program (which calls pathwaysutils.initialize()):")
        print("export " + " ".join(f"{k}={v}" for k, v in backend.client_env().items()), flush=True)

    return serve(_PROG, backend, announce)
