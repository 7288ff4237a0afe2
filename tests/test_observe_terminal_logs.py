"""On a terminal, a person reads the run: warnings, errors and the progress display's lines;
the routine INFO lines (JAX's backend, elastic_dew's own) go to ``RUN_DIR/run.log``, and to
the terminal too with ``-v``. JSON lines, for Cloud Logging, are unchanged."""

from __future__ import annotations

import io
import json
import logging

import pytest

from elastic_dew.observe import logs


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restored_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logs.set_verbose(False)


def _lines():
    logging.getLogger("jax._src.xla_bridge").info("Unable to initialize backend 'tpu'")
    logging.getLogger("elastic_dew.elastic.loop.compiler").info("precompiled the step for devices [0, 1]")
    logging.getLogger("elastic_dew.observe.progress").info("step 10/20  loss 1.5")
    logging.getLogger("elastic_dew.simulate.runner").warning("firing scheduled fault lose:1@5")


def test_a_terminal_shows_warnings_and_progress_and_the_run_log_gets_every_line(tmp_path, restored_logging):
    terminal = _Terminal()
    logs.setup_logging("auto", terminal)
    _lines()  # before the run directory is known: held
    assert logs.attach_run_log(tmp_path) == tmp_path / logs.RUN_LOG_FILE
    logging.getLogger("jax").info("Resetting cache")
    shown = terminal.getvalue()
    assert "step 10/20" in shown and "firing scheduled fault" in shown
    assert "Unable to initialize backend" not in shown and "precompiled" not in shown
    written = (tmp_path / logs.RUN_LOG_FILE).read_text()
    for text in ("Unable to initialize backend", "precompiled", "step 10/20", "firing scheduled fault",
                 "Resetting cache"):
        assert text in written


def test_with_v_the_terminal_shows_the_routine_lines_too(tmp_path, restored_logging):
    terminal = _Terminal()
    logs.set_verbose(True)
    logs.setup_logging("auto", terminal)
    _lines()
    assert "Unable to initialize backend" in terminal.getvalue() and "precompiled" in terminal.getvalue()


def test_json_lines_off_a_terminal_are_unchanged(restored_logging):
    pipe = io.StringIO()
    logs.setup_logging("auto", pipe)
    _lines()
    records = [json.loads(line) for line in pipe.getvalue().splitlines()]
    assert [r["severity"] for r in records] == ["INFO", "INFO", "INFO", "WARNING"]
    assert logs.attach_run_log("unused") is None


def test_a_run_directory_holding_only_its_run_log_is_still_a_run_directory(tmp_path, restored_logging):
    from elastic_dew import rundir

    logs.setup_logging("auto", _Terminal())
    logs.attach_run_log(tmp_path)  # before the trainer checks the directory
    logging.getLogger("jax").info("Resetting cache")
    rundir.check(tmp_path)
