"""The local Pathways backend's process: ``python -m elastic_dew.proxy.serve``.

It sets up ``slices * devices_per_slice`` CPU devices before JAX starts, serves the IFRT
proxy service (:class:`~elastic_dew.proxy.server.ProxyService`) and a small control
service (lose, restore, hang, suspend, wake, status; JSON over gRPC, :data:`CONTROL`) on one loopback port,
prints one line ``elastic-dew proxy listening on 127.0.0.1:PORT`` once both serve, and
serves until SIGTERM or SIGINT. ``SIGUSR1`` loses the lowest-numbered slice still whole,
``SIGUSR2`` restores the lowest-numbered lost one. The control service's ``Started`` (from
:mod:`elastic_dew.proxy.exec_program`) says a new process of the run starts; its
``Announce`` is a phase announcement of elastic_dew's own loop (:mod:`elastic_dew.proxy.announce`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from concurrent import futures
from typing import Any

__all__ = ["CONTROL", "READY", "main", "start"]

logger = logging.getLogger(__name__)

#: The control service's gRPC name; its methods take and return JSON objects.
CONTROL = "elastic_dew.proxy.Control"
#: The line the server prints once it serves (the port follows the colon).
READY = "elastic-dew proxy listening on 127.0.0.1:"


def _json_handler(function: Any) -> Any:
    import grpc

    return grpc.unary_unary_rpc_method_handler(
        function, request_deserializer=lambda b: json.loads(b or b"{}"),
        response_serializer=lambda o: json.dumps(o).encode())


def start(slices: int, devices_per_slice: int, port: int = 0, schedule: Any = None) -> tuple[Any, int, Any]:
    """Serve on ``127.0.0.1:port`` (0: a free one) in this process; JAX's CPU backend must
    already see the devices. Returns the gRPC server, its port and the backend."""
    import grpc

    from elastic_dew.proxy.backend import ProxyBackend
    from elastic_dew.proxy.server import ProxyService

    backend = ProxyBackend(slices, devices_per_slice)
    service = ProxyService(backend)

    def lose(request: dict, context: Any) -> dict:
        backend.slices.lose(int(request["slice"]))
        return status(request, context)

    def restore(request: dict, context: Any) -> dict:
        backend.slices.restore(int(request["slice"]))
        return status(request, context)

    def slice_action(action: str) -> Any:
        def act(request: dict, context: Any) -> dict:
            getattr(backend.slices, action)(int(request["slice"]))
            return status(request, context)

        return act

    def status(request: dict, context: Any) -> dict:
        return {"slices": slices, "devices_per_slice": devices_per_slice, "lost": sorted(backend.slices.lost),
                "events": backend.slices.events, "dispatches": backend.dispatches, "sessions": service.sessions,
                "refusals": service.refusals, "steps": schedule.steps if schedule is not None else None,
                "fired": schedule.fired() if schedule is not None else [],
                "unfired": [str(f) for f in schedule.runner.unfired] if schedule is not None else [],
                "attempts": schedule.attempts if schedule is not None else []}

    def started(request: dict, context: Any) -> dict:
        if schedule is not None:
            schedule.process_started(int(request["pid"]))
        return status(request, context)

    def announce(request: dict, context: Any) -> dict:
        if schedule is not None and schedule.runner is not None:
            schedule.records.announced(str(request["phase"]), int(request["step"]))  # a step before its fault
            schedule.runner.on_phase(str(request["phase"]), int(request["step"]))
        return {}

    control = grpc.method_handlers_generic_handler(CONTROL, {
        "Announce": _json_handler(announce),
        "Lose": _json_handler(lose), "Restore": _json_handler(restore), "Status": _json_handler(status),
        "Hang": _json_handler(slice_action("hang")), "Suspend": _json_handler(slice_action("suspend")),
        "Wake": _json_handler(slice_action("wake")),
        "Started": _json_handler(started)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="elastic-dew-proxy"), options=[
        ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((service.handler(), control))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on 127.0.0.1:{port}")
    if schedule is not None:
        schedule.attach(backend)
    server.start()
    return server, bound, backend


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elastic_dew.proxy.serve")
    parser.add_argument("--slices", type=int, required=True)
    parser.add_argument("--devices-per-slice", type=int, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--schedule", default="")
    parser.add_argument("--step-function", default=None)
    parser.add_argument("--fault-log", default=None)
    parser.add_argument("--attempts", default=None, help="append each process's start and attempts here (JSON lines)")
    parser.add_argument("--watch", default=None,
                        help="append what the backend sees of the program's state here (the watch's JSON lines)")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--versions", default=None, metavar="LOW-HIGH",
                        help="speak only these protocol versions (within the server's own)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from elastic_dew.proxy import protocol
    from elastic_dew.proxy.backend import cpu_flags

    if args.versions:
        protocol.restrict(*(int(v) for v in args.versions.split("-")))
    os.environ["XLA_FLAGS"] = cpu_flags(args.slices * args.devices_per_slice, os.environ.get("XLA_FLAGS", ""))
    os.environ["JAX_PLATFORMS"] = "cpu"
    schedule = None
    if args.schedule or args.attempts or args.watch:
        from elastic_dew.proxy.faults import StepSchedule

        schedule = StepSchedule(args.schedule, step_function=args.step_function, fault_log=args.fault_log,
                                attempts=args.attempts, watch=args.watch)
    server, port, backend = start(args.slices, args.devices_per_slice, args.port, schedule)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def lose_next(*_: Any) -> None:
        whole = [s for s in range(args.slices) if s not in backend.slices.lost]
        if whole:
            backend.slices.lose(whole[0])

    def restore_next(*_: Any) -> None:
        lost = sorted(backend.slices.lost)
        if lost:
            backend.slices.restore(lost[0])

    signal.signal(signal.SIGUSR1, lose_next)
    signal.signal(signal.SIGUSR2, restore_next)
    print(f"{READY}{port}", flush=True)
    stop.wait()
    server.stop(grace=1).wait()
    if schedule is not None:
        schedule.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
