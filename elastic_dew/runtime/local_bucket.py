"""One switch for a local bucket: ``STORAGE_EMULATOR_HOST`` points every Cloud Storage client at it.

Google's client libraries take ``STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT`` as the
address of a local Cloud Storage server (fake-gcs-server, ``elastic-dew gcs-server``), but
a ``gs://`` checkpoint goes through three clients, and only one of them reads that variable
the same way:

- **google-cloud-storage** (Orbax asks it whether a bucket has a hierarchical namespace
  before it deletes an old step) reads it and then uses anonymous credentials: nothing to do.
- **TensorStore's** ``gcs`` **driver** (the arrays) reads ``TENSORSTORE_GCS_HTTP_URL``
  instead, and looks for credentials (ending on the metadata server at
  ``GCE_METADATA_ROOT``) unless its fixed-token hook ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` is
  set; a local server takes any token, so that hook is set and no search happens.
- **gcsfs** (``etils.epath``: directories, metadata, ``commit_success.txt``) reads it, but
  first tries Google's default credentials (which probe the metadata server), and its
  default ``ExtendedGcsFileSystem`` asks the Storage Control API over gRPC for every
  bucket's layout, which a local server does not serve: each such call waits about 60 s.
  ``FSSPEC_GCS_TOKEN=anon`` and ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` give it
  anonymous access and the plain HTTP file system.

:func:`use_local_bucket` sets those variables from ``STORAGE_EMULATOR_HOST`` alone, together
with the metadata-server guards (``GCE_METADATA_HOST`` and ``GCE_METADATA_ROOT`` at the
closed port ``127.0.0.1:9``, ``NO_GCE_CHECK=True``), so that credential discovery never
leaves the machine. A value the user set already is kept. fsspec and gcsfs read theirs when
they are imported, so :func:`~elastic_dew.runtime.prepare_process` calls this first thing;
where they were imported before, their settings are changed in place as well. Child
processes inherit the variables.

Without ``STORAGE_EMULATOR_HOST`` (a real bucket, on GKE) nothing is changed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from urllib.parse import urlparse

__all__ = ["EMULATOR_ENV", "METADATA_GUARD", "LoopbackServer", "local_bucket_env", "local_bucket_problem", "use_local_bucket"]

logger = logging.getLogger(__name__)

#: The variable Google's client libraries read for a local Cloud Storage server.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"

#: A loopback address where nothing listens: the metadata server's address in tests and tools.
METADATA_GUARD = "127.0.0.1:9"


class LoopbackServer:
    """A local Cloud Storage server on ``127.0.0.1:port`` (fake-gcs-server, the fault proxy):
    its address, and the environment that points a process's clients at it."""

    port: int

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The one variable a process needs to use this server for ``gs://``."""
        return {EMULATOR_ENV: self.url}


def local_bucket_problem(env: Mapping[str, str]) -> str | None:
    """None when ``env``'s ``STORAGE_EMULATOR_HOST`` is unset or a usable ``http(s)://HOST:PORT``,
    else what is wrong with it and how to fix it."""
    value = env.get(EMULATOR_ENV)
    if not value:
        return None
    parsed = urlparse(value if "://" in value else f"http://{value}")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or port is None or parsed.path not in ("", "/"):
        return (f"{EMULATOR_ENV}={value!r} is not the address of a local Cloud Storage server; "
                f"set it to http://127.0.0.1:PORT (what `elastic-dew gcs-server` prints), or unset it "
                "to use Cloud Storage itself")
    return None


def local_bucket_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables :func:`use_local_bucket` would add to ``env`` (empty without a local bucket).

    Raises ``ValueError`` with :func:`local_bucket_problem`'s message for a bad address.
    """
    problem = local_bucket_problem(env)
    if problem:
        raise ValueError(problem)
    value = env.get(EMULATOR_ENV)
    if not value:
        return {}
    url = (value if "://" in value else f"http://{value}").rstrip("/")
    wanted = {
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-bucket",
        "FSSPEC_GCS_TOKEN": "anon",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "GCE_METADATA_HOST": METADATA_GUARD,
        "GCE_METADATA_ROOT": METADATA_GUARD,
        "NO_GCE_CHECK": "True",
    }
    return {name: text for name, text in wanted.items() if name not in env}


def use_local_bucket(env: MutableMapping[str, str] | None = None) -> str | None:
    """Point every Cloud Storage client at ``STORAGE_EMULATOR_HOST``; return its URL, or None.

    ``env`` is the process environment (``os.environ``, the default). Raises ``ValueError``
    for an address that is not ``http(s)://HOST:PORT``, before anything is changed.

    Args:
        env: the environment to read and set (``os.environ`` by default).

    Returns:
        The local server's URL, or ``None`` when ``STORAGE_EMULATOR_HOST`` is not set.

    Raises:
        ValueError: the address is not ``http(s)://HOST:PORT``; nothing was changed.
    """
    env = os.environ if env is None else env
    added = local_bucket_env(env)
    if not env.get(EMULATOR_ENV):
        return None
    env.update(added)
    if env is os.environ:
        _update_imported_clients()
    url = env["TENSORSTORE_GCS_HTTP_URL"]
    logger.info("Cloud Storage clients use the local server at %s", url)
    return url


def _update_imported_clients() -> None:
    """Apply the settings fsspec and gcsfs read at import to copies already imported."""
    if "fsspec" in sys.modules:
        from fsspec.config import conf

        for protocol in ("gcs", "gs"):
            conf.setdefault(protocol, {}).setdefault("token", os.environ["FSSPEC_GCS_TOKEN"])
    if "gcsfs" in sys.modules and os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "").lower() not in ("true", "1"):
        import fsspec
        from gcsfs.core import GCSFileSystem

        for protocol in ("gcs", "gs"):
            fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)
