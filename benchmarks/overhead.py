"""Item 7: the toolkit's own cost: ``Trainer.fit`` against a bare jitted loop.

Both train ``lm`` with the same step (the trainer's), the same data (the recipe's dataset,
batched by Grain in order, with the trainer's read-ahead options), the same shardings (the
trainer's default ``fsdp`` state: each large parameter and its moments split over a slice's
``data`` devices, replicated across the four slices; the batch split over ``(replica,
data)``) and the same lagged read (step N+1 is dispatched before step N's loss is read,
every step, as the protocol does), under :class:`SimulatedSlices` (both pay its read
checks). The bare loop takes its program from a ``Trainer`` built with the same arguments,
so its shardings are the trainer's own. ``Trainer.fit`` runs with no faults, snapshots off
and no periodic checkpoints. The figure is the steady step time (from step ``WARMUP`` to the
last, so compiling and the final checkpoint are outside it); each round runs both, which
first alternating between rounds, and the figure is the median of the rounds' ratios.

Beside the wall time, the host CPU time per step, which load on the machine does not move
the way it moves wall time: for the bare loop, the CPU time of its thread from one step's
read to the next (``time.thread_time``); for ``Trainer.fit``, the same on the loop's thread
(between consecutive step events) plus the CPU time of every thread elastic_dew starts (each
is named ``elastic-dew-*``: the step deadline's reader, the data reader, each bounded storage call's thread, the
snapshot worker, the checkpoint preparation, the precompilers) over the same interval, read
from each thread's CPU clock, a thread that ended within the interval included. XLA's compute
threads and Grain's read-ahead threads are counted in neither. The figure is the p50 over
the steady steps of ``fit``'s per-step CPU time less the p50 of the bare loop's, median over
rounds: the host CPU time elastic_dew adds to every step.
"""

from __future__ import annotations

import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from benchmarks.common import lm_label, median

__all__ = ["measure", "POLICY", "OwnThreads"]

WARMUP = 10
POLICY = "fsdp"
GLOBAL_BATCH = 48


def _config():
    from elastic_dew.elastic.config import ElasticConfig

    return ElasticConfig(
        minimum_slice_count=None, poll_interval=0.05, global_batch=GLOBAL_BATCH, snapshot_every=0,
        checkpoint_every=0,
    )


class OwnThreads:
    """CPU seconds used by the threads elastic_dew starts (named ``elastic-dew-*``) since the last call.

    At each call every live thread's CPU clock (``time.pthread_getcpuclockid``) is read; a
    thread seen for the first time counts from its start. A thread that ends between two
    calls (a bounded storage call's, started and ended within one step) is counted too:
    inside ``with OwnThreads() as own:``, every thread started there reads its own CPU clock
    as its ``run`` returns, and the next call adds what it used since its last reading.
    """

    PREFIX = "elastic-dew"

    def __init__(self) -> None:
        self._seen: dict[threading.Thread, float] = {}
        self._ended: list[tuple[threading.Thread, float]] = []
        self._gone: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._run: Any = None

    def __enter__(self) -> OwnThreads:
        run = self._run = threading.Thread.run
        ended, lock, prefix = self._ended, self._lock, self.PREFIX

        def counted(thread: threading.Thread) -> None:
            try:
                run(thread)
            finally:
                if thread.name.startswith(prefix):
                    with lock:
                        ended.append((thread, time.thread_time()))

        threading.Thread.run = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        threading.Thread.run = self._run  # type: ignore[method-assign]

    def __call__(self) -> float:
        used = 0.0
        with self._lock:
            ended = self._ended[:]
            self._ended.clear()
        for thread, total in ended:
            used += total - self._seen.pop(thread, 0.0)
            self._gone.add(thread)
        for thread in threading.enumerate():
            if not thread.name.startswith(self.PREFIX) or thread.ident is None or thread in self._gone:
                continue
            try:
                now = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except (OSError, ProcessLookupError):  # it ended between enumerate and the read
                continue
            used += now - self._seen.get(thread, 0.0)
            self._seen[thread] = now
        return used


def _steady(marks: dict[int, float], steps: int) -> list[float]:
    """Per-step differences of ``marks`` (a value at each step) over the steady steps."""
    return [marks[s + 1] - marks[s] for s in range(WARMUP, steps) if s in marks and s + 1 in marks]


