"""Public elastic code nobody here wrote, under the simulator: pathwaysutils' own workload.

``pathwaysutils.extras.simple_model`` ships in pathwaysutils' wheel: a Flax NNX transformer,
a Grain ``ElasticIterator`` of synthetic tokens, a compiled training step, Orbax's in-memory
``Snapshotter``. It announces nothing to elastic_dew. ``_train`` drives it with
pathwaysutils' real ``Manager.elastic_retry`` as its docstrings say to (a workload on the
active slices, the snapshot restored at the start of an attempt, ``ScaleUpSignalError`` at a
step boundary once a slice is back). TPU slices cannot exist here: :class:`SimulatedSlices`
stands in for them on the test process's CPU devices (conftest).

Each scenario must resize and scale back as on Pathways, use every example exactly once,
and end with the parameters a fault-free replay of the committed batches gives.
"""

from __future__ import annotations

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from pathwaysutils.elastic import manager
from pathwaysutils.extras.simple_model import compile as compile_lib
from pathwaysutils.extras.simple_model import config as config_lib
from pathwaysutils.extras.simple_model import data as data_lib
from pathwaysutils.extras.simple_model import workload as workload_lib

from elastic_dew.simulate import SimulatedSlices

pytestmark = [pytest.mark.slow, pytest.mark.libraries]  # pathwaysutils' own elastic workload

CONFIG = config_lib.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_heads=2,
                                head_dim=16, num_layers=1, per_device_batch_size=1, seq_len=8)
STEPS = 10
LEARNING_RATE = 0.05


class _Recording:
    """The workload's data iterator, with each batch it hands out recorded."""

    def __init__(self, iterator, batches: list):
        self._iterator, self._batches = iterator, batches

    def __next__(self):
        batch = next(self._iterator)
        self._batches.append(np.asarray(batch).copy())
        return batch

    def __getattr__(self, name):
        return getattr(self._iterator, name)


def _train(minimum_slice_count: int | None) -> tuple[list, object]:
    """Run the workload to ``STEPS`` under ``elastic_retry``; returns every step it ran
    (attempt, step, slices, batch) and the final parameters."""
    elastic_manager = manager.Manager()
    snapshotter = ocp.v1.training.pathways.Snapshotter(replica_axis_index=0)
    ran: list = []
    attempt = [0]

    @elastic_manager.elastic_retry(minimum_slice_count=minimum_slice_count, poll_interval=0.05, timeout=60,
                                   retry_policy=manager.ElasticRetryLimit(max_attempts=8))
    def train():
        attempt[0] += 1
        work = workload_lib.Workload(config=CONFIG, elastic_manager=elastic_manager, total_steps=STEPS,
                                     learning_rate=LEARNING_RATE, snapshot_interval=2, snapshotter=snapshotter)
        work.initialize()
        if snapshotter.latest is not None:
            work.restore_from_snapshot()
            work.step = snapshotter.latest.step + 1
        batches: list = []
        work.data_iterator = _Recording(work.data_iterator, batches)
        try:
            while work.step <= STEPS:
                step = work.step
                work.run_step()
                ran.append((attempt[0], step, elastic_manager.active_slice_count, batches[-1]))
                if elastic_manager.available_inactive_slices and work.step <= STEPS:
                    snapshotter.join()
                    raise manager.ScaleUpSignalError()
            snapshotter.join()
            return work.params
        finally:
            work.close()

    return ran, train()


def _committed(ran: list) -> list:
    """The steps whose results the run kept: each attempt's, up to where the next resumed."""
    kept = []
    for attempt, step, slices, batch in ran:
        kept = [entry for entry in kept if entry[1] < step]  # a re-done step replaces its lineage
        kept.append((attempt, step, slices, batch))
    return kept


def _replay(committed: list, sim: SimulatedSlices):
    """The committed batches again, without faults, each on as many slices as it ran on."""
    artifacts = {}
    params = None
    for _, _, slices, batch in committed:
        if slices not in artifacts:
            devices = [d for s in range(slices) for d in sim.slice_to_devices[s]]
            artifacts[slices] = compile_lib.compile_training_step(
                CONFIG, devices, devices_per_slice=sim.devices_per_slice, learning_rate=LEARNING_RATE)
        graphdef, art = artifacts[slices]
        if params is None:
            fresh = workload_lib.Workload(config=CONFIG, devices=art.mesh.devices.flatten().tolist(),
                                          devices_per_slice=sim.devices_per_slice, learning_rate=LEARNING_RATE)
            fresh.initialize()
            params = fresh.params
            fresh.close()
        params = jax.device_put(params, art.param_shardings)
        _, params = art.compiled_step_fn(params, jax.device_put(batch, art.data_sharding))
    return params


SCENARIOS = {
    # name: (schedule, minimum_slice_count, slices of each attempt)
    "resize": ("lose:1@4,restore:1@6", 1, [(0, 1), (0,), (0, 1)]),
    "loss at dispatch": ("lose:1@4/dispatch,restore:1@6", 1, [(0, 1), (0,), (0, 1)]),
    "flapping slice": ("lose:1@3,restore:1@4,lose:1@7,restore:1@8", 1,
                       [(0, 1), (0,), (0, 1), (0,), (0, 1)]),
    "pause-resume, time-keyed return": ("lose:1@4,restore:1@+1", None, [(0, 1), (0, 1)]),
    "hang that becomes a loss": ("hang:1@4,lose:1@+1,restore:1@6", 1, [(0, 1), (0,), (0, 1)]),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS), ids=list(SCENARIOS))
def test_pathwaysutils_simple_model_resizes_and_scales_back_with_every_example_once(scenario):
    schedule, minimum, attempts = SCENARIOS[scenario]
    with SimulatedSlices(2, 2, schedule=schedule) as sim:
        ran, params = _train(minimum)
        replayed = _replay(_committed(ran), sim)
    assert sim.attempts == attempts and sim.unfired == ()
    committed = _committed(ran)
    assert [step for _, step, _, _ in committed] == list(range(1, STEPS + 1))
    tokens = np.concatenate([batch for *_, batch in committed])
    source = data_lib.create_token_dataset(CONFIG)
    np.testing.assert_array_equal(tokens, np.stack([source[i] for i in range(len(tokens))]))  # each once, in order
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
                 params, replayed)
