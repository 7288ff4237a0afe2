"""A process that runs many trainings: each run leaves nothing behind.

Simulator users (and this project's own chaos soak) run hundreds of trainings in one
process. Every run starts threads and resources: Orbax's Snapshotter worker, an Orbax
``CheckpointManager``, Grain's read-ahead, pathwaysutils' slice monitor, the step-deadline
reader, the precompiling thread, the SIGTERM handler of a ``PreemptionNotice``. Whether
:meth:`ElasticRun.run` returns, raises ``Preempted`` or gives up with
``ElasticRuntimeError``, all of them must be stopped and joined, so the process's threads
stay flat and its memory bounded however many runs it does.

Sized for CI: :data:`RUNS` short runs (two steps each on 4 simulated slices of 2 CPU
devices, one compiled step shared by all of them), every tenth with in-memory snapshots
and a real Orbax checkpoint directory, one in seven preempted by a real SIGTERM and one in
eleven losing a slice with ``max_attempts=1``. The memory bound is
:data:`MB_PER_RUN` a run over the runs after the warm-up, plus 8 MB: a leak of the size
found (~0.8 MB a run) exceeds it four times over (the runs alone, in a fresh process with
two malloc arenas and their garbage collected after each, add 1.5 to 6 MB);
``benchmarks/soak.py`` runs a thousand schedules for the long form. Each run with snapshots
once left Orbax's worker thread behind for good.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pathwaysutils.elastic.manager import ElasticRuntimeError

from elastic_dew.elastic.config import ElasticConfig
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.runtime import Preempted, PreemptionNotice
from elastic_dew.simulate import SimulatedSlices

from linear import LinearProgram, dataset

RUNS = 100
#: Runs before the baseline is taken: JAX, Orbax and Grain start their process-wide pools.
WARM_UP = 12
#: Resident memory a run may add for good, on average (the leak found was ~0.8 MB a run).
MB_PER_RUN = 0.1


class _SharedProgram(LinearProgram):
    """The linear program with its compiled steps kept across runs (per devices and batch),
    so that the runs cost their own machinery, not XLA compiles."""

    def __init__(self) -> None:
        self._compiled: dict = {}

    def compile(self, mesh, global_batch):
        key = (tuple(d.id for d in mesh.devices.flat), global_batch)
        if key not in self._compiled:
            self._compiled[key] = super().compile(mesh, global_batch)
        return self._compiled[key]


def _left_behind(before: set[int]) -> list[str]:
    """The threads started since ``before`` (idents) that are still alive after a moment.

    Grain's ``close`` shuts its read-ahead pool down without waiting (the read in hand
    finishes first), so a closed iterator's thread may take a moment to end; a thread
    left behind never does.
    """
    for thread in threading.enumerate():
        if thread.ident not in before:
            thread.join(timeout=5)
    return sorted(t.name for t in threading.enumerate() if t.ident not in before)


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _one_run(number: int, program, data, workdir) -> str:
    """One short training; what ended it."""
    heavy = number % 10 == 0
    lose = number % 11 == 5
    preempt = number % 7 == 3
    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, timeout=10, global_batch=24,
        max_attempts=1 if lose else 10,
        snapshot_every=1 if heavy else 0, checkpoint_every=1 if heavy else 0,
        checkpoint_dir=str(workdir / f"run-{number}") if heavy or preempt else None,
    )
    schedule = "lose:1@2" if lose else None
    with SimulatedSlices(4, 2, schedule=schedule), PreemptionNotice() as notice:
        run = ElasticRun(program, ElasticData(data), config, notice=notice)
        if preempt:
            os.kill(os.getpid(), signal.SIGTERM)  # noted by the notice: the run stops at step 1
        try:
            run.run(2)
        except Preempted:
            return "preempted"
        except ElasticRuntimeError:
            return "gave up"
    return "done"


def _hundred_runs(workdir: Path) -> dict:
    """:data:`RUNS` runs in this process: what ended them, the threads left behind, whether
    SIGTERM's handler is the one before, and how much resident memory the runs after the
    warm-up added (MB)."""
    program, data = _SharedProgram(), dataset(512)
    handler = signal.getsignal(signal.SIGTERM)
    endings = [_one_run(n, program, data, workdir) for n in range(WARM_UP)]
    gc.collect()
    threads_before = {t.ident for t in threading.enumerate()}
    rss_before = _rss_mb()
    for number in range(WARM_UP, RUNS):
        endings.append(_one_run(number, program, data, workdir))
        # A run's objects form reference cycles; collected only now and then, the garbage of
        # many runs at once fragments the heap (resident memory no object holds). Collected
        # after each run, what stays is what the runs hold for good.
        gc.collect()
    left = _left_behind(threads_before)
    return {"endings": endings, "left": left, "handler_kept": signal.getsignal(signal.SIGTERM) == handler,
            "grown": _rss_mb() - rss_before}


@pytest.mark.slow
def test_a_hundred_runs_that_return_preempt_or_give_up_leave_flat_threads_and_bounded_memory(tmp_path):
    """In a process of their own, so that the memory measured is the runs' own and not what
    earlier tests left; with glibc's malloc arenas capped at two (``MALLOC_ARENA_MAX``, as
    long-running multi-threaded servers set it): each run starts and joins threads, and
    without the cap a new thread's arena adds resident memory that no object holds."""
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], env=dict(os.environ, MALLOC_ARENA_MAX="2"),
                          capture_output=True, text=True, timeout=240, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.splitlines()[-1])
    endings, left, grown = runs["endings"], runs["left"], runs["grown"]
    assert {"done", "preempted", "gave up"} <= set(endings), endings
    assert not left, f"{len(left)} threads left behind by {RUNS - WARM_UP} runs: {left}"
    assert runs["handler_kept"]
    assert grown <= MB_PER_RUN * (RUNS - WARM_UP) + 8, f"resident memory grew {grown:.1f} MB over {RUNS - WARM_UP} runs"


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_a_run_stops_every_thread_it_started_whether_it_returns_or_raises(ending, tmp_path):
    """The precise form of the property above, on one run with every tier: the threads
    alive after it are exactly those alive before it."""
    program, data = _SharedProgram(), dataset(512)
    _one_run(10, program, data, tmp_path / "warm")  # process-wide pools start here
    before = {t.ident for t in threading.enumerate()}
    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, timeout=10, global_batch=24, max_attempts=1,
        snapshot_every=1, checkpoint_every=1, checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    with SimulatedSlices(4, 2, schedule="lose:1@3" if ending == "raises" else None):
        run = ElasticRun(program, ElasticData(data), config)
        if ending == "raises":
            with pytest.raises(ElasticRuntimeError):
                run.run(4)
        else:
            run.run(4)
    assert not _left_behind(before)


if __name__ == "__main__":  # the hundred runs' own process: argv[1] is its working directory
    print(json.dumps(_hundred_runs(Path(sys.argv[1]))))
