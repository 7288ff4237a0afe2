"""Structured logs: JSON lines with Cloud Logging's severity, text on a terminal."""

from __future__ import annotations

import io
import json
import logging

import pytest

from elastic_dew.observe.logs import JsonFormatter, LogContext, log_context, set_verbose, setup_logging


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    log_context.clear()


def _lines(stream):
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_severity_message_logger_and_the_known_step_and_slices():
    stream = io.StringIO()
    setup_logging("json", stream)
    log = logging.getLogger("elastic_dew.test")
    log.info("before any step")
    log_context.update(step=12, slices=3)
    log.warning("lost slice %d", 2)
    log_context.update(slices=None)
    log.critical("gone")
    first, second, third = _lines(stream)
    assert first["severity"] == "INFO" and first["message"] == "before any step"
    assert first["logger"] == "elastic_dew.test"
    assert "step" not in first and "slices" not in first
    assert (second["severity"], second["message"], second["step"], second["slices"]) == (
        "WARNING", "lost slice 2", 12, 3
    )
    assert third["severity"] == "CRITICAL" and third["step"] == 12 and "slices" not in third
    assert second["time"].endswith("Z")
    assert second["logging.googleapis.com/sourceLocation"]["function"] == (
        "test_json_lines_carry_severity_message_logger_and_the_known_step_and_slices"
    )


def test_an_exception_lands_in_the_message_of_an_error_line():
    stream = io.StringIO()
    setup_logging("json", stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("step failed")
    (line,) = _lines(stream)
    assert line["severity"] == "ERROR"
    assert line["message"].startswith("step failed\nTraceback")
    assert "RuntimeError: boom" in line["message"]


def test_debug_and_custom_levels_map_onto_cloud_logging_names():
    formatter = JsonFormatter(LogContext())
    for level, name in ((logging.DEBUG, "DEBUG"), (5, "DEBUG"), (25, "INFO"), (35, "WARNING")):
        record = logging.LogRecord("x", level, __file__, 1, "m", None, None)
        assert json.loads(formatter.format(record))["severity"] == name


def test_auto_is_text_on_a_terminal_and_json_lines_elsewhere():
    terminal, pipe = Terminal(), io.StringIO()
    setup_logging("auto", terminal)
    logging.getLogger("elastic_dew.t").warning("hello")  # (routine INFO lines go to the run log there)
    setup_logging("auto", pipe)
    logging.getLogger("elastic_dew.t").info("hello")
    assert "WARNING elastic_dew.t: hello" in terminal.getvalue()
    with pytest.raises(ValueError):
        json.loads(terminal.getvalue())
    assert _lines(pipe)[0]["message"] == "hello"
    assert len(logging.getLogger().handlers) == 1  # switching format replaces the handler


def test_an_unknown_format_is_refused_before_the_handlers_change():
    before = list(logging.getLogger().handlers)
    with pytest.raises(ValueError, match="auto.*text.*json"):
        setup_logging("yaml", io.StringIO())  # type: ignore[arg-type]
    assert logging.getLogger().handlers == before


def test_verbose_turns_on_elastic_dews_debug_lines_and_leaves_other_libraries_at_info():
    from elastic_dew import cli


    assert cli.main(["-v", "report", "/nonexistent-run"]) != 0  # refused; -v is set by then
    try:
        stream = io.StringIO()
        setup_logging("json", stream)
        logging.getLogger("elastic_dew.report").debug("ours")
        logging.getLogger("matplotlib.font_manager").debug("findfont: a page of these")
        logging.getLogger("matplotlib.font_manager").info("kept")
        assert [line["message"] for line in _lines(stream)] == ["ours", "kept"]
    finally:
        set_verbose(False)
    assert not logging.getLogger("elastic_dew.report").isEnabledFor(logging.DEBUG)


def _slice_loss_record(error: BaseException, message: str = "Elastic event detected") -> str:
    stream = io.StringIO()
    setup_logging("json", stream)
    manager = logging.getLogger("pathwaysutils.elastic.manager")
    try:
        raise error
    except BaseException:
        manager.exception(message)  # as Manager.elastic_retry logs a handled slice loss
    (line,) = _lines(stream)
    return line


def test_pathwaysutils_handled_slice_loss_is_one_warning_line_naming_the_error():
    import jax

    line = _slice_loss_record(jax.errors.JaxRuntimeError("DATA_LOSS: slice 3 is gone\nmore detail"))
    assert line["severity"] == "WARNING"
    assert line["message"] == (
        "Elastic event detected: handled slice loss (DATA_LOSS: slice 3 is gone); recovering"
    )


def test_the_handled_slice_loss_keeps_its_traceback_with_elastic_dews_debug_lines_on():
    import jax

    set_verbose(True)
    try:
        line = _slice_loss_record(jax.errors.JaxRuntimeError("DATA_LOSS: slice 3 is gone"))
    finally:
        set_verbose(False)
    assert line["severity"] == "WARNING" and "Traceback" in line["message"]


def test_other_errors_of_pathwaysutils_stay_errors():
    import jax

    assert _slice_loss_record(RuntimeError("not a slice loss"))["severity"] == "ERROR"
    assert _slice_loss_record(jax.errors.JaxRuntimeError("DATA_LOSS"),
                              "Error in monitor thread loop")["severity"] == "ERROR"
