"""The terminal progress bar: fits the width it is given, shows an ETA, logs go above it."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from elastic_dew.elastic.events import Resume, Step, Stop
from elastic_dew.observe.progress_bar import ProgressBar


def _step(step: int, slices: int = 4) -> Step:
    return Step(wall=float(step), step=step, slices=slices, loss=1.0 / step,
                examples=(0, 8 * step), seconds=0.01)


def _frames(text: str) -> list[str]:
    """Every redraw of the bar: the text between carriage returns and newlines."""
    return [f for f in re.split(r"[\r\n]", text) if f.strip()]


@pytest.mark.parametrize("width", [40, 80, 120])
def test_every_redraw_fits_the_width_and_shows_the_eta(width):
    stream = io.StringIO()
    bar = ProgressBar(100, total_slices=4, stream=stream, width=width, mininterval=0)
    bar(Resume(wall=0.0, source="fresh", step=1))
    for step in range(1, 31):
        bar(_step(step, slices=3 if step > 20 else 4))
    bar(Stop(wall=31.0, reason="slice_lost", step=30))
    bar.close()
    frames = _frames(stream.getvalue())
    assert frames and all(len(frame) <= width for frame in frames), max(map(len, frames))
    last_step = [f for f in frames if " 30/100 " in f][-1]
    # tqdm's [elapsed<remaining, rate]: the remaining time is a clock reading, not "?".
    assert re.search(r"<\d\d:\d\d", last_step), last_step


def test_the_postfix_carries_loss_metrics_slices_and_the_last_event_when_there_is_room():
    stream = io.StringIO()
    bar = ProgressBar(50, total_slices=4, stream=stream, width=200, mininterval=0)
    bar(Resume(wall=0.0, source="snapshot", step=11))
    bar(Step(wall=11.0, step=11, slices=3, loss=1.0 / 11, examples=(0, 88), seconds=0.01, metrics={"accuracy": 0.625}))
    bar.close()
    final = _frames(stream.getvalue())[-1]
    assert "11/50" in final
    assert "loss 0.0909" in final and "accuracy 0.625" in final and "slices 3/4" in final
    assert "resume from snapshot at step 11" in final


def test_log_records_are_written_above_the_bar_on_their_own_lines(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)  # the console handler and the bar share it
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("elastic_dew.test_bar")
    log.addHandler(handler)
    log.propagate = False
    try:
        bar = ProgressBar(10, stream=stream, width=60, mininterval=0)
        with bar.redirect_logging(loggers=[log]):
            bar(_step(1))
            log.warning("slice 2 lost")
            bar(_step(2))
        bar.close()
    finally:
        log.removeHandler(handler)
        log.propagate = True
    lines = stream.getvalue().split("\n")
    logged = [line for line in lines if "slice 2 lost" in line]
    assert len(logged) == 1
    # The record stands alone: the bar was cleared before it (only the erase, no bar text).
    assert logged[0].split("\r")[-1] == "WARNING slice 2 lost"
    assert "2/10" in lines[-1] or "2/10" in lines[-2]  # the bar is redrawn below the record


def test_a_too_narrow_width_or_no_steps_is_refused():
    with pytest.raises(ValueError, match="narrow"):
        ProgressBar(10, stream=io.StringIO(), width=5)
    with pytest.raises(ValueError, match="total_steps"):
        ProgressBar(0, stream=io.StringIO())
