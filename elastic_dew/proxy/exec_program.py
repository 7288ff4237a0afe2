"""Start a program on the local Pathways backend: ``python -m elastic_dew.proxy.exec_program``.

``--control 127.0.0.1:PORT -- COMMAND [ARGS...]`` tells the backend's control service that a
new process of the run starts (its pid: the backend counts its steps afresh and records its
attempts under it), then replaces itself with COMMAND (``os.execvp``, the same pid), so
nothing of elastic_dew, and no JAX, is in the program's process. The child of
``elastic-dew simulate --boundary proxy``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[0] != "--control" or argv[2] != "--":
        sys.stderr.write("usage: python -m elastic_dew.proxy.exec_program --control ADDRESS -- COMMAND [ARGS...]\n")
        return 2
    address, command = argv[1], argv[3:]
    import grpc

    from elastic_dew.proxy.serve import CONTROL

    with grpc.insecure_channel(address) as channel:
        started = channel.unary_unary(f"/{CONTROL}/Started", request_serializer=lambda o: json.dumps(o).encode(),
                                      response_deserializer=json.loads)
        started({"pid": os.getpid()}, timeout=30)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)
    return 127  # not reached: execvp raises when it cannot start COMMAND


if __name__ == "__main__":
    sys.exit(main())
