"""The local Pathways backend (``elastic_dew.proxy``): unmodified JAX through jaxlib's own IFRT
proxy client (``JAX_PLATFORMS=proxy``, ``pathwaysutils.initialize()``) to the server's CPU slices.

Each client is a real JAX process (``tests/programs/proxy_client.py``, pathwaysutils' own
elastic workload), with nothing of elastic_dew in it; each server a real process too.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from boundarylib import assert_boundaries_agree
from conftest import REPO

PROGRAMS = REPO / "tests" / "programs"

pytestmark = pytest.mark.libraries  # jaxlib's proxy client, pathwaysutils


def _client(backend, *args, timeout=180, env=None):
    """Run ``proxy_client.py ARGS`` on ``backend``; its JSON lines by check, and the process."""
    done = subprocess.run([sys.executable, str(PROGRAMS / "proxy_client.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **backend.client_env(10), **(env or {})})
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {line.pop("check"): line for line in lines}, done


def test_the_protocol_definitions_are_those_the_installed_jaxlib_was_built_with():
    """Every message the server reads or writes has, in the installed jaxlib's own compiled
    definitions, the same fields with the same numbers and types (byte for byte where the
    jaxlib is the one they were written from)."""
    import jaxlib
    from google.protobuf import descriptor_pb2

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import ifrt_proxy_protocol
    finally:
        sys.path.pop(0)
    from elastic_dew.proxy import _wire

    theirs = ifrt_proxy_protocol.descriptors(ifrt_proxy_protocol.library().read_bytes())
    if jaxlib.__version__ == _wire.JAXLIB:
        assert theirs == _wire.FILES, "run python scripts/ifrt_proxy_protocol.py"

    def fields(blob):
        proto = descriptor_pb2.FileDescriptorProto.FromString(blob)
        out = {}

        def visit(message, prefix):
            for field in message.field:
                out[f"{prefix}{message.name}.{field.name}"] = (field.number, field.type, field.type_name)
            for nested in message.nested_type:
                visit(nested, f"{prefix}{message.name}.")

        for message in proto.message_type:
            visit(message, f"{proto.package}.")
        return out

    ours = {k: v for blob in _wire.FILES.values() for k, v in fields(blob).items()}
    installed = {k: v for blob in theirs.values() for k, v in fields(blob).items()}
    changed = {k: (v, installed.get(k)) for k, v in ours.items() if installed.get(k, v) != v}
    assert changed == {}, f"jaxlib {jaxlib.__version__} redefines these protocol fields: {changed}"
    gone = sorted(k for k in ours if k not in installed and ".ifrt_proxy." in k)
    assert len(gone) < 20, f"jaxlib {jaxlib.__version__} drops protocol fields: {gone}"


def test_the_version_rule_takes_the_highest_shared_version_and_refuses_with_both_ranges():
    from elastic_dew.proxy import protocol

    assert protocol.choose_version(16, 25) == 25
    assert protocol.choose_version(10, 20) == 20
    with pytest.raises(protocol.ProtocolMismatch, match=r"speaks IFRT proxy protocol versions 16-25 .*offers 26-30"):
        protocol.choose_version(26, 30)


def test_the_step_rule_at_the_backend_takes_as_carried_state_only_the_arguments_a_program_made_itself():
    """An eager op fed its own earlier result (jax 0.12's ``random.normal`` runs ``multiply``
    twice during a model's initialisation; an eager counter ``x + 1``) is JAX's dispatch, not the
    loop's step; the step function, whose whole state comes back to it, is, counted from its
    first dispatch."""
    from elastic_dew.simulate.step_count import StepCount

    count = StepCount()
    state = 57608
    init = []
    for _ in range(6):  # each weight: x * scalar, erf_inv, scalar-of-the-first * the result
        init.append(count.chained("jit_multiply", 8, 4, 0))
        init.append(count.chained("jit_multiply", 16388, 16384, 4))
    assert init == [None] * 12
    assert count.chained("jit_update_step", state + 124, state, 0) is None  # the initial state: not yet known
    assert [count.chained("jit_update_step", state + 124, state, state) for _ in range(3)] == [2, 3, 4]
    assert [count.chained("jit_add", 8, 4, 4 if n else 0) for n in range(4)] == [None] * 4  # an eager x + 1
    assert count.chained("jit_multiply", 16388, 16384, 4) is None


def test_the_step_rule_has_no_byte_threshold_a_loop_carrying_two_float32_scalars_falls_under():
    """A loop whose whole state is two float32 scalars (8 bytes) has steps through either
    boundary's evidence: chaining its own results at the backend, its own frame in-process."""
    from elastic_dew.simulate.step_count import StepCount

    at_backend = StepCount()
    assert [at_backend.chained("jit_train_step", 8 + 4, 8, 8 if n else 0) for n in range(4)] == [None, 2, 3, 4]
    in_process = StepCount()
    assert [in_process.count("train_step", 8) for _ in range(3)] == [1, 2, 3]
    named = StepCount("train_step")
    assert [named.chained("jit_train_step", 8, 8, 0), named.count("train_step", 0)] == [1, 2]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from elastic_dew.proxy import LocalPathways

    log = tmp_path_factory.mktemp("proxy") / "server.log"
    with LocalPathways(slices=2, devices_per_slice=4, log=log) as server:
        yield server


@pytest.mark.slow
def test_a_jax_program_sees_the_slices_and_computes_through_the_proxy(backend):
    checks, done = _client(backend, "basics")
    assert done.returncode == 0, done.stderr[-3000:]
    assert checks["devices"] == {"platform": "cpu", "ids": list(range(8)), "slices": [0, 0, 0, 0, 1, 1, 1, 1]}
    assert checks["device_put"] == {"value": list(range(8)), "device": 5}
    assert checks["jit"]["value"] == [2 * v + 1 for v in range(8)]
    assert checks["spmd"]["value"] == checks["spmd"]["expected"]
    assert checks["spmd"]["shards"] == [2] * 8  # 8 results split 4 ways, each twice (data axis)
    assert checks["pinned_host"]["kind"] == "pinned_host"
    assert checks["pinned_host"]["value"] == checks["pinned_host"]["expected"]
    assert checks["bfloat16"]["value"] == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.slow
def test_a_lost_slice_fails_its_results_with_data_loss_on_read_and_a_restored_one_serves_again(backend):
    checks, done = _client(backend, "faults", f"127.0.0.1:{backend.port}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert checks["before"] == {"read": {"value": [1, 1, 1, 1]}, "active": [0, 1]}
    assert "dispatched" in checks
    lost = checks["lost"]
    assert lost["old"] == lost["later"] == {"error": "DATA_LOSS", "slice_down": True}
    assert lost["active"] == [0]  # pathwaysutils' own health check sees it
    assert lost["other"] == {"value": [1, 1]}
    restored = checks["restored"]
    assert restored["fresh"] == {"value": [2, 2, 2, 2]}
    assert restored["old"]["error"] == "DATA_LOSS"  # its data went with the slice
    assert restored["active"] == [0, 1]


def _next_check(lines: queue.Queue, process, name: str) -> dict:
    """The client's next JSON line, which must be check ``name`` (bounded: 120 s without one)."""
    try:
        line = json.loads(lines.get(timeout=120))
    except queue.Empty:
        process.kill()
        raise AssertionError(f"the client printed no {name!r} check in 120 s: {process.stderr.read()[-3000:]}")
    assert line.pop("check") == name, line
    return line


@pytest.mark.slow
def test_lose_slice_fails_what_the_slice_holds_and_makes_with_data_loss_and_restore_slice_serves_it_again(backend):
    """A running program, and the slice lost and given back by the backend's own methods."""
    client = subprocess.Popen([sys.executable, str(PROGRAMS / "proxy_client.py"), "paced"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **backend.client_env(10)})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in client.stdout if line.startswith("{")],
                     daemon=True).start()
    try:
        assert _next_check(lines, client, "before") == {"active": [0, 1]}
        status = backend.lose_slice(1)
        assert status["lost"] == [1] and status["events"][-1] == ["lose", 1]  # its status after the loss
        client.stdin.write("lost\n")
        client.stdin.flush()
        lost = _next_check(lines, client, "lost")
        data_loss = {"error": "DATA_LOSS", "slice_down": True}
        assert lost == {"held": data_loss, "later": data_loss, "other": {"value": [2, 2]}, "active": [0]}
        status = backend.restore_slice(1)
        assert status["lost"] == [] and status["events"][-1] == ["restore", 1]
        client.stdin.write("restored\n")
        client.stdin.flush()
        restored = _next_check(lines, client, "restored")
        assert restored == {"fresh": {"value": [2, 2, 2, 2]}, "held": data_loss, "active": [0, 1]}
        client.stdin.close()
        assert client.wait(60) == 0, client.stderr.read()[-3000:]
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()
        client.stdout.close()
        client.stderr.close()


