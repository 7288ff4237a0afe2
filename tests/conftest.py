"""Test-wide setup: simulated CPU devices, set before JAX starts.

Eight host devices are enough for four simulated slices of two devices. Tests that need
another device count, or a fresh process (anything about process start-up, signals or
pools), run a subprocess.
"""

import os
import sys
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"
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
