"""The loopback fault proxy (``elastic_dew.testing.fault_proxy``) in front of the real local
Cloud Storage server: errors, stalls and resets by method and object path, switched while it runs."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from elastic_dew.testing.fault_proxy import ProxyFault, FaultProxy, object_path
from elastic_dew.testing.waits import poll

pytestmark = pytest.mark.libraries  # the Cloud Storage clients' retries


def _upload(url: str, bucket: str, name: str, data: bytes, timeout: float = 10) -> int:
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(
        f"{url}/upload/storage/v1/b/{bucket.removeprefix('gs://')}/o?{query}", data=data, method="POST",
        headers={"Content-Type": "application/octet-stream"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.status


def _download(url: str, bucket: str, name: str, timeout: float = 10) -> bytes:
    quoted = urllib.parse.quote(name, safe="")
    with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket.removeprefix('gs://')}/o/{quoted}?alt=media", timeout=timeout) as reply:
        return reply.read()


def test_every_second_upload_under_a_path_is_answered_503_and_the_others_reach_the_server(fault_proxy, bucket, gcs_server):
    rule = fault_proxy.add(ProxyFault("error", method="POST", path="*/ckpt/*", status=503, every=2))
    answers = []
    for k in range(4):
        try:
            answers.append(_upload(fault_proxy.url, bucket, f"ckpt/{k}", b"x"))
        except urllib.error.HTTPError as error:
            answers.append(error.code)
            assert json.load(error)["error"]["code"] == 503
    _upload(fault_proxy.url, bucket, "other/0", b"y")  # another path: untouched
    assert answers == [200, 503, 200, 503]
    assert (rule.matched, rule.fired) == (4, 2)
    assert gcs_server.objects(bucket) == ["ckpt/0", "ckpt/2", "other/0"]


def test_a_429_rule_limited_to_two_times_then_forwards_reads(fault_proxy, bucket):
    _upload(fault_proxy.url, bucket, "a", b"payload")
    fault_proxy.add(ProxyFault("error", method="GET", path="*/a", status=429, times=2))
    codes = []
    for _ in range(3):
        try:
            codes.append(_download(fault_proxy.url, bucket, "a"))
        except urllib.error.HTTPError as error:
            codes.append(error.code)
    assert codes == [429, 429, b"payload"]


def test_a_stalled_upload_is_held_until_released_and_then_lands(fault_proxy, bucket, gcs_server):
    fault_proxy.add(ProxyFault("stall", method="POST", path="*/late"))
    with pytest.raises(OSError):  # the client gives up; the request stays held
        _upload(fault_proxy.url, bucket, "late", b"z", timeout=0.5)
    assert fault_proxy.held == 1
    assert gcs_server.objects(bucket) == []
    fault_proxy.clear()
    fault_proxy.release()
    poll(lambda: "late" in gcs_server.objects(bucket), 10)
    assert gcs_server.objects(bucket) == ["late"]  # the late release reached the server
    assert fault_proxy.held == 0


def test_a_timed_stall_forwards_after_its_seconds(fault_proxy, bucket):
    fault_proxy.add(ProxyFault("stall", method="POST", seconds=0.3))
    started = time.monotonic()
    assert _upload(fault_proxy.url, bucket, "slow", b"s") == 200
    assert time.monotonic() - started >= 0.3


def test_a_reset_rule_cuts_the_connection_without_an_answer(fault_proxy, bucket):
    _upload(fault_proxy.url, bucket, "r", b"r")
    fault_proxy.add(ProxyFault("reset", method="GET", path="*/r", times=1))
    with pytest.raises((ConnectionResetError, urllib.error.URLError, http.client.RemoteDisconnected)):
        _download(fault_proxy.url, bucket, "r")
    assert _download(fault_proxy.url, bucket, "r") == b"r"
    assert [r.action for r in fault_proxy.requests(method="GET")] == ["reset", "forwarded"]


def test_rules_switch_while_requests_are_in_flight(fault_proxy, bucket):
    rule = fault_proxy.add(ProxyFault("stall", method="POST", path="*/held"))
    done = threading.Event()
    threading.Thread(target=lambda: (_upload(fault_proxy.url, bucket, "held", b"h", timeout=30), done.set()),
                     daemon=True).start()
    assert fault_proxy.wait_for("stall", timeout=10)
    fault_proxy.remove(rule)
    assert _upload(fault_proxy.url, bucket, "held", b"again") == 200  # the rule is gone
    assert not done.is_set()
    fault_proxy.release()
    assert done.wait(10)


def test_object_paths_are_read_from_urls_upload_names_and_multipart_metadata():
    assert object_path("GET", "/storage/v1/b/bk/o/a%2Fb?alt=media", {}, b"") == "bk/a/b"
    assert object_path("POST", "/upload/storage/v1/b/bk/o?uploadType=media&name=c%2F1", {}, b"") == "bk/c/1"
    body = b'--x\r\nContent-Type: application/json\r\n\r\n{"name": "d/2"}\r\n--x\r\n\r\ndata\r\n--x--'
    assert object_path("POST", "/upload/storage/v1/b/bk/o?uploadType=multipart", {"Content-Type": "multipart/related"}, body) == "bk/d/2"
    assert object_path("GET", "/storage/v1/b/bk/o?prefix=x", {}, b"") == "bk/"


def test_the_proxy_refuses_an_upstream_off_loopback():
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("http://10.0.0.1:4443")
