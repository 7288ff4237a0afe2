"""The storage bounds' rules: the automatic timeout, the grace window and its share of a stop,
the wording of a storage failure, the rendered JobSet's grace variable, and a data read
whose file never answers."""

from __future__ import annotations

import dataclasses
import errno
import os
import threading
import time

import pytest

from elastic_dew import testing as chaos
from elastic_dew.elastic.state import activity, storage
from elastic_dew.elastic.state.storage import StorageTimeout


def test_the_automatic_timeout_grows_with_the_state_and_the_measured_bandwidth_above_its_floor():
    bandwidth = storage.Bandwidth()
    assert storage.automatic_timeout(1 << 20, bandwidth) == storage.FLOOR_SECONDS
    bandwidth.add(10 << 30, 10.0)  # 1 GiB/s measured
    bandwidth.add(10 << 30, 100.0)  # a slow save: the slowest recent one sizes the bound
    # 100 GiB at the slowest 0.1 GiB/s is 1,000 s, times the slack
    assert storage.automatic_timeout(100 << 30, bandwidth) == pytest.approx(storage.SLACK * 1000)


def test_the_grace_window_comes_from_the_setting_then_the_manifest_variable_then_30_s():
    assert storage.grace_seconds(12.0, {storage.GRACE_ENV: "90"}) == 12.0
    assert storage.grace_seconds(None, {storage.GRACE_ENV: "90"}) == 90.0
    assert storage.grace_seconds(None, {}) == storage.DEFAULT_GRACE == 30.0
    with pytest.raises(ValueError, match="terminationGracePeriodSeconds"):
        storage.grace_seconds(None, {storage.GRACE_ENV: "soon"})
    # a stop noticed 10 s into a 30 s window gets 30 - 3 (margin) - 10 s, never more than the timeout
    assert storage.stop_timeout(30.0, 100.0, 600.0, now=110.0) == pytest.approx(17.0)
    assert storage.stop_timeout(30.0, 100.0, 5.0, now=110.0) == 5.0


def test_a_bounded_call_that_stays_active_outlasts_its_timeout_and_one_that_stops_is_given_up_on():
    meter = activity.Meter()
    moving = threading.Event()

    def work(seconds: float, progressing: float) -> str:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if time.monotonic() < end - seconds + progressing:
                meter.note(answered=1, nbytes=10)
            time.sleep(0.05)
        moving.set()
        return "done"

    started = time.monotonic()
    assert storage.bounded("save", "gs://b/ck", 3, 0.4, lambda: work(1.2, 1.2), activity=meter) == "done"
    assert time.monotonic() - started >= 1.2  # three times its bound, answered all along
    started = time.monotonic()
    with pytest.raises(StorageTimeout) as stalled:
        storage.bounded("save", "gs://b/ck", 4, 0.4, lambda: work(5.0, 0.3), activity=meter)
    waited = time.monotonic() - started
    assert 0.2 + 0.4 <= waited < 3.0, waited  # from the last activity (about 0.3 s in), not the call's start
    assert stalled.value.idle and "had no activity for the storage timeout of 0.4 s" in str(stalled.value)
    with pytest.raises(StorageTimeout) as given:  # a total bound holds, active or not
        storage.bounded("commit", "gs://b/ck", 5, 0.4, lambda: work(3.0, 3.0), activity=meter, total=0.6)
    assert not given.value.idle and "did not finish within the 0.6 s it was given" in str(given.value)
    started = time.monotonic()
    with pytest.raises(StorageTimeout) as data:  # nothing measured: the bound is the call's whole time
        storage.bounded("read", "the training data", 6, 0.3, lambda: work(3.0, 3.0), noun="data", activity=None)
    assert time.monotonic() - started < 2.0
    assert "data read of step 6 in the training data did not finish within the storage timeout of 0.3 s" in str(data.value)


def test_the_activity_meter_counts_what_tensorstore_reads_and_writes(tmp_path):
    import tensorstore as ts

    before = activity.METER.counters()
    array = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "a")}},
                    create=True, dtype=ts.float32, shape=[64]).result()
    array.write(1.0).result()
    moved = activity.METER.counters() - before
    assert moved.answered >= 1 and moved.nbytes > 0, moved
    assert activity.METER.idle(time.monotonic() - 60) < 5


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "full"),
        (ValueError("RESOURCE_EXHAUSTED: Error writing local file"), "full"),
        (OSError(errno.EROFS, "Read-only file system"), "read_only"),
        (ValueError("PERMISSION_DENIED: [http_response_code='403']"), "permission"),
        (FileNotFoundError("http://127.0.0.1:1/upload/storage/v1/b/nope/o"), "missing"),
        (ConnectionResetError("reset by peer"), "other"),
        (RuntimeError("gcsfs.retry.HttpError: Forbidden, 403"), "permission"),
        (RuntimeError("404 GET http://127.0.0.1:1/storage/v1/b/nope"), "missing"),
        # a damaged checkpoint's read: "403" and "404" only inside a uuid and a directory's name
        (ValueError('DATA_LOSS: Error reading "params.w/.zarray" in OCDBT database at '
                    '{"uuid":"78e36dcdc4403d8f7852595a404e1ab7","path":"/tmp/pytest-404/ck/8/state/"}'), "other"),
    ],
)
def test_a_storage_error_is_worded_by_its_cause_with_the_fix(error, kind):
    found, what, fix = storage.classify(error)
    assert found == kind and what and fix


