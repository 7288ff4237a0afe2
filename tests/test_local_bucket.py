"""``STORAGE_EMULATOR_HOST`` is the one switch for a local bucket (elastic_dew.runtime.local_bucket)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO
from elastic_dew.runtime import local_bucket, prepare_process

pytestmark = pytest.mark.libraries  # the Cloud Storage clients and gcsfs


def test_the_emulator_address_alone_points_every_client_at_it_and_keeps_what_the_user_set():
    env = {"STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443/", "GCE_METADATA_HOST": "10.0.0.1:80"}
    url = local_bucket.use_local_bucket(env)
    assert url == "http://127.0.0.1:4443"
    assert env == {
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443/",
        "TENSORSTORE_GCS_HTTP_URL": "http://127.0.0.1:4443",  # TensorStore's gcs driver
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-bucket",  # TensorStore: no credential search
        "FSSPEC_GCS_TOKEN": "anon",  # gcsfs: no credential discovery
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # gcsfs: no gRPC bucket-layout probe
        "GCE_METADATA_HOST": "10.0.0.1:80",  # the user's own value is kept
        "GCE_METADATA_ROOT": "127.0.0.1:9",
        "NO_GCE_CHECK": "True",
    }
    host_only = {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"}
    local_bucket.use_local_bucket(host_only)
    assert host_only["TENSORSTORE_GCS_HTTP_URL"] == "http://127.0.0.1:4443"


def test_without_the_emulator_address_nothing_is_changed():
    env = {"HOME": "/root"}
    assert local_bucket.use_local_bucket(env) is None
    assert env == {"HOME": "/root"}


@pytest.mark.parametrize("address", ["ftp://127.0.0.1:21", "http://127.0.0.1", "http://127.0.0.1:4443/bucket", "http://:80"])
def test_a_malformed_emulator_address_is_refused_by_prepare_process_before_anything_changes(monkeypatch, address):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", address)
    monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL", raising=False)
    before = dict(os.environ)
    with pytest.raises(ValueError, match=r"STORAGE_EMULATOR_HOST=.*http://127.0.0.1:PORT.*elastic-dew gcs-server"):
        prepare_process()
    assert dict(os.environ) == before


@pytest.mark.slow
def test_gcsfs_imported_before_the_switch_still_gets_the_plain_http_file_system_and_no_credentials(gcs_server):
    """A fresh process that imported fsspec and gcsfs first, then calls ``use_local_bucket``."""
    program = textwrap.dedent(
        """
        import os, fsspec, gcsfs
        from etils import epath
        from elastic_dew.runtime import use_local_bucket
        use_local_bucket()
        fs = fsspec.filesystem("gs")
        print(type(fs).__name__, fs.credentials.token)
        path = epath.Path(os.environ["BUCKET"]) / "x.txt"
        path.write_text("hello")
        print(path.read_text())
        """
    )
    bucket = gcs_server.create_bucket("early-import")
    env = {key: value for key, value in os.environ.items() if key not in local_bucket.local_bucket_env({"STORAGE_EMULATOR_HOST": "127.0.0.1:1"})}
    env.update(gcs_server.env, BUCKET=bucket, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["GCSFileSystem", "anon", "hello"]


@pytest.mark.slow
def test_gcs_server_serves_its_buckets_and_prints_the_variable_to_export_until_terminated(tmp_path):
    from elastic_dew.testing.gcs_server import GCSServer

    server = subprocess.Popen(
        [sys.executable, "-m", "elastic_dew", "gcs-server", "--bucket", "my-bucket", "--log", str(tmp_path / "gcs.log")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        lines = [server.stdout.readline() for _ in range(3)]
        export = lines[-1].strip()
        assert export.startswith("export STORAGE_EMULATOR_HOST=http://127.0.0.1:"), lines
        client = GCSServer(tmp_path / "unused.log", port=int(export.rpartition(":")[2]))
        assert client.objects("my-bucket") == []  # the bucket exists and answers
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
    with pytest.raises(OSError):  # the server itself stopped with the command
        client.objects("my-bucket")


@pytest.mark.slow
def test_gcs_server_refuses_a_bad_bucket_name_with_exit_2():
    out = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "gcs-server", "--bucket", "No"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert out.returncode == 2
    assert "gcs-server: error: 'No' is not a bucket name" in out.stderr
