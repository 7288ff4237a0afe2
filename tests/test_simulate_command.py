"""``elastic-dew simulate -- COMMAND``: programs nobody here wrote, run unmodified on simulated
slices, restarted after a preemption with the same fault log, with one verdict at the end.

Every test runs the real command (``python -m elastic_dew simulate``) in a subprocess, as a
user would, so exit statuses and signals are real. TPU slices cannot exist here: the
simulator stands in for them on CPU devices. The programs: ``tests/programs/
simple_model_elastic.py`` (pathwaysutils' own ``extras.simple_model`` workload under
pathwaysutils' ``elastic_retry``, with pathwaysutils' default poll interval), the example of
``docs/your-own-loop.md`` as its page gives it for a real cluster (``SIMULATE = False``), and
a small program in each of the three forms of COMMAND.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from pathwaysutils.extras.simple_model import data as data_lib

from conftest import REPO
from programs.simple_model_elastic import CONFIG

pytestmark = pytest.mark.slow

PROGRAMS = REPO / "tests" / "programs"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])  # `python` is this one
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory) -> dict[str, str]:
    """JAX's persistent compilation cache, shared by this module's programs (as trainers on a
    cluster share one): a restarted process loads what its first process compiled."""
    return {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache")),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _simulate(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "elastic_dew", "simulate", "--run-dir", str(tmp_path / "run"),
         "--report", str(report), *args],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env or _env(),
    )
    verdict = json.loads(report.read_text()) if report.exists() else None
    return proc, verdict


def _explain(proc) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def test_the_three_forms_of_command_run_with_their_argv_main_and_exit_status_and_an_unfired_fault_fails(tmp_path):
    package = tmp_path / "src" / "mytrainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(textwrap.dedent("""
        import sys
        import jax

        def main():
            device = jax.devices()[0]
            print("ran", __name__, sys.argv[1:], len(jax.devices()), device.slice_index, flush=True)
            return int(sys.argv[1])

        if __name__ == "__main__":
            sys.exit(main())
    """))
    script = tmp_path / "train.py"
    script.write_text((package / "train.py").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    console = bin_dir / "my-trainer"  # what pip writes for a console_scripts entry point
    console.write_text(f"#!{sys.executable}\nimport re\nimport sys\nfrom mytrainer.train import main\n"
                       "if __name__ == '__main__':\n"
                       "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                       "    sys.exit(main())\n")
    console.chmod(0o755)
    env = _env(PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path / "src")]))
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    forms = {  # form: (command, its exit status, its __name__, a schedule)
        "module": (["python", "-m", "mytrainer.train", "0", "--lr=1"], 0, "__main__", ""),
        "script": (["python", str(script), "3", "x"], 3, "__main__", ""),
        # A program that dispatches no step never reaches lose:1@5: the verdict fails.
        "console script": (["my-trainer", "0"], 0, "mytrainer.train", "lose:1@5"),
    }
    for form, (command, status, name, schedule) in forms.items():
        run = tmp_path / form.replace(" ", "_")
        run.mkdir()
        proc, verdict = _simulate(run, "--slices", "2", "--devices-per-slice", "3", "--schedule", schedule,
                                  "--", *command, env=env)
        args = command[command.index(str(status)):] if form != "module" else ["0", "--lr=1"]
        assert f"ran {name} {args!r} 6 0" in proc.stdout, f"{form}: {_explain(proc)}"
        assert [p["status"] for p in verdict["processes"]] == [status]
        if schedule:
            assert proc.returncode == verdict["exit"] == 1 and not verdict["ok"], f"{form}: {_explain(proc)}"
            assert verdict["never_fired"] == ["lose:1@5/step"] and "NEVER FIRED lose:1@5/step" in proc.stderr
        else:
            assert proc.returncode == verdict["exit"] == status, f"{form}: {_explain(proc)}"


def test_a_command_that_is_not_a_python_program_is_refused_before_anything_runs(tmp_path):
    proc, verdict = _simulate(tmp_path, "--", "ls", "-l")
    assert proc.returncode == 2 and verdict is None
    assert "is not a Python program" in proc.stderr and "python -m MODULE" in proc.stderr
    assert not (tmp_path / "run").exists()


def _rows(lines: list[str]) -> list[list[int]]:
    """Each committed step's rows (CRC-32s), from the program's ``step N on S slices`` lines:
    a re-done step replaces its lineage, as elastic_retry's resume from a snapshot does."""
    kept: list[tuple[int, list[int]]] = []
    for line in lines:
        match = re.match(r"step (\d+) on \d+ slices: rows ([\d,]+)$", line)
        if match:
            step = int(match.group(1))
            kept = [entry for entry in kept if entry[0] < step]
            kept.append((step, [int(c) for c in match.group(2).split(",")]))
    assert [step for step, _ in kept] == list(range(1, len(kept) + 1))
    return [rows for _, rows in kept]


