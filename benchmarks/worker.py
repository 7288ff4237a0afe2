"""Subprocess side of the benchmarks: what must run as a real, separate process.

``python -m benchmarks.worker MODE ...``:

* ``restart CHECKPOINT_DIR RUN_DIR``: the restart baseline. A new process starts,
  initialises JAX, compiles the ``lm`` step and restores the newest persistent checkpoint,
  as the whole workload does under the JobSet restart policy; it prints ``FIRST_STEP`` when
  its first new step has completed and exits at once.
* ``train RUN_DIR STEPS SCHEDULE SNAPSHOT_EVERY CHECKPOINT_EVERY``: ``Trainer.fit`` of ``lm``
  on four simulated slices under a fault schedule (empty: none; exit 143 after a preemption,
  -9 after a ``kill``); the parent restarts it, as a JobSet would.
* ``preempt CHECKPOINT_DIR MEGABYTES``: an :class:`ElasticRun` over a state of that size
  that prints ``READY`` once it is stepping and holds its loop there until a line on stdin
  (the parent sends SIGTERM, then the line); the SIGTERM must end in a committed
  checkpoint and exit 143. It prints ``SAVE seconds`` (the protocol's own save time).

The device count comes from ``BENCH_DEVICES`` and is set before JAX starts. With
``BENCH_COMPILATION_CACHE`` set (a directory), JAX's persistent compilation cache is on
there in every mode (``prepare_process``'s ``compilation_cache_dir``), as ``elastic-dew
train`` turns it on for simulated runs.
"""

from __future__ import annotations

import logging
import os
import sys


def _prepare() -> None:
    from elastic_dew.runtime import prepare_process

    devices = int(os.environ.get("BENCH_DEVICES", "8"))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    prepare_process(
        xla_flags=f"--xla_force_host_platform_device_count={devices}",
        compilation_cache_dir=os.environ.get("BENCH_COMPILATION_CACHE") or None,
    )
    logging.basicConfig(level=logging.WARNING)


def lm_parts(overrides: tuple[tuple[str, object], ...] = ()) -> dict:
    """The ``lm`` recipe at its defaults, the model every trainer benchmark runs, with the
    recipe settings ``overrides`` (a mode's :attr:`~benchmarks.common.Sizes.lm`) over them.

    ``Trainer(**lm_parts(), ...)`` takes them all; the recipe's ``model_sharding`` rule
    applies only under a model axis, which the benchmarks do not use. The recipe's evaluation
    split is left out: the benchmarks measure training (``Trainer`` takes an ``eval_dataset``
    only with its ``eval_every``).
    """
    from elastic_dew.recipes import lm

    parts = lm.build(**dict(overrides))
    parts.pop("eval_dataset")
    return parts


def lm_program(parts: dict, policy="fsdp"):
    """The protocol's program for ``parts`` (of :func:`lm_parts`) laid out by ``policy``, as
    ``Trainer.fit`` runs it (``Trainer.program``), for the benchmarks that drive
    ``ElasticRun`` directly."""
    import tempfile

    from elastic_dew import Trainer, TrainConfig
    from elastic_dew.elastic.config import ElasticConfig

    with tempfile.TemporaryDirectory() as run_dir:  # never written: only the program is used
        trainer = Trainer(**parts, config=ElasticConfig(global_batch=48), run_dir=run_dir,
                          train=TrainConfig(sharding=policy))
    return trainer.program


def restart(checkpoint_dir: str, run_dir: str) -> int:
    from elastic_dew import Trainer, TrainConfig
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.events import Resume, Step
    from elastic_dew.simulate import SimulatedSlices

    config = ElasticConfig(
        minimum_slice_count=None, poll_interval=0.05, global_batch=48, snapshot_every=0,
        checkpoint_every=0, checkpoint_dir=checkpoint_dir, precompile_smaller_meshes=False,
    )

    def first_step(event) -> None:
        if isinstance(event, Resume):
            print(f"RESUME {event.source} {event.step}", flush=True)
        if isinstance(event, Step):
            print("FIRST_STEP", flush=True)
            os._exit(0)

    with SimulatedSlices(4, 2):
        Trainer(**lm_parts(), config=config, run_dir=run_dir, sinks=[first_step]).fit(10**9)
    return 1  # never reached: the first step exits


