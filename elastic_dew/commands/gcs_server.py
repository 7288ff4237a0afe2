"""``elastic-dew gcs-server``: a local Cloud Storage server, to run ``gs://`` training on one machine.

It starts fake-gcs-server on 127.0.0.1 (:class:`elastic_dew.testing.gcs_server.GCSServer`),
creates the buckets asked for, prints the one variable to export in the shell that trains,
and serves until interrupted (Ctrl-C or SIGTERM)::

    elastic-dew gcs-server --bucket my-bucket &
    export STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT
    elastic-dew train lm --checkpoint-dir gs://my-bucket/runs/a/checkpoints

``prepare_process`` turns that variable into every Cloud Storage client's own setting
(:mod:`elastic_dew.runtime.local_bucket`); a program of one's own calls
``elastic_dew.runtime.use_local_bucket()`` before its first ``gs://`` access.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from elastic_dew.commands.serve import serve
from elastic_dew.run import USAGE_EXIT

__all__ = ["configure", "run"]

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--bucket", action="append", default=[], metavar="NAME",
        help="create this bucket at start (repeatable; 3-63 lower-case letters, digits, '-', '_', '.')",
    )
    parser.add_argument(
        "--root", type=Path, default=None, metavar="DIR",
        help="keep the objects in this directory, so they outlive the server (default: in memory)",
    )
    parser.add_argument("--log", type=Path, default=Path("fake-gcs-server.log"), help="the server's log file")


def run(args: argparse.Namespace) -> int:
    from elastic_dew.testing.gcs_server import GCSServer, binary_path

    bad = [name for name in args.bucket if not _BUCKET.match(name)]
    if bad:
        print(f"elastic-dew gcs-server: error: {', '.join(map(repr, bad))} is not a bucket name "
              "(3-63 lower-case letters, digits, '-', '_' or '.', starting and ending with a letter or digit)",
              file=sys.stderr)
        return USAGE_EXIT
    if args.port is not None and not 0 < args.port < 65536:
        print(f"elastic-dew gcs-server: error: --port {args.port} must be in 1..65535", file=sys.stderr)
        return USAGE_EXIT
    try:
        binary_path()
    except FileNotFoundError as error:
        print(f"elastic-dew gcs-server: error: {error}", file=sys.stderr)
        return USAGE_EXIT
    server = GCSServer(args.log, port=args.port, root=args.root)

    def announce() -> None:
        for name in args.bucket:
            server.create_bucket(name)
        print(f"fake-gcs-server at {server.url} (log {args.log}); buckets: {', '.join(args.bucket) or 'none'}")
        print("In the shell that trains:")
        print(f"export STORAGE_EMULATOR_HOST={server.url}", flush=True)

    return serve("elastic-dew gcs-server", server, announce)