def _assert_each_example_once(stdout: str, steps: int) -> None:
    rows = [crc for step_rows in _rows(stdout.splitlines()) for crc in step_rows]
    assert len(_rows(stdout.splitlines())) == steps
    source = data_lib.create_token_dataset(CONFIG)
    assert rows == [zlib.crc32(np.asarray(source[i]).tobytes()) for i in range(len(rows))]


@pytest.mark.libraries
def test_pathwaysutils_simple_model_waits_out_a_hang_declared_dead_until_the_slice_returns_and_a_preemption(
        tmp_path, compilation_cache):
    # The program needs every slice (``all``) and passes elastic_retry no poll interval
    # (pathwaysutils polls every 10 s). Steps are the workload's compiled step dispatches,
    # counted across attempts (docs/simulator.md): the hang at step 3, declared dead 3 s
    # later, the slice back 1 s after that (step 3 again is the fourth dispatch), the
    # preemption at the fifth (step 4).
    schedule = "hang:1@3,lose:1@+3,restore:1@+1,preempt@5"
    proc, verdict = _simulate(tmp_path, "--slices", "2", "--devices-per-slice", "2", "--schedule", schedule,
                              "--", "python", str(PROGRAMS / "simple_model_elastic.py"), "4", "all",
                              env=_env(**compilation_cache))
    assert proc.returncode == 0, _explain(proc)
    assert [p["status"] for p in verdict["processes"]] == [-15, 0]  # SIGTERM ended it; restarted
    assert [p["attempts"] for p in verdict["processes"]] == [
        [[0, 1], [0, 1]],  # hung, declared dead, waited for: no attempt on the survivor alone
        [[0, 1]],  # the restarted process fires nothing again
    ]
    assert verdict["never_fired"] == [] and [f["scheduled"] for f in verdict["fired"]] == [
        "hang:1@3/step", "lose:1@+3/step", "restore:1@+1/step", "preempt@5/step"]
    assert verdict["problems"] == []  # it keeps no checkpoint: starting over after a preemption is its choice
    assert [(c["fault"], c["detected"], c["resumed_from"], c["part_of"]) for c in verdict["costs"]] == [
        ("hang:1@3/step", "clock", "snapshot", None), ("lose:1@+3/step", None, None, "hang:1@3/step"),
        ("restore:1@+1/step", None, "snapshot", None), ("preempt@5/step", "signal", "nothing", None)]
    hang, lose, restore = verdict["fired"][:3]
    assert 3 <= lose["wall"] - hang["wall"] < 4  # declared dead 3 s after the hang, not at a deadline
    # The wait for slices ends at the return, not at pathwaysutils' next 10 s poll.
    records = [json.loads(line) for line in (tmp_path / "run" / "attempts.jsonl").read_text().splitlines()]
    resumed = [r["wall"] for r in records if "active" in r][1]
    assert 0 <= resumed - restore["wall"] < 5
    first, second = proc.stdout.split("started\n")[1:]
    _assert_each_example_once(first, 3)  # up to the preemption, during step 4
    _assert_each_example_once(second, 4)


def test_the_own_loop_pages_example_runs_as_for_a_real_cluster_and_resumes_after_its_preemption(
        tmp_path, compilation_cache):
    page = (REPO / "docs" / "your-own-loop.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", page, re.S)
    assert "SIMULATE = True" in code
    program = tmp_path / "own_loop.py"
    program.write_text(code.replace("SIMULATE = True", "SIMULATE = False"))  # as on a real cluster
    proc, verdict = _simulate(tmp_path, "--schedule", "lose:3@8,restore:3@16,preempt@22",
                              "--", sys.executable, str(program), "own", env=_env(**compilation_cache))
    assert proc.returncode == 0, _explain(proc)
    assert [p["status"] for p in verdict["processes"]] == [143, 0]
    assert verdict["never_fired"] == [] and verdict["problems"] == []
    assert "done at step 30" in proc.stdout
    last: dict[int, tuple[int, int]] = {}
    for line in (tmp_path / "own" / "steps.txt").read_text().splitlines():
        step, begin, end, _ = line.split()
        last = {s: span for s, span in last.items() if s < int(step)}
        last[int(step)] = (int(begin), int(end))
    assert sorted(last) == list(range(1, 31))
    assert all(last[s][1] == last[s + 1][0] for s in range(1, 30)) and last[1][0] == 0
