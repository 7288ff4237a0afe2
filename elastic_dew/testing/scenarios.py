"""Chaos scenarios: a small faulted training run, and drawing one at random from a seed.

A *scenario* is a small training run (a linear model, :data:`TOTAL_SLICES` simulated slices
of :data:`DEVICES_PER_SLICE` CPU devices, a constant global batch) with a fault schedule in
the simulator's grammar. :func:`draw` draws one from a seed (faults, slices, steps and
phases), always keeping one slice that is never lost, so every drawn run must finish; the
same seed always draws the same scenario, and :func:`replay_command` is the one command
that replays it.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

__all__ = [
    "TOTAL_SLICES",
    "DEVICES_PER_SLICE",
    "GLOBAL_BATCH",
    "TOLERANCE",
    "MAX_PROCESSES",
    "Scenario",
    "model",
    "draw",
    "replay_command",
]

TOTAL_SLICES = 4
DEVICES_PER_SLICE = 2
#: Divisible by the data-parallel devices of 4, 3, 2 and 1 slices of 2.
GLOBAL_BATCH = 24
#: The elastic layer's tolerance where the mesh changed under a constant global batch: the
#: gradient's all-reduce sums in another order, so float32 results agree to this, not bitwise.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
#: Processes one scenario may use (the first plus restarts after preemption).
MAX_PROCESSES = 6
_FEATURES = 4
_EXAMPLES = 2048


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One faulted run: a schedule and the settings it runs with.

    Args:
        schedule: the fault schedule, in the simulator's grammar.
        steps: the step to train to.
        minimum_slice_count: ``ElasticConfig.minimum_slice_count``.
        snapshot_every: ``ElasticConfig.snapshot_every``.
        checkpoint_every: ``ElasticConfig.checkpoint_every``.
        max_attempts: ``ElasticConfig.max_attempts``.
        retry_reset_steps: ``ElasticConfig.retry_reset_steps``; ``None`` keeps its default.
        timeout: ``ElasticConfig.timeout``.
        poll_interval: ``ElasticConfig.poll_interval``.
        quarantine_damaged: ``ElasticConfig.quarantine_damaged``.
    """

    schedule: str = ""
    steps: int = 12
    minimum_slice_count: int | None = 1
    snapshot_every: int = 2
    checkpoint_every: int = 4
    max_attempts: int | None = 10
    retry_reset_steps: int | None = None
    timeout: float = 60.0
    poll_interval: float = 0.05
    quarantine_damaged: bool = True

    def config(self) -> Any:
        """The scenario's elastic settings.

        Returns:
            The ``ElasticConfig`` the scenario's processes run with (every checkpoint kept).
        """
        from elastic_dew.elastic.config import ElasticConfig

        retry: dict[str, Any] = {} if self.retry_reset_steps is None else {"retry_reset_steps": self.retry_reset_steps}
        return ElasticConfig(
            **retry,
            minimum_slice_count=self.minimum_slice_count,
            poll_interval=self.poll_interval,
            timeout=self.timeout,
            max_attempts=self.max_attempts,
            global_batch=GLOBAL_BATCH,
            snapshot_every=self.snapshot_every,
            checkpoint_every=self.checkpoint_every,
            quarantine_damaged=self.quarantine_damaged,
            # Retention would delete old checkpoints by design; keep them all, so any
            # checkpoint that disappears was lost to a fault.
            max_to_keep=100,
        )


def model() -> dict[str, Any]:
    """A linear regression on fixed data, trained by SGD: small, and sensitive to every example."""
    import grain
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    rng = np.random.default_rng(7)
    xs = rng.normal(size=(_EXAMPLES, _FEATURES)).astype(np.float32)
    ys = (xs @ np.arange(1, _FEATURES + 1, dtype=np.float32) + 0.5).astype(np.float32)

    def init(key):
        return {"w": jax.random.normal(key, (_FEATURES,)) * 0.1, "b": jnp.zeros(())}

    def loss(params, batch, key):
        del key
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    dataset = grain.MapDataset.range(_EXAMPLES).map(lambda i: {"x": xs[i], "y": ys[i]})
    return {"init": init, "loss": loss, "optimizer": optax.sgd(0.05), "dataset": dataset}


#: Phases that happen at any step, and those that happen only while recovering.
_RUNNING_PHASES = ("step", "step", "step", "dispatch", "snapshot", "checkpoint")
_RECOVERY_PHASES = ("snapshot_load", "compile", "checkpoint_restore")


def draw(seed: int) -> Scenario:
    """A random scenario from ``seed``: 1-5 faults at random steps and phases.

    The first fault hits a running step (its computation, its dispatch, a snapshot or a
    checkpoint save); each later
    one either hits a running step too, or the recovery from an earlier fault (its snapshot
    load, compile or checkpoint restore), or, after a slice's return, the scale-up or the
    step that notices it. Slices ``lose`` and ``restore`` (a restore only of a slice the
    schedule lost, at a later step); at most two preemptions, whose stop may be hit again.
    One slice is never lost, so every drawn run must finish.

    Args:
        seed: the random seed.

    Returns:
        The scenario (the same for the same seed).
    """
    rng = random.Random(seed)
    steps = rng.randint(10, 14)
    survivor = rng.randrange(TOTAL_SLICES)
    losable = [s for s in range(TOTAL_SLICES) if s != survivor]
    faults: list[str] = []
    lost: list[tuple[int, int]] = []  # (slice, step)
    earlier: list[int] = []
    preempts = 0
    for number in range(rng.randint(1, 5)):
        kind = rng.choices(("lose", "restore", "preempt"), weights=(5, 3, 2))[0]
        if kind == "preempt" and preempts >= 2:
            kind = "lose"
        if kind == "restore" and lost:
            victim, at = rng.choice(lost)
            step = rng.randint(min(at + 1, steps), steps)
            faults.append(f"restore:{victim}@{step}/step")
            if rng.random() < 0.5:  # hit the scale-up that brings it back
                faults.append(f"lose:{rng.choice(losable)}@{step}/scale_up")
            continue
        if number and earlier and rng.random() < 0.4:
            phase = rng.choice(_RECOVERY_PHASES + ("stop",) * (kind == "lose" and preempts > 0))
            step = rng.choice(earlier)
        else:
            phase = rng.choice(_RUNNING_PHASES)
            step = rng.randint(1, steps)
        earlier.append(step)
        if kind == "preempt":
            preempts += 1
            faults.append(f"preempt@{step}/{phase}")
        else:
            victim = rng.choice(losable)
            lost.append((victim, step))
            faults.append(f"lose:{victim}@{step}/{phase}")
    return Scenario(
        schedule=",".join(faults),
        steps=steps,
        minimum_slice_count=1,
        snapshot_every=rng.choice((0, 2, 3)),
        checkpoint_every=rng.choice((0, 3, 4, 5)),
    )


def replay_command(seed: int) -> str:
    """The one command that replays ``seed``.

    Args:
        seed: the seed :func:`draw` drew the scenario from.

    Returns:
        The shell command.
    """
    return f"python -m elastic_dew.chaos --seed {seed}"
