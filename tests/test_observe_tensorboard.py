"""TensorBoard event files of a run, read back with TensorBoard's own ``EventAccumulator``."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from elastic_dew.elastic.events import Eval, Resume, Start, Step, Stop
from elastic_dew.record.goodput import account
from elastic_dew.observe.tensorboard import TENSORBOARD_DIR, TensorBoardSink
from goodputlib import preempted_run_with_gap


def _read(run_dir):
    acc = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _summary(events):
    result = account(events)
    return {"goodput": result.goodput, "badput": dict(result.badput), "final_step": 40}


def test_the_sink_writes_training_scalars_markers_and_goodput_that_a_reader_reads_back(tmp_path):
    events = preempted_run_with_gap(gap=20.0)
    sink = TensorBoardSink(tmp_path)
    for event in events:
        sink(event)
    sink.close(_summary(events))

    acc = _read(tmp_path)
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/step_seconds", "train/steps_per_second",
            "elastic/active_slices", "data/examples_consumed"} <= scalars
    loss = acc.Scalars("train/loss")
    assert [s.step for s in loss][:3] == [1, 2, 3]
    assert loss[0].value == pytest.approx(1.0)
    assert loss[0].wall_time == pytest.approx(events[2].wall)  # the step's own wall time
    assert acc.Scalars("data/examples_consumed")[-1].value == 8 * 40
    assert {s.value for s in acc.Scalars("elastic/active_slices")} == {3.0, 4.0}
    assert acc.Scalars("train/steps_per_second")[1].value == pytest.approx(1.0)

    stops = acc.Scalars("events/stop")
    assert [s.step for s in stops] == [20, 27, 40]
    assert [s.step for s in acc.Scalars("events/resume")] == [1, 11, 25]
    assert [s.step for s in acc.Scalars("events/fault")] == [20]
    texts = [t.tensor_proto.string_val[0].decode() for t in acc.Tensors(acc.Tags()["tensors"][0])]
    assert "stop slice_lost after step 27" in texts

    assert acc.Scalars("goodput/goodput")[0].value == pytest.approx(account(events).goodput)
    gap = acc.Scalars("badput/infrastructure_recovery_from_disruption")
    assert gap[0].value == pytest.approx(20.0, abs=1e-3)


def test_a_resumed_process_adds_its_own_event_file_to_the_same_run(tmp_path):
    for pid, first in ((1, 1), (2, 3)):
        sink = TensorBoardSink(tmp_path)
        sink(Start(wall=100.0 * pid, process_start=100.0 * pid - 1, pid=pid))
        sink(Resume(wall=100.0 * pid + 1, source="fresh", step=first))
        for step in (first, first + 1):
            sink(Step(wall=100.0 * pid + 1 + step, step=step, slices=2, loss=0.5,
                      examples=(0, 4 * step), seconds=1.0))
        sink(Stop(wall=100.0 * pid + 9, reason="done", step=first + 1))
        sink.close()
    assert len(list((tmp_path / TENSORBOARD_DIR).iterdir())) == 2
    assert [s.step for s in _read(tmp_path).Scalars("train/loss")] == [1, 2, 3, 4]


def test_a_closed_sink_refuses_more_events(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.close()
    with pytest.raises(ValueError, match="closed"):
        sink(Stop(wall=1.0, reason="done", step=1))


def test_the_loss_functions_metrics_and_the_evaluation_passes_are_scalars_of_their_own(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink(Step(wall=10.0, step=1, slices=4, loss=0.5, examples=(0, 8), seconds=1.0, metrics={"accuracy": 0.25}))
    sink(Eval(wall=12.0, step=1, slices=4, metrics={"loss": 0.75, "accuracy": 0.5}, batches=2,
              examples_evaluated=16, seconds=1.5))
    sink.close()
    acc = _read(tmp_path)
    assert [(s.step, s.value) for s in acc.Scalars("train/accuracy")] == [(1, 0.25)]
    assert [(s.step, s.value, s.wall_time) for s in acc.Scalars("eval/loss")] == [(1, 0.75, 12.0)]
    assert acc.Scalars("eval/accuracy")[0].value == 0.5 and acc.Scalars("eval/seconds")[0].value == 1.5
