"""``elastic-dew launch``: a local launcher for multi-process JAX pools on one host.

``elastic-dew launch -n N [--env K=V]... [--grace SECONDS] -- CMD...`` starts N ranks of
CMD, each with ``JAX_COORDINATOR_ADDRESS`` (a free loopback port), ``DEW_PROCESS_COUNT``
and ``DEW_PROCESS_ID``, which :func:`elastic_dew.runtime.prepare_process` passes to
``jax.distributed.initialize``. Every output line of a rank is prefixed with
``[rank R]``. SIGTERM (or SIGINT) to the launcher is forwarded to every rank, and ranks
still running a grace period later are SIGKILLed. The first rank that fails stops the
others the same way, and the launcher exits with that rank's status (a rank killed by a
signal counts as 128 + the signal), so a preempted pool exits 143.

This module never imports JAX: the ranks do.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import BinaryIO

from elastic_dew.flags import Flag, add_flags, command_line_text, given
from elastic_dew.settings import Bound, SettingError, check_fields, mention, setting

__all__ = ["Pool", "configure", "run", "free_port", "launch"]

logger = logging.getLogger(__name__)

DEFAULT_GRACE = 30.0
_POLL = 0.05


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass(frozen=True)
class Pool:
    """A local pool's settings, checked once as they are built.

    Args:
      nprocs: the number of ranks.
      env: ``KEY=VALUE`` variables set in every rank.
      grace: seconds the ranks may take to stop before SIGKILL.

    Raises:
      SettingError: a setting outside its range, or an ``env`` text that is not ``KEY=VALUE``.
    """

    nprocs: int = setting(1, bound=Bound(1, whole=True))
    env: tuple[str, ...] = ()
    grace: float = setting(DEFAULT_GRACE, bound=Bound(0, unit="seconds"))

    def __post_init__(self) -> None:
        check_fields(self)
        for text in self.env:
            if not text.partition("=")[0] or "=" not in text:
                raise SettingError(Pool, "env", text, problem=f"{mention('env', text)} is not KEY=VALUE")

    @property
    def variables(self) -> dict[str, str]:
        """``env`` as a mapping."""
        return dict(text.split("=", 1) for text in self.env)


_FLAGS = {
    "nprocs": Flag(required=True, short="-n"),
    "env": Flag("set an environment variable in every rank (repeatable)", "K=V"),
    "grace": Flag(metavar="SECONDS"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare ``elastic-dew launch``'s arguments: :class:`Pool`'s flags and the command."""
    add_flags(parser, Pool, _FLAGS, defaults=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...: what each rank runs")
    parser.set_defaults(usage_error=parser.error)


def _status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _binary(stream) -> BinaryIO:
    """The byte stream under a text stream (a captured stream may have none)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        return buffer

    class _Text:
        def write(self, data: bytes) -> None:
            stream.write(data.decode(errors="replace"))

        def flush(self) -> None:
            stream.flush()

    return _Text()  # type: ignore[return-value]


def _pump(stream: BinaryIO, out: BinaryIO, prefix: bytes, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        with lock:
            out.write(prefix + line)
            out.flush()
    stream.close()


def launch(
    nprocs: int,
    cmd: Sequence[str],
    env: dict[str, str] | None = None,
    grace: float = DEFAULT_GRACE,
) -> int:
    """Run ``cmd`` as ``nprocs`` ranks of one pool and return the pool's exit status.

    Raises:
      SettingError: ``nprocs`` or ``grace`` out of range (:class:`Pool`).
      ValueError: no command.
    """
    Pool(nprocs, grace=grace)
    if not cmd:
        raise ValueError("nothing to launch: give the command after --, e.g. `-- python train.py`")
    address = f"127.0.0.1:{free_port()}"
    base = dict(os.environ)
    base.update(env or {})
    base.update({"JAX_COORDINATOR_ADDRESS": address, "DEW_PROCESS_COUNT": str(nprocs)})

    stop = threading.Event()
    signals: list[int] = []

    def on_signal(signum, frame):
        signals.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    ranks: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    out_lock, err_lock = threading.Lock(), threading.Lock()
    try:
        logger.info("launching %d rank(s), coordinator %s: %s", nprocs, address, " ".join(cmd))
        for rank in range(nprocs):
            proc = subprocess.Popen(
                list(cmd),
                env={**base, "DEW_PROCESS_ID": str(rank)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # signals reach a rank only through the launcher
            )
            ranks.append(proc)
            prefix = f"[rank {rank}] ".encode()
            for stream, out, lock in (
                (proc.stdout, _binary(sys.stdout), out_lock),
                (proc.stderr, _binary(sys.stderr), err_lock),
            ):
                t = threading.Thread(target=_pump, args=(stream, out, prefix, lock), daemon=True, name="elastic-dew-io")
                t.start()
                pumps.append(t)
        status = _supervise(ranks, stop, signals, grace)
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for t in pumps:
            t.join(timeout=5)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return status


def _supervise(
    ranks: list[subprocess.Popen], stop: threading.Event, signals: list[int], grace: float
) -> int:
    first_failure: int | None = None
    deadline: float | None = None
    forwarded = 0

    def terminate(signum: int = signal.SIGTERM) -> None:
        for proc in ranks:
            if proc.poll() is None:
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    pass

    while True:
        if len(signals) > forwarded:
            # A second SIGTERM is forwarded as well: the ranks decide what it means.
            for signum in signals[forwarded:]:
                logger.info("forwarding %s to every rank", signal.Signals(signum).name)
                terminate(signum)
            forwarded = len(signals)
            if deadline is None:
                deadline = time.monotonic() + grace
        for rank, proc in enumerate(ranks):
            code = proc.poll()
            if code is not None and code != 0 and first_failure is None:
                first_failure = _status(code)
                logger.info("rank %d exited with status %d", rank, first_failure)
                if deadline is None and any(p.poll() is None for p in ranks):
                    logger.info("stopping the other ranks")
                    terminate()
                    deadline = time.monotonic() + grace
        if all(p.poll() is not None for p in ranks):
            break
        if deadline is not None and time.monotonic() >= deadline:
            logger.warning("grace period of %gs over: SIGKILL to the ranks still running", grace)
            for proc in ranks:
                if proc.poll() is None:
                    proc.kill()
            deadline = float("inf")
        time.sleep(_POLL)
    if first_failure is not None:
        return first_failure
    return 0


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        pool = Pool(**given(args, Pool, _FLAGS))
    except SettingError as error:
        args.usage_error(command_line_text(error, [(Pool, _FLAGS)]))  # exits 2
    if not cmd:
        args.usage_error("give the command after --, e.g. `-- python train.py`")  # exits 2
    return launch(pool.nprocs, cmd, pool.variables, pool.grace)
