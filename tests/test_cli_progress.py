"""The progress display where the output is not a terminal: plain lines in a log."""

from __future__ import annotations

import io
import json
import logging
import sys
import types

import pytest

from elastic_dew.elastic.events import Eval, Resume, Save, Step, Stop
from elastic_dew.observe.logs import JsonFormatter, LogContext
from elastic_dew.observe.progress import Progress


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _step(step: int, loss: float = 1.5, slices: int = 4) -> Step:
    return Step(step=step, slices=slices, loss=loss, examples=(0, 1), seconds=0.1, wall=0.0)


def test_in_a_log_a_line_every_log_every_steps_and_one_per_stop_and_resume():
    out, clock = io.StringIO(), _Clock()
    progress = Progress(30, total_slices=4, stream=out, log_every=10, clock=clock)
    for step in range(1, 31):
        clock.now = step
        progress(_step(step))
        if step == 12:
            progress(Resume(source="snapshot", step=11, wall=0.0))
    progress(Save(tier="snapshot", step=30, seconds=0.1, taken=True, wall=0.0))
    lines = out.getvalue().splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "step 10/30", "resume from snapshot at step 11", "step 20/30", "step 30/30",
    ]
    assert "\r" not in out.getvalue()
    assert "1.00 steps/s" in lines[-1]


def test_without_a_stream_lines_go_through_the_logger_and_json_logs_carry_loss_and_metrics_as_fields():
    """The display's step line shows the loss function's metrics; a JSON line has them, and
    an evaluation's, as keys of its own (what Cloud Logging filters on)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(LogContext()))
    logger = logging.getLogger("elastic_dew.observe.progress")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        progress = Progress(5, log_every=5)
        for step in range(1, 6):
            progress(Step(step=step, slices=2, loss=0.5, examples=(0, 1), seconds=0.1, wall=0.0,
                          metrics={"accuracy": 0.25 * step}))
        progress(Eval(step=5, slices=2, metrics={"loss": 0.75, "accuracy": 0.5}, batches=2,
                      examples_evaluated=16, seconds=0.2, wall=0.0))
    finally:
        logger.removeHandler(handler)
        logger.level = level
    step_line, eval_line = (json.loads(line) for line in out.getvalue().splitlines())
    assert step_line["message"].startswith("step 5/5  loss 0.5000  accuracy 1.25  slices 2")
    assert (step_line["loss"], step_line["metrics"]) == (0.5, {"accuracy": 1.25})
    assert eval_line["message"] == "eval after step 5: loss 0.75 accuracy 0.5"
    assert eval_line["eval"] == {"step": 5, "metrics": {"loss": 0.75, "accuracy": 0.5}}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stderr, shown", [(_Terminal, "ProgressBar"), (io.StringIO, "Progress")])
def test_a_run_on_a_terminal_shows_the_bar_and_elsewhere_log_lines(monkeypatch, stderr, shown):
    from elastic_dew.terminal import Terminal

    monkeypatch.setattr(sys, "stderr", stderr())
    plan = types.SimpleNamespace(sim=None, steps=5, train=types.SimpleNamespace(log_every=5))
    with Terminal("elastic-dew train").running(plan) as sinks:
        (display,) = sinks
        display(_step(5))
    assert type(display).__name__ == shown
    if shown == "ProgressBar":  # (log lines go through the logger, not to this stream)
        assert "5/5" in sys.stderr.getvalue()
