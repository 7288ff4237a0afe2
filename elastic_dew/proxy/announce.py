"""elastic_dew's own loop on the local Pathways backend: its phase announcements forwarded there.

In-process the simulator hears the phases elastic_dew's loop announces
(:mod:`elastic_dew.elastic.hooks`) and fires each step-keyed fault at the step the loop
names. On the local Pathways backend the schedule runs in the backend's process; when
:data:`CONTROL_ENV` names the backend's control address, :func:`forwarding` passes each
announcement of this process there (one loopback call each), so the faults fire at the
same steps as in-process. A program that announces nothing is counted at the backend
instead (:meth:`~elastic_dew.simulate.step_count.StepCount.chained`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator

__all__ = ["CONTROL_ENV", "forwarding"]

logger = logging.getLogger(__name__)

#: The environment variable that names the backend's control address (``127.0.0.1:PORT``).
CONTROL_ENV = "ELASTIC_DEW_PROXY_CONTROL"
#: How long one forwarded announcement may take before the loop goes on without it.
ANNOUNCE_TIMEOUT_S = 30.0


@contextlib.contextmanager
def forwarding() -> Iterator[None]:
    """While inside, forward this process's phase announcements to the backend
    :data:`CONTROL_ENV` names; without it, do nothing."""
    address = os.environ.get(CONTROL_ENV)
    if not address:
        yield
        return
    import grpc

    from elastic_dew.elastic import hooks
    from elastic_dew.proxy.serve import CONTROL

    channel = grpc.insecure_channel(address)
    call = channel.unary_unary(f"/{CONTROL}/Announce", request_serializer=lambda o: json.dumps(o).encode(),
                               response_deserializer=json.loads)

    def forward(phase: str, step: int) -> None:
        try:
            call({"phase": phase, "step": int(step)}, timeout=ANNOUNCE_TIMEOUT_S)
        except grpc.RpcError as error:  # the backend gone: the run goes on, its faults unfired
            logger.warning("phase %s of step %d not forwarded to the local Pathways backend at %s: %s",
                           phase, step, address, error)

    hooks.add_listener(forward)
    try:
        yield
    finally:
        hooks.remove_listener(forward)
        channel.close()
