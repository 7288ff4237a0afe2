"""The observability options, the sinks they choose, and the one stream that feeds them."""

from __future__ import annotations

import argparse
import dataclasses
import logging

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from elastic_dew import console
from elastic_dew._compat.argparse import actions
from elastic_dew.observe.logs import log_context
from elastic_dew.observe.sinks import ObserveOptions, Sinks, chosen, close
from goodputlib import MemoryLogger, preempted_run_with_gap


def _parser():
    parser = argparse.ArgumentParser()
    console.add_options(parser, recipe=False)
    return parser


def _parse(*argv):
    return console.observe_of(_parser().parse_args(list(argv)))


def test_each_option_has_one_flag_built_with_the_runs_other_flags_from_its_declaration():
    flags = [flag for action in actions(_parser()) for flag in action.option_strings]
    for field in dataclasses.fields(ObserveOptions):
        assert flags.count(console.flag_of(field.name)) == 1, field.name
    assert flags.count("--no-tensorboard") == 1  # on/off by default None: --X and --no-X
    assert "--no-goodput-export" not in flags  # off by default: a switch


def test_the_flags_default_to_auto_logs_tensorboard_when_installed_and_no_export():
    options = _parse()
    assert options == ObserveOptions(log_format="auto", tensorboard=None, goodput_export=False)
    assert options.writes_tensorboard  # tensorboardX is installed here (the observe extra)
    assert _parse("--no-tensorboard").writes_tensorboard is False
    assert _parse("--log-format", "json", "--goodput-export").goodput_export is True


def test_an_unknown_log_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        _parse("--log-format", "yaml")
    assert exit_.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


def test_every_sink_sees_every_event_in_order_and_the_log_context_follows_the_steps_until_the_end(tmp_path):
    seen, record = [], []
    memory = MemoryLogger()
    observers = chosen(ObserveOptions(tensorboard=True, goodput_export=True), tmp_path,
                       job_name="run", cloud_logger=memory)
    sinks = Sinks([seen.append, *observers], required=[record.append])
    assert sinks.names == ["append", "append", "TensorBoard", "goodput export"]
    events = preempted_run_with_gap(gap=5.0)
    try:
        for event in events:
            sinks(event)
        assert log_context.fields() == {"step": 40, "slices": 3}
    finally:
        sinks.end()
    assert log_context.fields() == {}
    close(observers, {"goodput": 0.5, "badput": {"other": 1.0}, "final_step": 40})
    assert seen == record == events
    assert sum("job_end_time" in entry for _, entry in memory.entries) == 2  # one per process
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Scalars("goodput/goodput")[0].value == 0.5


def test_the_stream_takes_typed_events_only():
    with pytest.raises(TypeError, match="typed events"):
        Sinks([])({"event": "step", "step": 1})


def test_a_failing_sink_is_dropped_with_one_error_line_and_the_run_goes_on(tmp_path, caplog):
    def broken(event):
        raise OSError("disk full")

    kept = []
    sinks = Sinks([broken, kept.append])
    with caplog.at_level(logging.ERROR, logger="elastic_dew.observe.sinks"):
        try:
            for event in preempted_run_with_gap(gap=1.0)[:5]:
                sinks(event)
        finally:
            sinks.end()
    assert [r.getMessage() for r in caplog.records] == ["the broken failed; the run goes on without it"]
    assert sinks.names == ["append"] and len(kept) == 5
    assert chosen(ObserveOptions(tensorboard=False), tmp_path) == []
    assert not (tmp_path / "tensorboard").exists()


def test_a_failing_required_sink_fails_the_run():
    def record(event):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        Sinks([], required=[record])(preempted_run_with_gap(gap=1.0)[0])


def test_an_option_whose_library_is_missing_is_refused_by_field_and_worded_as_flags_on_the_command_line(monkeypatch):
    from elastic_dew import console
    from elastic_dew.settings import SettingError
    from elastic_dew.observe import sinks

    monkeypatch.setattr(sinks, "tensorboard_available", lambda: False)
    with pytest.raises(SettingError) as refused:
        ObserveOptions(tensorboard=True)
    assert refused.value.field == "tensorboard"
    assert str(refused.value) == ("tensorboard=True needs tensorboardX; install it with "
                                  "pip install 'elastic-dew[observe]', or pass tensorboard=False")
    assert console.refusal(refused.value) == (
        "--tensorboard needs tensorboardX; install it with pip install 'elastic-dew[observe]', "
        "or pass --no-tensorboard")