def train(run_dir: str, steps: str, schedule: str, snapshot_every: str, checkpoint_every: str) -> int:
    from pathlib import Path

    from elastic_dew import Trainer, TrainConfig
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.rundir import FAULTS_FILE
    from elastic_dew.simulate import SimulatedSlices

    elastic = int(snapshot_every) > 0
    config = ElasticConfig(
        minimum_slice_count=1 if elastic else None, poll_interval=0.05, timeout=120,
        global_batch=48, snapshot_every=int(snapshot_every), checkpoint_every=int(checkpoint_every),
        precompile_smaller_meshes=elastic,
    )
    with SimulatedSlices(4, 2, schedule=schedule, fault_log=Path(run_dir) / FAULTS_FILE):
        Trainer(**lm_parts(), config=config, run_dir=run_dir, train=TrainConfig(log_every=10**9)).fit(int(steps))
    return 0


class BlobProgram:
    """A state of ``megabytes`` float32 and a step that touches all of it."""

    microbatch = None  # no gradient accumulation

    def __init__(self, megabytes: int) -> None:
        self.n = megabytes * 2**20 // 4

    def abstract_state(self, mesh):
        import jax
        import jax.numpy as jnp

        from elastic_dew.elastic.slices.mesh import replicated

        return {"w": jax.ShapeDtypeStruct((self.n,), jnp.float32, sharding=replicated(mesh))}

    def init_state(self, mesh):
        import jax
        import jax.numpy as jnp

        from elastic_dew.elastic.slices.mesh import replicated

        return jax.jit(lambda: {"w": jnp.ones((self.n,), jnp.float32)}, out_shardings=replicated(mesh))()

    def compile(self, mesh, global_batch):
        import jax
        import jax.numpy as jnp

        from elastic_dew.elastic.slices.mesh import batch_sharding, replicated

        def step(state, batch):
            w = state["w"] * 0.5 + jnp.mean(batch["x"])
            return {"w": w}, {"loss": w[0]}

        batch = {"x": jax.ShapeDtypeStruct((global_batch,), jnp.float32, sharding=batch_sharding(mesh))}
        s = replicated(mesh)
        return jax.jit(step, out_shardings=(s, s)).lower(self.abstract_state(mesh), batch).compile()


def preempt(checkpoint_dir: str, megabytes: str) -> int:
    import grain
    import numpy as np

    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.elastic.loop.data import ElasticData
    from elastic_dew.elastic.events import Event, Save, Step
    from elastic_dew.elastic.loop.protocol import ElasticRun
    from elastic_dew.runtime import PreemptionNotice
    from elastic_dew.simulate import SimulatedSlices

    dataset = grain.MapDataset.range(1024).map(lambda i: {"x": np.float32(i)})
    config = ElasticConfig(
        minimum_slice_count=1, poll_interval=0.05, global_batch=1, snapshot_every=0,
        checkpoint_every=0, checkpoint_dir=checkpoint_dir, precompile_smaller_meshes=False,
    )
    ready = []

    def emit(event: Event) -> None:
        if isinstance(event, Step) and event.step == 2 and not ready:
            ready.append(True)
            print("READY", flush=True)
            sys.stdin.readline()  # the loop waits here until the parent has sent SIGTERM
        if isinstance(event, Save) and event.tier == "checkpoint":
            print(f"SAVE {event.seconds:.6f}", flush=True)

    with PreemptionNotice() as notice, SimulatedSlices(1, 1):
        ElasticRun(BlobProgram(int(megabytes)), ElasticData(dataset), config, emit=emit, notice=notice).run(10**9)
    return 1  # a run that was never preempted


MODES = {"restart": restart, "train": train, "preempt": preempt}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in MODES:
        print(f"usage: python -m benchmarks.worker {{{'|'.join(MODES)}}} ARGS...", file=sys.stderr)
        return 2
    from elastic_dew.runtime import install_exit_hook

    install_exit_hook()
    _prepare()
    from elastic_dew.runtime import Preempted
    from elastic_dew.runtime.preemption import exit_preempted

    try:
        return MODES[argv[0]](*argv[1:])
    except Preempted:
        exit_preempted()  # as `elastic-dew train` ends: 143 once the stop is durable


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
