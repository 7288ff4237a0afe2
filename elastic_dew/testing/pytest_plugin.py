"""A pytest plugin for simulated slice-failure tests of your own elastic code.

Registered through the ``pytest11`` entry point, so it loads in every pytest run where
elastic-dew is installed; it does nothing until asked (no option, no marker: no effect, and
JAX is not imported at load).

* **Devices before JAX starts.** ``--simulated-devices N`` (or ``simulated_devices = N`` in
  the pytest configuration) sets ``JAX_PLATFORMS=cpu`` and
  ``--xla_force_host_platform_device_count=N`` as pytest starts, before any ``conftest.py``
  or test module is imported. Without it, the devices the ``slices`` markers need are set
  once the tests are collected, if JAX's backend has not started by then. A backend that
  already started with too few devices is a clear error at the first simulated test.
* **The ``slices`` marker and the ``simulated_slices`` fixture.**
  ``@pytest.mark.slices(slices, devices_per_slice, schedule="lose:1@7,restore:1@+2",
  step_function=None, allow_unfired=False, allow=())`` configures the fixture, which yields an entered
  :class:`elastic_dew.simulate.SimulatedSlices` whose fault log is ``faults.jsonl`` in the
  test's ``tmp_path``. A fault of the schedule that never fired fails a test that passed
  (in its teardown; unless ``allow_unfired``), so a test of a loop the schedule never
  reached cannot pass.
* **The program's mistakes fail the test.** A test that passed fails in its teardown when
  the simulator's diagnosis of what the code under test did names a problem
  (:data:`elastic_dew.simulate.PROBLEMS`: ``restored_nothing``, ``held_across_attempts``,
  ``mesh_on_lost_slice``, ...), with each problem, its fix and the costs of every fault;
  ``allow=("KIND", ...)`` accepts those kinds, as ``elastic-dew simulate --allow`` does. Too few host devices fails the test naming ``--simulated-devices``.
* **What happened, on failure.** A failed simulated test's report has a ``simulated slices``
  section: the schedule, each fault log line, the faults that never fired and the slices of
  every ``elastic_retry`` attempt.

Each test gets its own simulator; the one before it has exited (one is active at a time).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["DEVICE_FLAG", "set_host_devices"]

#: The XLA flag that sets how many CPU devices the host has.
DEVICE_FLAG = "--xla_force_host_platform_device_count"
_KEY = pytest.StashKey["Any"]()
_FAILED = pytest.StashKey[bool]()


def set_host_devices(count: int) -> None:
    """Give JAX ``count`` host CPU devices when its backend starts (``JAX_PLATFORMS=cpu``,
    ``XLA_FLAGS``); an existing device-count flag is replaced. Raises ``ValueError`` for a
    count below 1.

    Args:
        count: the host CPU devices JAX will have.

    Raises:
        ValueError: ``count`` is below 1.
    """
    if count < 1:
        raise ValueError(f"--simulated-devices={count} must be a whole number >= 1")
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_FLAG}={count}"])


def _backend_started() -> bool:
    from elastic_dew.runtime.backend import _backend_started as started

    return started()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("elastic_dew", "simulated TPU slices (elastic_dew.simulate)")
    group.addoption("--simulated-devices", type=int, default=None, metavar="N",
                    help="give JAX N host CPU devices before it starts (for the slices marker)")
    parser.addini("simulated_devices", "host CPU devices for simulated slices, set before JAX starts",
                  default="")


def _requested(config: pytest.Config, value: int | None = None) -> int | None:
    if value is None:
        value = config.getoption("--simulated-devices", default=None)
    if value is None and config.getini("simulated_devices"):
        text = str(config.getini("simulated_devices")).strip()
        if not text.isdigit():
            raise pytest.UsageError(f"simulated_devices = {text!r} must be a whole number >= 1")
        value = int(text)
    return value


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Set the devices before any conftest or test module can start JAX."""
    known = getattr(early_config.known_args_namespace, "simulated_devices", None)
    count = _requested(early_config, known)
    if count is not None:
        set_host_devices(count)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slices(slices, devices_per_slice, schedule=None, step_function=None, allow_unfired=False, allow=()): "
        "run the test's simulated_slices fixture on these simulated slices under this schedule",
    )
    count = _requested(config)
    if count is not None and not _backend_started():
        set_host_devices(count)


