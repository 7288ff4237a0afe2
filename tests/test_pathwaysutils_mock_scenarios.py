"""The scenarios of pathwaysutils' own fault-injection test, on the simulator.

pathwaysutils 0.1.13 tests its elastic code against a mock
(``pathwaysutils/test/mock_fault_injection.py``, exercised by ``mock_fault_injection_test.py``)
that binds arrays to devices by ``id()`` and marks them corrupted. Its scenarios are ported
here onto :class:`SimulatedSlices`, where a device loss is a slice loss and arrays carry
their marks themselves. TPU slices cannot exist here; the simulator stands in for them on
the test process's CPU devices (conftest). Scenarios already covered elsewhere:
every read path raising ``DATA_LOSS``, ``block_until_ready`` included
(``test_simulate.py::test_every_read_of_an_array_on_a_lost_slice_raises_a_slice_down_error``),
sticky loss after the slice returns while new arrays work
(``test_simulate.py::test_a_restored_slice_reads_fresh_arrays_and_keeps_the_old_ones_lost``),
and a two-slice topology with only the lost slice's arrays failing
(``test_simulate.py::test_arrays_on_healthy_slices_stay_readable_while_another_is_lost``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elastic_dew.simulate import SimulatedSlices

pytestmark = pytest.mark.libraries  # pathwaysutils' own scenarios


def test_a_scalar_on_a_lost_slice_raises_data_loss():
    with SimulatedSlices(2, 2) as sim:
        scalar = jax.device_put(jnp.array(5.0), sim.slice_to_devices[0][0])
        sim.lose(0)
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
            np.asarray(scalar)


@functools.partial(jax.jit, static_argnums=(0,))
def _decorated(static_value, x):
    return x * static_value


COMPUTATIONS = {
    # the mock's ``c = a + b`` with a and b on the lost device
    "an operation on the lost slice's arrays": lambda a, b, copy: a + b,
    "a jax.jit function with a static argument": lambda a, b, copy: _decorated(2.0, copy),
    "jax.jit(fn) of a copy on a healthy slice": lambda a, b, copy: jax.jit(lambda x: x * 2.0)(copy),
}


@pytest.mark.parametrize("compute", list(COMPUTATIONS), ids=list(COMPUTATIONS))
def test_a_result_computed_from_a_lost_slices_data_raises_data_loss(compute):
    with SimulatedSlices(2, 2) as sim:
        lost = sim.slice_to_devices[0][0]
        a, b = (jax.device_put(jnp.array(v), lost) for v in ([1.0, 2.0], [3.0, 4.0]))
        sim.lose(0)
        copy = jax.device_put(a, sim.slice_to_devices[1][0])  # data that was lost, placed elsewhere
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
            np.asarray(COMPUTATIONS[compute](a, b, copy))  # at the dispatch or at the read


def test_an_array_lost_and_restored_without_being_read_stays_lost():
    with SimulatedSlices(2, 2) as sim:
        device = sim.slice_to_devices[0][0]
        old = jax.device_put(jnp.array([1.0, 2.0, 3.0]), device)
        sim.lose(0)
        sim.restore(0)
        with pytest.raises(jax.errors.JaxRuntimeError, match="DATA_LOSS"):
            np.asarray(old)
        np.testing.assert_array_equal(np.asarray(jax.device_put(jnp.array([4.0]), device)), [4.0])
