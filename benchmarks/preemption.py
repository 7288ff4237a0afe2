"""Item 4: preemption: SIGTERM to a committed checkpoint to exit, for 64 MB, 256 MB and 1 GB.

Each run is a real subprocess (``benchmarks.worker preempt``, one CPU device) stepping an
:class:`ElasticRun` over a state of that size. Once it steps, the parent sends SIGTERM and
times until the process has exited; the run must exit 143 with the checkpoint of the agreed
step committed. Against the 30 s grace window of a Spot VM. The disk's write bandwidth is a
plain file of the same size written and ``fsync``-ed in the same directory, alternating
with the preemptions; ``save_bw_over_disk`` is the save's bandwidth (state bytes over the
protocol's own save time, which waits for the commit) over it, and
``preempt_over_disk_s_*`` is SIGTERM-to-exit less that write (the target: at most 1 s).

How fast a write fills the page cache depends on the memory it is given: on the 2-core VM
of ``docs/performance.md`` an fsync-ed 1 GB write takes about 0.7 s right after another
one (the pages just freed, still backed by the host) and 2.5 to 3.5 s after 5 to 10 s
without one (most likely the host has taken the freed memory back, and each page is faulted in again).
So every large write here, the plain one and the preemption's, starts ``preempt_idle_s``
after the last one ended: the worker holds its loop after step 2 until then (it reads a
line from stdin, which the parent sends after SIGTERM; the step in flight then has long
ended, as it would on an accelerator, where it runs beside the host's save instead of on
the same two cores). Each repeat's seconds are kept; beside the
target's figure (the median of the paired differences) is each side's fastest repeat.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, median, worker_command, worker_env
from elastic_dew.elastic.state.orbax_step import committed_checkpoint_steps
from elastic_dew.rundir import CHECKPOINTS_DIR

__all__ = ["measure", "disk_write_seconds"]

GRACE_S = 30.0


def disk_write_seconds(directory: Path, nbytes: int, *, keep: bool = False) -> float:
    """Write ``nbytes`` to a new file, ``disk-probe.bin`` in ``directory``, and fsync it; the
    file is removed afterwards unless ``keep``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "disk-probe.bin"
    chunk = os.urandom(2**20) * 16
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t
    if not keep:
        path.unlink()
    return elapsed


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def preempt_once(directory: Path, megabytes: int, not_before: float = 0.0) -> tuple[float, float, float]:
    """``(SIGTERM to exit seconds, the protocol's save seconds, time.monotonic() at the exit)``
    of one preempted run, SIGTERM sent once the worker steps and not before ``not_before``
    (a ``time.monotonic()`` value)."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "worker.log"
    with open(log, "w") as err:  # a file, not a pipe: a full pipe would stall the worker
        child = subprocess.Popen(
            worker_command("preempt", str(directory / CHECKPOINTS_DIR), str(megabytes)),
            cwd=REPO, env=worker_env(devices=1), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
        )
    save = None
    for line in child.stdout:
        if line.startswith("READY"):
            break
    else:
        child.wait()
        raise RuntimeError(f"preempt worker exited {child.returncode} before stepping: {log.read_text()[-2000:]}")
    _sleep_until(not_before)
    t = time.monotonic()
    child.send_signal(signal.SIGTERM)
    child.stdin.write("go\n")  # the worker's loop, held after step 2, goes on to the stop
    child.stdin.close()
    for line in child.stdout:
        if line.startswith("SAVE"):
            save = float(line.split()[1])
    code = child.wait(timeout=300)
    ended = time.monotonic()
    elapsed = ended - t
    if code != 143:
        raise RuntimeError(f"preempted worker exited {code}, not 143: {log.read_text()[-2000:]}")
    if not committed_checkpoint_steps(directory / CHECKPOINTS_DIR) or save is None:
        raise RuntimeError("preempted worker exited 143 without a committed checkpoint")
    return elapsed, save, ended


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for megabytes in sizes.preempt_mb:
        totals, saves, disks = [], [], []
        last = time.monotonic()  # the end of the last large write
        for repeat in range(sizes.preempt_repeats):
            directory = workdir / f"{megabytes}MB-{repeat}"
            # Each write starts at least preempt_idle_s after the last one ended (see the module).
            _sleep_until(last + sizes.preempt_idle_s)
            disks.append(disk_write_seconds(directory, megabytes * 2**20))
            total, save, last = preempt_once(directory, megabytes, not_before=time.monotonic() + sizes.preempt_idle_s)
            totals.append(total)
            saves.append(save)
            shutil.rmtree(directory, ignore_errors=True)
        results[f"preempt_save_s_{megabytes}MB"] = median(totals)
        results[f"preempt_checkpoint_s_{megabytes}MB"] = median(saves)
        results[f"disk_write_s_{megabytes}MB"] = median(disks)
        results[f"preempt_save_s_{megabytes}MB_all"] = [round(x, 3) for x in totals]
        results[f"disk_write_s_{megabytes}MB_all"] = [round(x, 3) for x in disks]
        # Each preemption less the disk write just before it, as the target reads; beside it,
        # the fastest of each (the disk's speed moves between writes whoever writes).
        results[f"preempt_over_disk_s_{megabytes}MB"] = median([t - d for t, d in zip(totals, disks, strict=True)])
        results[f"preempt_over_disk_s_{megabytes}MB_fastest"] = min(totals) - min(disks)
        results[f"save_bw_over_disk_{megabytes}MB"] = median(disks) / median(saves)
    largest = max(sizes.preempt_mb)
    results["save_bw_over_disk"] = results[f"save_bw_over_disk_{largest}MB"]
    results["preempt_grace_window_s"] = GRACE_S
    notes.append(
        "Preemption: SIGTERM to exit of a real subprocess (one CPU device), exit 143 and the "
        f"committed checkpoint checked; {sizes.preempt_repeats} repeat(s) per size. The "
        "checkpoint figure is the protocol's own save (wait for the commit); the rest of "
        "SIGTERM-to-exit is the read of the step the stop saves and the process's exit. "
        "preempt_over_disk_s is the median of each preemption less the fsync-ed write just before "
        "it; _fastest is the fastest preemption less the fastest write (the disk's own writes vary "
        "by more than the target from one to the next: see disk_write_s_*_all). "
        f"save_bw_over_disk is for the largest state ({largest} MB)."
    )
    return results