@pytest.mark.parametrize("index", [2, -1, "1", 1.0, True])
def test_lose_slice_and_restore_slice_refuse_a_slice_the_backend_does_not_have_naming_the_valid_ones(index):
    from elastic_dew.proxy import LocalPathways

    backend = LocalPathways(slices=2, devices_per_slice=1)  # refused before anything is sent
    for method in (backend.lose_slice, backend.restore_slice):
        with pytest.raises(ValueError, match=r"does not exist: this backend has slices 0\.\.1"):
            method(index)


@pytest.mark.slow
def test_lose_slice_and_restore_slice_raise_runtime_error_before_start_after_stop_and_once_the_server_died(tmp_path):
    from elastic_dew.proxy import LocalPathways

    backend = LocalPathways(slices=2, devices_per_slice=1, log=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="not running: start"):
        backend.lose_slice(1)
    backend.start()
    try:
        assert backend.lose_slice(1)["lost"] == [1]
        os.kill(backend.pid, signal.SIGKILL)
        assert backend._process.wait(30) == -signal.SIGKILL  # the server's end, awaited (the test's own child)
        for method in (backend.lose_slice, backend.restore_slice):
            with pytest.raises(RuntimeError, match=f"not running: its server exited with status -9 .*{tmp_path.name}"):
                method(1)
    finally:
        backend.stop()
    with pytest.raises(RuntimeError, match="not running: start"):
        backend.restore_slice(1)


