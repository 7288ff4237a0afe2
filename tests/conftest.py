"""Test-wide setup: simulated CPU devices, set before JAX starts.

Eight host devices are enough for four simulated slices of two devices. Tests that need
another device count, or a fresh process (anything about process start-up, signals or
pools), run a subprocess.

JAX's persistent compilation cache lives in one directory of this test session, for this
process and every process it starts (``XDG_CACHE_HOME``, where ``elastic-dew train`` on
simulated slices keeps it): a test that builds the same program as an earlier one loads it
instead of compiling it again, as a restarted run loads its predecessor's programs, and no
test writes to the user's own cache.
"""

import os
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the session's own cache, never the user's
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Nothing leaves loopback: Google's credential discovery must not probe the cloud metadata
# server (google-auth reads these when it is imported, TensorStore when it looks for
# credentials), so it is pointed at a closed port on 127.0.0.1.
os.environ["NO_GCE_CHECK"] = "True"
os.environ["GCE_METADATA_HOST"] = os.environ["GCE_METADATA_ROOT"] = "127.0.0.1:9"

import re  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """One persistent compilation cache for the session (see the module docstring).

    Every program is cached, however quick its compile (JAX's default keeps only those over
    a second): most of the suite's compiles are small programs built again by later tests.
    JAX leaves out of the cache what it cannot reload faithfully (host callbacks).
    """
    base = tmp_path_factory.mktemp("xdg-cache")
    os.environ["XDG_CACHE_HOME"] = str(base)
    from elastic_dew.run.planning import compilation_cache_dir
    from elastic_dew.runtime import use_compilation_cache

    directory = compilation_cache_dir()
    directory.mkdir(parents=True)
    use_compilation_cache(directory, min_compile_time_s=0)
    yield directory


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """One fake-gcs-server for the whole test run (a real Cloud Storage API on 127.0.0.1).

    Its log is ``gcs/fake-gcs-server.log`` under pytest's base temporary directory. This
    process, and every process it starts, reaches it through ``STORAGE_EMULATOR_HOST`` and
    :func:`elastic_dew.runtime.use_local_bucket`, as a user's run would.
    """
    from elastic_dew.runtime import use_local_bucket
    from elastic_dew.testing.gcs_server import GCSServer

    server = GCSServer(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log").start()
    os.environ.update(server.env)
    use_local_bucket()
    yield server
    server.stop()


@pytest.fixture
def bucket(gcs_server, request) -> str:
    """A new bucket for this test alone: ``gs://NAME``."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40]
    bucket.count = getattr(bucket, "count", 0) + 1
    return gcs_server.create_bucket(f"t{bucket.count}-{name}".rstrip("-"))


def pytest_configure(config):
    """The suite's tiers, as markers (``./dev test`` runs every tier; CI's other environments
    run ``-m libraries``).

    ``slow``: an end-to-end run or a test that starts processes. ``libraries``: a test that
    exercises a wrapped library's API (jax, Orbax, Grain, Flax, pathwaysutils, the Cloud
    Storage clients) or the seam to its internals, so it can differ between their versions.
    """
    config.addinivalue_line("markers", "slow: an end-to-end run or a test that starts processes")
    config.addinivalue_line(
        "markers", "libraries: exercises a wrapped library's API; run in every CI environment"
    )


@pytest.fixture
def fault_proxy(gcs_server):
    """A :class:`~elastic_dew.testing.fault_proxy.FaultProxy` in front of the session's
    Cloud Storage server, for this test alone (its rules start empty; stopping it releases
    every stall)."""
    from elastic_dew.testing.fault_proxy import FaultProxy

    with FaultProxy(gcs_server.url) as proxy:
        yield proxy