def _bare(parts: dict, steps: int, workdir: Path) -> tuple[float, float]:
    import jax

    from elastic_dew import Trainer, TrainConfig
    from elastic_dew.elastic.loop.data import default_read_options
    from elastic_dew.elastic.slices.mesh import batch_sharding, mesh_of

    run_dir = Path(tempfile.mkdtemp(dir=workdir, prefix="bare-"))
    program = Trainer(**parts, config=_config(), run_dir=run_dir, train=TrainConfig(sharding=POLICY)).program
    mesh = mesh_of(jax.devices()[:8], 4)
    state = program.init_state(mesh)
    step_fn = program.compile(mesh, GLOBAL_BATCH)
    split = batch_sharding(mesh)
    # The trainer's read-ahead: Grain's default (500 batches) never refills in a run this
    # short, so the bare loop would skip the one read-ahead hand-off a step that ``fit`` pays.
    read_options = default_read_options()
    batches = iter(parts["dataset"].batch(GLOBAL_BATCH, drop_remainder=True).to_iter_dataset(read_options))
    started = None
    in_flight = None
    cpu: dict[int, float] = {}
    for step in range(1, steps + 1):
        state, metrics = step_fn(state, jax.device_put(next(batches), split))
        if in_flight is not None:
            float(in_flight["loss"])  # step - 1's loss, read once step is dispatched
            cpu[step - 1] = time.thread_time()
            if step - 1 == WARMUP:
                started = time.monotonic()
        in_flight = metrics
    float(in_flight["loss"])
    cpu[steps] = time.thread_time()
    return (time.monotonic() - started) / (steps - WARMUP), median(_steady(cpu, steps))


def _trainer(parts: dict, steps: int, workdir: Path) -> tuple[float, float, float]:
    from elastic_dew import Trainer, TrainConfig
    from elastic_dew.elastic.events import Step

    times: dict[int, float] = {}
    cpu: dict[int, float] = {}
    own: dict[int, float] = {}
    own_threads = OwnThreads()

    def progress(event) -> None:
        # It runs on the loop's thread, inside the measure: as cheap as a sink can be.
        if isinstance(event, Step):
            times[event.step] = time.monotonic()
            cpu[event.step] = time.thread_time()
            own[event.step] = own_threads() + own.get(event.step - 1, 0.0)

    run_dir = Path(tempfile.mkdtemp(dir=workdir, prefix="fit-"))
    with own_threads:
        Trainer(
            **parts, config=_config(), run_dir=run_dir, sinks=[progress],
            train=TrainConfig(log_every=10**9, sharding=POLICY),
        ).fit(steps)
    loop, threads = _steady(cpu, steps), _steady(own, steps)
    total = [a + b for a, b in zip(loop, threads)]
    return (times[steps] - times[WARMUP]) / (steps - WARMUP), median(total), median(threads)


def measure(sizes, workdir: Path, notes: list[str]) -> dict[str, Any]:
    import jax

    from benchmarks.worker import lm_parts
    from elastic_dew.simulate import SimulatedSlices

    parts = lm_parts(sizes.lm)
    workdir.mkdir(parents=True, exist_ok=True)
    fit, bare = [], []
    cpu_fit, cpu_bare, cpu_own = [], [], []
    def run_bare() -> None:
        wall, cpu = _bare(parts, sizes.overhead_steps, workdir)
        bare.append(wall)
        cpu_bare.append(cpu)

    def run_fit() -> None:
        wall, cpu, own = _trainer(parts, sizes.overhead_steps, workdir)
        fit.append(wall)
        cpu_fit.append(cpu)
        cpu_own.append(own)

    with SimulatedSlices(4, 2):
        for round_ in range(sizes.overhead_rounds):
            # Each round runs both loops, in turn first, so neither always follows the other.
            for run in (run_bare, run_fit) if round_ % 2 == 0 else (run_fit, run_bare):
                run()
                jax.clear_caches()
    notes.append(
        f"Framework overhead: {lm_label(sizes)} under {POLICY}, {sizes.overhead_steps} steps per run, steady "
        f"step time after step {WARMUP}, {sizes.overhead_rounds} rounds (each runs both, the first of "
        "them alternating), the overhead the median of the rounds' fit/bare ratios; both loops "
        "read each step's loss one step late (after dispatching the next step), with the same "
        "state and batch shardings. Host CPU time per step: the loop thread's CPU time between "
        "consecutive steps (time.thread_time), plus for fit every thread elastic_dew starts (elastic-dew-*, "
        "those that ended within the interval included) over the same interval, p50 over the steady steps; "
        "XLA's and Grain's threads are not counted."
    )
    return {
        "host_cpu_ms_per_step_added": (median(cpu_fit) - median(cpu_bare)) * 1e3,
        "host_cpu_ms_per_step_trainer": median(cpu_fit) * 1e3,
        "host_cpu_ms_per_step_bare": median(cpu_bare) * 1e3,
        "host_cpu_ms_per_step_own_threads": median(cpu_own) * 1e3,
        "framework_step_s_trainer": median(fit),
        "framework_step_s_bare": median(bare),
        "framework_overhead_pct": (median([f / b for f, b in zip(fit, bare, strict=True)]) - 1) * 100,
        "framework_overhead_pct_all": [round((f / b - 1) * 100, 2) for f, b in zip(fit, bare, strict=True)],
    }