@pytest.mark.slow
def test_a_client_whose_protocol_the_server_does_not_speak_gets_one_clear_refusal_not_an_abort(tmp_path):
    """The server answers the version request with the refusal (no version it cannot keep,
    which the client would abort on); the program raises it as a RuntimeError."""
    from elastic_dew.proxy import client_env
    from elastic_dew.proxy.serve import READY

    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from elastic_dew.proxy import protocol; protocol._SPOKEN[:] = [40, 41]; "
                               "from elastic_dew.proxy.serve import main; sys.exit(main(sys.argv[1:]))",
         "--slices", "1", "--devices-per-slice", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith(READY), server.stderr.read()
        env = {**os.environ, **client_env(f"grpc://127.0.0.1:{line[len(READY):].strip()}", connection_timeout_s=2)}
        done = subprocess.run([sys.executable, str(PROGRAMS / "proxy_client.py"), "basics"], capture_output=True,
                              text=True, timeout=120, env=env)
    finally:
        server.terminate()
        server.wait(10)
        server.stdout.close()
        server.stderr.close()
    assert done.returncode == 1, done.stderr[-2000:]  # an exception, not SIGABRT (-6)
    refusal = [line for line in done.stderr.splitlines() if line.startswith("RuntimeError")]
    assert len(refusal) == 1
    assert "elastic-dew proxy speaks IFRT proxy protocol versions 40-41" in refusal[0]
    assert "this client offers 16-25" in refusal[0] or "this client offers" in refusal[0]


def _simulate_each(tmp_path, boundaries, *program, schedule="lose:1@4,restore:1@8"):
    """``elastic-dew simulate --boundary BOUNDARY`` of ``program`` for each of ``boundaries``,
    side by side (separate processes, run directories and reports): for each, in order, its
    verdict (JSON), stdout and stderr."""
    runs = []
    for boundary in boundaries:
        out, err = (open(tmp_path / f"{boundary}.{name}", "w+") for name in ("out", "err"))
        runs.append((boundary, out, err, subprocess.Popen(
            [sys.executable, "-m", "elastic_dew", "simulate", "--boundary", boundary, "--slices", "2",
             "--devices-per-slice", "2", "--schedule", schedule, "--report", str(tmp_path / f"{boundary}.json"),
             "--run-dir", str(tmp_path / boundary), "--", sys.executable, *program],
            stdout=out, stderr=err, text=True, cwd=PROGRAMS)))
    results = []
    for boundary, out, err, process in runs:
        try:
            process.wait(timeout=300)
        finally:
            if process.poll() is None:
                process.kill()
        texts = []
        for stream in (out, err):
            stream.seek(0)
            texts.append(stream.read())
            stream.close()
        report = tmp_path / f"{boundary}.json"
        assert report.exists(), texts[1][-3000:]
        results.append((json.loads(report.read_text()), *texts))
    return results


def _simulate(tmp_path, boundary, *program, schedule="lose:1@4,restore:1@8"):
    """``elastic-dew simulate --boundary BOUNDARY`` of ``program``: its verdict (JSON), stdout, stderr."""
    return _simulate_each(tmp_path, [boundary], *program, schedule=schedule)[0]


