"""A local Pathways backend: JAX's IFRT proxy protocol served on loopback by jaxlib's CPU client.

On a Pathways cluster a single-controller program reaches its devices through jaxlib's
IFRT proxy client (``JAX_PLATFORMS=proxy``, ``JAX_BACKEND_TARGET=grpc://...``, set up by
``pathwaysutils.initialize()``): every array, compile, execute and transfer crosses a gRPC
boundary, and a lost slice shows as results that fail with ``DATA_LOSS`` when read.
:class:`LocalPathways` starts a server on 127.0.0.1 that speaks that protocol to the
installed jaxlib's client, carrying out each request on jaxlib's own CPU client, with
``slices`` virtual slices of ``devices_per_slice`` devices (each device carries its
``slice_index``)::

    with LocalPathways(slices=2, devices_per_slice=4) as backend:
        subprocess.run([sys.executable, "train.py"], env={**os.environ, **backend.client_env()})
        backend.lose_slice(1)      # every later result on slice 1 reads as DATA_LOSS
        backend.restore_slice(1)   # available again

``elastic-dew proxy`` starts the same server from the command line; ``elastic-dew simulate
--boundary proxy -- COMMAND`` runs a program through it under a fault schedule. What the
boundary does not serve, and the error a program meets there, is in ``docs/simulator.md``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from elastic_dew.proxy.protocol import MAX_VERSION, MIN_VERSION, ProtocolMismatch

__all__ = ["LocalPathways", "ProtocolMismatch", "MIN_VERSION", "MAX_VERSION", "client_env"]

logger = logging.getLogger(__name__)

#: How long :meth:`LocalPathways.start` waits for the server to listen.
START_TIMEOUT_S = 60.0


def client_env(target: str, connection_timeout_s: int = 30) -> dict[str, str]:
    """The environment a JAX program needs to reach the server at ``target`` through
    ``pathwaysutils.initialize()``: the proxy platform, its target, plain (insecure) gRPC on
    loopback, and how long the client tries to connect.

    Args:
        target: ``grpc://127.0.0.1:PORT``.
        connection_timeout_s: how long the client retries its connection before it raises.

    Returns:
        The variables, by name.
    """
    return {
        "JAX_PLATFORMS": "proxy",
        "JAX_BACKEND_TARGET": target,
        "IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS": "true",
        "PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS": str(connection_timeout_s),
    }


class LocalPathways:
    """The local Pathways backend, in a process of its own (its CPU devices set before JAX).

    Args:
        slices: virtual slices (at least 1).
        devices_per_slice: CPU devices in each (at least 1).
        port: the loopback port (0: a free one).
        schedule: a fault schedule fired at the steps the backend counts (``lose:1@6,restore:1@12``;
            every action of the grammar; ``preempt`` and ``kill`` reach a program that announced
            its process, :meth:`exec_prefix`).
        step_function: count the dispatches of this function as the steps.
        fault_log: the fault log a restarted program shares (``faults.jsonl``).
        attempts: where each process's start and each run attempt's slices are appended (JSON
            lines ``{"pid", "start"}`` and ``{"pid", "active", "step"}``, as ``elastic-dew
            simulate`` reads them; a process announces itself with
            ``python -m elastic_dew.proxy.exec_program``).
        watch: where what the backend sees of the program's state is appended, as the
            in-process watch's records (``watch.jsonl``, :mod:`elastic_dew.proxy.records`), for the
            verdict's costs and the problem rules the boundary can evaluate.
        log: where the server's log goes (a path; default: discarded).

    Raises:
        ValueError: a bad argument, before anything starts.
    """

    def __init__(self, slices: int = 2, devices_per_slice: int = 4, *, port: int = 0, schedule: str = "",
                 step_function: str | None = None, fault_log: str | os.PathLike[str] | None = None,
                 attempts: str | os.PathLike[str] | None = None, log: str | os.PathLike[str] | None = None,
                 watch: str | os.PathLike[str] | None = None):
        if slices < 1 or devices_per_slice < 1:
            raise ValueError(f"slices={slices}, devices_per_slice={devices_per_slice}: each must be at least 1")
        if not 0 <= port < 65536:
            raise ValueError(f"port={port} must be in 0..65535 (0: a free one)")
        if schedule:
            from elastic_dew.simulate.schedule import check_fault_slices, parse_schedule

            check_fault_slices(parse_schedule(schedule), slices)
        self.slices, self.devices_per_slice, self.port = slices, devices_per_slice, port
        self.schedule, self.step_function = schedule, step_function
        self.fault_log = None if fault_log is None else str(fault_log)
        self.attempts = None if attempts is None else str(attempts)
        self.watch = None if watch is None else str(watch)
        self.log = None if log is None else Path(log)
        self._process: subprocess.Popen[str] | None = None
        self._channel: Any = None
        self._log_file: IO[str] | None = None

    # ------------------------------------------------------------------ lifetime

    def start(self, timeout: float = START_TIMEOUT_S) -> LocalPathways:
        """Start the server and wait (at most ``timeout`` seconds) until it listens.

        Args:
            timeout: seconds to wait for it to listen.

        Returns:
            This backend, serving.

        Raises:
            RuntimeError: it ended or did not listen in time (its log's last lines in the message).
        """
        from elastic_dew.proxy.serve import READY

        command = [sys.executable, "-m", "elastic_dew.proxy.serve", "--slices", str(self.slices),
                   "--devices-per-slice", str(self.devices_per_slice), "--port", str(self.port),
                   "--log-level", "INFO"]
        if self.schedule:
            command += ["--schedule", self.schedule]
        if self.step_function:
            command += ["--step-function", self.step_function]
        if self.fault_log:
            command += ["--fault-log", self.fault_log]
        if self.attempts:
            command += ["--attempts", self.attempts]
        if self.watch:
            command += ["--watch", self.watch]
        env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_BACKEND_TARGET")}
        self._log_file = open(self.log, "a", encoding="utf-8") if self.log else open(os.devnull, "w")
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log_file, text=True, env=env)
        deadline = time.monotonic() + timeout
        assert self._process.stdout is not None
        line = ""
        while time.monotonic() < deadline:
            line = self._process.stdout.readline()
            if line.startswith(READY) or not line:
                break
        if not line.startswith(READY):
            self.stop()
            tail = self.log.read_text().splitlines()[-5:] if self.log and self.log.exists() else []
            raise RuntimeError(f"the local Pathways backend did not start within {timeout:g} s"
                               + (": " + " | ".join(tail) if tail else ""))
        self.port = int(line[len(READY):])
        logger.info("local Pathways backend at %s (%d slices of %d devices)", self.target, self.slices,
                    self.devices_per_slice)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` seconds); a no-op when stopped.

        Args:
            timeout: seconds to wait after each signal.
        """
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._process is not None:
            if self._process.poll() is None:
                self._process.terminate()
                try:
                    self._process.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(timeout)
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> LocalPathways:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        """The server process's id (``None`` when it is not running)."""
        return None if self._process is None else self._process.pid

    # ------------------------------------------------------------------ what a client needs

    @property
    def target(self) -> str:
        """``grpc://127.0.0.1:PORT``, the ``JAX_BACKEND_TARGET`` of a client."""
        return f"grpc://127.0.0.1:{self.port}"

    def exec_prefix(self) -> list[str]:
        """The command that announces a new process of the run to this backend and then
        becomes the command after it (``[*backend.exec_prefix(), "python", "train.py"]``).

        Returns:
            ``python -m elastic_dew.proxy.exec_program --control ADDRESS --``.
        """
        return [sys.executable, "-m", "elastic_dew.proxy.exec_program", "--control", f"127.0.0.1:{self.port}", "--"]

    def client_env(self, connection_timeout_s: int = 30) -> dict[str, str]:
        """The environment variables a JAX program needs to run on this backend
        (:func:`client_env` of :attr:`target`).

        Args:
            connection_timeout_s: how long the client retries its connection.

        Returns:
            The variables, by name.
        """
        return client_env(self.target, connection_timeout_s)

    # ------------------------------------------------------------------ control

    def _call(self, method: str, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        import grpc

        from elastic_dew.proxy.serve import CONTROL

        if self._process is None:
            raise RuntimeError("the local Pathways backend is not running: start() it first")
        if self._process.poll() is not None:
            raise RuntimeError(f"the local Pathways backend is not running: its server exited with status "
                               f"{self._process.returncode} (its log: {self.log or 'discarded; pass log='}); "
                               "stop() it and start() a new one")
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        call = self._channel.unary_unary(f"/{CONTROL}/{method}", request_serializer=lambda o: json.dumps(o).encode(),
                                         response_deserializer=json.loads)
        return call(request, timeout=timeout)

    def _check_slice(self, index: int) -> None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.slices:
            raise ValueError(f"slice {index!r} does not exist: this backend has slices 0..{self.slices - 1}")

    def lose_slice(self, index: int) -> dict[str, Any]:
        """Lose slice ``index``: what it holds and every later result on it reads as DATA_LOSS.

        Args:
            index: the slice.

        Returns:
            The server's :meth:`status` after the loss.

        Raises:
            ValueError: the backend has no slice ``index`` (nothing is sent).
            RuntimeError: the server is not running.
        """
        self._check_slice(index)
        return self._call("Lose", {"slice": index})

    def restore_slice(self, index: int) -> dict[str, Any]:
        """Give slice ``index`` back: results made on it from now on are whole.

        Args:
            index: the slice.

        Returns:
            The server's :meth:`status` after the return.

        Raises:
            ValueError: the backend has no slice ``index`` (nothing is sent).
            RuntimeError: the server is not running.
        """
        self._check_slice(index)
        return self._call("Restore", {"slice": index})

    def status(self) -> dict[str, Any]:
        """The server's state.

        Returns:
            ``lost`` slices, slice ``events``, ``dispatches``, ``sessions``, ``refusals`` (the
            line each refused client got), counted ``steps``, ``fired`` and ``unfired`` faults,
            and the run's ``attempts`` (each a step and the slices its program spans).

        Raises:
            RuntimeError: the server is not running.
        """
        return self._call("Status", {})