@pytest.mark.parametrize(
    ("error", "directory", "for_good"),
    [
        (ValueError("PERMISSION_DENIED: [http_response_code='403']"), "gs://b/ck", True),
        (OSError(errno.EACCES, "Permission denied"), "/ckpt", True),
        (FileNotFoundError("b/no-such-bucket/o"), "gs://no-such-bucket/ck", True),
        (FileNotFoundError("/ckpt/5"), "/ckpt", False),  # the next save's manager creates it again
        (OSError(errno.ENOSPC, "No space left on device"), "/ckpt", False),
        (ConnectionResetError("reset by peer"), "gs://b/ck", False),
    ],
)
def test_only_a_refused_permission_or_a_missing_bucket_stops_saving_at_the_first_failure(error, directory, for_good):
    assert storage.permanent(storage.StorageError.of("save", directory, 5, error)) is for_good
    stalled = StorageTimeout("stalled", operation="save", storage=directory, step=5, timeout=1.0)
    assert not storage.permanent(stalled)


def test_the_rendered_jobsets_tell_the_controller_their_grace_period():
    import yaml

    from conftest import REPO
    from elastic_dew.k8s import render

    shipped = sorted((REPO / "k8s").glob("jobset-elastic*.yaml"))
    assert len(shipped) == 2
    for path in shipped:
        jobset = yaml.safe_load(path.read_text())
        told = []
        for job in jobset["spec"]["replicatedJobs"]:
            pod = job["template"]["spec"]["template"]["spec"]
            for container in pod["containers"]:
                if container["name"] == render.CONTROLLER:
                    env = {e["name"]: e.get("value") for e in container["env"]}
                    told.append((env.get(storage.GRACE_ENV), str(pod["terminationGracePeriodSeconds"])))
        assert len(told) == 1 and told[0][0] == told[0][1], (path, told)


@pytest.mark.slow
def test_a_data_read_that_blocks_ends_the_run_within_the_storage_timeout_naming_the_step(tmp_path):
    """The training data's example 100 is read from a FIFO nobody writes to, as a stalled Cloud
    Storage FUSE mount reads: the loop gives up after --storage-timeout, with the step."""
    import grain

    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.trainer import Trainer

    fifo = tmp_path / "example-100"
    os.mkfifo(fifo)
    parts = chaos.model()
    source = parts["dataset"]

    def read(i):
        if i == 100:
            with open(fifo, "rb") as blocked:  # blocks until a writer opens it
                blocked.read()
        return source[i]

    parts["dataset"] = grain.MapDataset.range(len(source)).map(read)
    config = dataclasses.replace(chaos.Scenario().config(), storage_timeout=2.0, snapshot_every=0, checkpoint_every=0)
    started = time.monotonic()
    try:
        with SimulatedSlices(4, 2), pytest.raises(StorageTimeout) as stalled:
            Trainer(**parts, config=config, run_dir=tmp_path / "run").fit(12)
        assert time.monotonic() - started < 60
        message = str(stalled.value)
        assert "data read of step" in message and "the training data" in message and "2 s" in message
    finally:
        threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True).start()  # let the reader go


def test_a_storage_operation_given_up_on_is_worded_one_way_for_each_of_its_three_causes():
    from elastic_dew.elastic.state.storage import StorageTimeout, timed_out

    common = dict(operation="commit", storage="gs://b/ck", step=4, waited=12.34)
    idle = timed_out("checkpoint save of step 4 in gs://b/ck", timeout=10.0, idle=True, verb="commit", **common)
    unmeasured = timed_out("checkpoint listing in gs://b/ck", timeout=10.0, idle=True, measured=False, **common)
    given = timed_out("checkpoint save of step 4 in gs://b/ck", timeout=3.0, idle=False, verb="commit", **common)
    assert str(idle) == ("checkpoint save of step 4 in gs://b/ck had no activity for the storage timeout of 10 s "
                         "(no request answered, no byte moved; 12.3 s since it began): the storage is not answering")
    assert str(unmeasured) == ("checkpoint listing in gs://b/ck did not finish within the storage timeout of 10 s: "
                               "the storage is not answering")
    assert str(given) == "checkpoint save of step 4 in gs://b/ck did not commit within the 3 s it was given"
    assert all(isinstance(e, StorageTimeout) for e in (idle, unmeasured, given))
    assert (idle.idle, unmeasured.idle, given.idle) == (True, True, False) and given.timeout == 3.0