@pytest.mark.slow
def test_simulate_through_the_proxy_gives_pathwaysutils_own_workload_the_in_process_verdict(tmp_path):
    """The unmodified workload (``pathwaysutils.initialize()`` first) meets the loss as
    ``DATA_LOSS`` from jaxlib's proxy client, retries on the smaller mesh from its snapshot and
    takes the slice up again: the verdict is the in-process simulator's, in every property
    the differential test compares for the corpus (``tests/test_proxy_differential.py``, which
    leaves this workload to this test)."""
    # the Manager's monitor polls every 0.1 s: the 8 steps after the restore take 0.3-0.8 s
    # here, and at 0.5 s a fast run could end before the monitor found the slice back
    program = (str(PROGRAMS / "pathways_initialized.py"), "16", "1", "0.1")
    both = _simulate_each(tmp_path, ["proxy", "in-process"], *program)  # side by side, as the differential test runs
    (proxy, proxy_out, proxy_err), (inside, inside_out, _) = both
    assert proxy["ok"] and inside["ok"], proxy_err[-3000:]
    assert_boundaries_agree(proxy, inside, correct=True)
    assert proxy["unmet"] == [] and inside["unmet"] == []  # the program met the loss, as DATA_LOSS
    assert [p["attempts"] for p in proxy["processes"]] == [p["attempts"] for p in inside["processes"]] \
        == [[[0, 1], [0], [0, 1]]]
    assert [(f["scheduled"], f["step"]) for f in proxy["fired"]] == [(f["scheduled"], f["step"]) for f in inside["fired"]] \
        == [("lose:1@4/step", 4), ("restore:1@8/step", 8)]
    assert "DATA_LOSS: the array's data was on slice 1, which is lost" in proxy_err
    assert "Elastic event detected" in proxy_err

    def slices(out):
        return [(int(line.split()[1]), int(line.split()[3])) for line in out.splitlines() if line.startswith("step ")]

    # the loss comes after the 4th dispatch, before its result is read: the retry goes on on
    # one slice from the newest snapshot the program's Snapshotter had finished, step 3's (or
    # step 2's when step 3's asynchronous copy was still running at the loss: the program's own
    # timing, on either side); when the Manager's own monitor (polling every 0.1 s) finds the
    # slice back is its own timing too
    for out in (proxy_out, inside_out):
        ran = slices(out)
        assert ran[:3] == [(1, 2), (2, 2), (3, 2)], ran
        resumed = ran[3][0]
        assert ran[3:5] == [(resumed, 1), (resumed + 1, 1)] and resumed in (3, 4), ran
    assert slices(proxy_out)[-1] == slices(inside_out)[-1] == (16, 2)


@pytest.mark.slow
def test_a_loss_through_the_proxy_that_the_program_never_meets_fails_the_verdict_by_name(tmp_path):
    """A program on slice 0 alone: slice 1's loss fires at its step, but no request of the
    program is answered DATA_LOSS, so the fault tested nothing and the verdict says so."""
    verdict, out, err = _simulate(tmp_path, "proxy", str(PROGRAMS / "one_slice.py"), "8", schedule="lose:1@3")
    assert "done" in out.splitlines()  # the program itself ends well
    assert [f["scheduled"] for f in verdict["fired"]] == ["lose:1@3/step"] and verdict["never_fired"] == []
    assert verdict["unmet"] == ["lose:1@3/step"] and not verdict["ok"] and verdict["exit"] == 1
    assert "NEVER MET lose:1@3/step" in err


@pytest.mark.slow
def test_an_error_through_the_proxy_fails_the_step_as_a_runtime_error_that_is_not_retried(tmp_path):
    """The proxy boundary serves every action of the grammar: an ``error`` fails the request
    that dispatched the step with ``INVALID_ARGUMENT``, which pathwaysutils does not count as a
    slice loss, so the program ends with it, as in-process."""
    program = (str(PROGRAMS / "pathways_initialized.py"), "8", "1", "0.1")
    verdict, out, err = _simulate(tmp_path, "proxy", *program, schedule="error@3")
    assert [(f["scheduled"], f["step"]) for f in verdict["fired"]] == [("error@3/step", 3)]
    assert "INVALID_ARGUMENT: simulated runtime error error@3/step" in err
    assert [p["status"] for p in verdict["processes"]] == [1] and not verdict["ok"]
    assert "done" not in out.splitlines()