def _shape(marker: pytest.Mark | None) -> dict[str, Any]:
    args = dict(zip(("slices", "devices_per_slice"), marker.args if marker else ()))
    given = dict(marker.kwargs) if marker else {}
    options = {**{"slices": 2, "devices_per_slice": 2}, **args, **given}
    unknown = set(options) - {"slices", "devices_per_slice", "schedule", "step_function", "allow_unfired", "allow"}
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.slices got unknown options {sorted(unknown)}")
    return options


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without an explicit count, give JAX the devices the largest ``slices`` marker needs."""
    if _requested(config) is not None:
        return
    needed = [
        options["slices"] * options["devices_per_slice"]
        for item in items
        if "simulated_slices" in getattr(item, "fixturenames", ())
        for options in [_shape(item.get_closest_marker("slices"))]
    ]
    if needed and not _backend_started():
        flags = os.environ.get("XLA_FLAGS", "")
        if DEVICE_FLAG not in flags or os.environ.get("JAX_PLATFORMS") != "cpu":
            set_host_devices(max(needed))


@pytest.fixture
def simulated_slices(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An entered :class:`~elastic_dew.simulate.SimulatedSlices`, shaped by the ``slices`` marker."""
    from elastic_dew.simulate import SimulatedSlices
    from elastic_dew.simulate.diagnosis import check_allowed

    options = _shape(request.node.get_closest_marker("slices"))
    allow_unfired = bool(options.pop("allow_unfired", False))
    allow = options.pop("allow", ())
    allow = (allow,) if isinstance(allow, str) else tuple(allow)
    try:
        check_allowed(allow)
    except ValueError as error:
        raise pytest.UsageError(f"@pytest.mark.slices(allow=...): {error}") from None
    sim = SimulatedSlices(
        options["slices"], options["devices_per_slice"], schedule=options.get("schedule"),
        fault_log=tmp_path / "faults.jsonl", step_function=options.get("step_function"),
    )
    request.node.stash[_KEY] = sim
    try:
        sim.__enter__()
    except RuntimeError as error:
        needed = options["slices"] * options["devices_per_slice"]
        pytest.fail(f"{error}. With this plugin: pytest --simulated-devices {needed} (or simulated_devices = "
                    f"{needed} in the pytest configuration) sets them before JAX starts", pytrace=False)
    yield sim  # pytest never throws the test's failure in here: the exit is a normal one
    sim.__exit__(None, None, None)
    if sim.unfired and not allow_unfired and not request.node.stash.get(_FAILED, False):
        pytest.fail(
            f"scheduled faults never fired: {[str(f) for f in sim.unfired]} after {sim.steps} counted "
            f"steps ({_report(sim)}); the loop never reached them. Key them to an earlier step, or "
            "pass allow_unfired=True to the slices marker",
            pytrace=False,
        )
    if request.node.stash.get(_FAILED, False):
        return
    found = sim.diagnose(allow)
    if found.defects:
        lines = "\n".join(found.lines())
        pytest.fail(f"the simulator named problems of the code under test ({', '.join(p.kind for p in found.defects)}):"
                    f"\n{lines}\naccept a kind with allow=(\"KIND\",) in the slices marker", pytrace=False)


def _report(sim: Any) -> str:
    lines = [f"schedule: {sim.schedule or 'none'}", f"counted steps: {sim.steps}"]
    if sim.fault_log is not None and Path(sim.fault_log).exists():
        lines += ["fault log:", *("  " + line for line in Path(sim.fault_log).read_text().splitlines())]
    lines.append(f"never fired: {[str(f) for f in sim.unfired] or 'none'}")
    lines.append("attempts (active slices): " + (", ".join(map(str, sim.attempts)) or "none"))
    lines += ["diagnosis:", *sim.diagnose().lines()]
    return "\n".join(lines)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed  # a failed test is not failed again for its faults
    sim = item.stash.get(_KEY, None)
    if sim is not None and report.failed:
        report.sections.append(("simulated slices", _report(sim)))
