"""The loop's one channel (``elastic_dew.elastic.hooks``): phases under way and events that
happened, heard by the run's sink and the simulator, which lands the snapshot copy in flight
itself, through the Orbax ``Snapshotter`` the loop saves with."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elastic_dew._compat.orbax import HostSnapshotter
from elastic_dew.elastic import events, hooks
from elastic_dew.elastic.loop.data import ElasticData
from elastic_dew.elastic.loop.protocol import ElasticRun
from elastic_dew.elastic.state.snapshots import Snapshots
from elastic_dew.simulate import SimulatedSlices
from elastic_dew.simulate.patches import registry

from linear import LinearProgram
from linear import config as _config
from linear import dataset as _dataset


def test_a_listener_hears_phases_and_events_in_the_order_told_until_it_leaves():
    heard: list = []
    stop = events.Stop(reason="done", step=3)
    with hooks.listening(lambda name, step: heard.append((name, step)), events=heard.append):
        hooks.phase("step", 3)
        hooks.emit(stop)
        hooks.phase("checkpoint", 3)
    hooks.phase("step", 4)
    hooks.emit(events.Stop(reason="done", step=4))
    assert heard == [("step", 3), stop, ("checkpoint", 3)]


def test_a_phase_nobody_listens_to_is_not_checked_and_one_a_listener_hears_must_be_declared():
    hooks.phase("no such phase", 1)  # nothing listens: one empty check, nothing else
    hooks.add_listener(events=lambda event: None)  # an event listener does not hear phases
    try:
        hooks.phase("no such phase", 1)
    finally:
        hooks.remove_listener(events=lambda event: None)  # not the one added: a no-op
    with hooks.listening(lambda name, step: None):
        with pytest.raises(ValueError, match="unknown phase 'no such phase'; phases are step, snapshot"):
            hooks.phase("no such phase", 1)


def test_a_listener_that_raises_stops_the_announcement_there_as_a_fault_at_that_point_would():
    later: list = []

    def fault(name, step):
        raise RuntimeError(f"fault at {name} {step}")

    with hooks.listening(fault), hooks.listening(lambda name, step: later.append(step)):
        with pytest.raises(RuntimeError, match="fault at dispatch 2"):
            hooks.phase("dispatch", 2)
    assert later == []


def test_the_runs_sink_hears_its_own_events_and_each_fault_the_simulator_fires_in_order(tmp_path):
    heard: list = []
    with SimulatedSlices(4, 2, schedule="lose:1@3", fault_log=tmp_path / "faults.jsonl"):
        run = ElasticRun(LinearProgram(), ElasticData(_dataset()), _config(tmp_path), emit=heard.append)
        run.run(6)
    kinds = [(e.kind, getattr(e, "action", getattr(e, "reason", None))) for e in heard
             if e.kind in ("fault", "stop")]
    assert kinds == [("fault", "lose"), ("stop", "slice_lost"), ("stop", "done")]
    assert [e.step for e in heard if isinstance(e, events.Step)][-1] == 6
    hooks.emit(events.Stop(reason="done", step=99))  # after the run: its sink no longer hears
    assert heard[-1] == events.Stop(reason="done", step=6, wall=heard[-1].wall)


def _mesh(devices) -> Mesh:
    return Mesh(np.array(devices[:4]).reshape(2, 2, 1), ("replica", "data", "model"))


def test_the_simulator_joins_the_snapshotter_elastic_dews_state_tier_saved_with_and_forgets_it_on_exit(monkeypatch):
    joined: list = []
    join = HostSnapshotter.join
    monkeypatch.setattr(HostSnapshotter, "join", lambda self: (joined.append(self), join(self))[1])
    with SimulatedSlices(2, 2) as sim:
        mesh = _mesh(sim.devices)
        state = {"w": jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("data")))}
        registry.land_snapshots()
        assert joined == []  # nothing saved yet: nothing in flight
        snapshots = Snapshots()
        assert snapshots.save(1, state, {"step": 1}, mesh)
        registry.land_snapshots()
        assert len(joined) == 1 and joined[0] is not None
        assert snapshots.latest_step() == 1
    joined.clear()
    registry.land_snapshots()  # the simulator exited: nothing is remembered
    assert joined == []
    snapshots.close()
