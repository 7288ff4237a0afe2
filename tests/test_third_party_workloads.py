"""Public elastic code nobody here wrote, under the simulator: pathwaysutils' own workload.

``pathwaysutils.extras.simple_model`` ships in pathwaysutils' wheel: a Flax NNX transformer,
a Grain ``ElasticIterator`` of synthetic tokens, a compiled training step, Orbax's in-memory
``Snapshotter``. It announces nothing to elastic_dew. ``tests/programs/simple_model_elastic.py``
(the program ``tests/test_simulate_command.py`` runs under ``elastic-dew simulate``) drives it with
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
import pytest
from pathwaysutils.elastic import manager
from pathwaysutils.extras.simple_model import compile as compile_lib
from pathwaysutils.extras.simple_model import data as data_lib
from pathwaysutils.extras.simple_model import workload as workload_lib

from elastic_dew.simulate import SimulatedSlices

from programs.simple_model_elastic import CONFIG, LEARNING_RATE, train

pytestmark = [pytest.mark.slow, pytest.mark.libraries]  # pathwaysutils' own elastic workload

STEPS = 10


def _train(minimum_slice_count: int | None) -> tuple[list, object]:
    """Run the workload to ``STEPS`` under ``elastic_retry``; returns every step it ran
    (attempt, step, slices, batch) and the final parameters."""
    ran: list = []
    params = train(STEPS, minimum_slice_count, lambda *entry: ran.append(entry), snapshot_interval=2,
                   poll_interval=0.05, timeout=60, retry_policy=manager.ElasticRetryLimit(max_attempts=8))
    return ran, params


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
