"""A run shown on a terminal: its progress display, its logs routed above it, its summary.

``elastic-dew train`` and each recipe's ``python -m elastic_dew.recipes.NAME`` show a run the same way
(:class:`Terminal`, the :class:`~elastic_dew.run.execution.Display` of a program on a terminal); the
options they take are the console's (:mod:`elastic_dew.console`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from elastic_dew import run
from elastic_dew.run import execution
from elastic_dew.run import planning
from elastic_dew.observe import sinks as observing
from elastic_dew.settings import SettingError

__all__ = ["Terminal"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def _quiet_logs(tty: bool) -> Iterator[None]:
    """Keep the output about the run: the progress display reports steps (the trainer's own
    step lines would repeat them), and Orbax's per-file INFO lines (through absl) drown
    everything else unless ``-v`` asked for debug output. On a terminal every routine line
    goes to the run log rather than the terminal (``elastic_dew.observe.logs``), so only the
    trainer's step lines are left out there."""
    from elastic_dew.observe.logs import is_verbose

    quiet = [logging.getLogger("elastic_dew.trainer")]
    if not is_verbose() and not tty:
        # On a terminal the routine lines go to the run log instead (observe.logs.RunLog).
        quiet.append(logging.getLogger("absl"))
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


class Terminal:
    """A run shown on a terminal: ``PROG: error: ...`` for a refusal, a progress display with
    the logs routed above it while it runs, then the summary table and the timeline's path.

    Args:
      prog: the program's name, heading a refusal.
      out, err: where the summary and a refusal go (default: stdout, stderr).
      observe: the observability options the program started with.
      summary: whether the summary is shown at the end (the demo shows its own).
      word: how a refusal is worded (the console's: each setting named by its flag).
    """

    def __init__(self, prog: str, out: TextIO | None = None, err: TextIO | None = None,
                 observe: observing.ObserveOptions | None = None, summary: bool = True,
                 word: Callable[[ValueError], str] = str) -> None:
        self.prog, self._out, self._err, self.summary, self._word = prog, out, err, summary, word
        self.observe = observe if observe is not None else observing.ObserveOptions()

    def refused(self, error: run.UsageError | SettingError) -> None:
        (self._err or sys.stderr).write(f"{self.prog}: error: {self._word(error)}\n")

    @contextlib.contextmanager
    def running(self, plan: planning.RunPlan) -> Iterator[list[Any]]:
        from elastic_dew.observe.logs import attach_run_log, is_terminal

        if getattr(plan, "run_dir", None) is not None:
            attach_run_log(plan.run_dir)  # a terminal's routine lines go to RUN_DIR/run.log
        total_slices = plan.sim.slices if plan.sim is not None else None
        progress: Any
        tty = is_terminal(sys.stderr)
        if tty:
            # tqdm's bar: it fits the width, has an ETA, and writes log records above it.
            from elastic_dew.observe.progress_bar import ProgressBar

            progress = ProgressBar(plan.steps, total_slices=total_slices)
            above: contextlib.AbstractContextManager[None] = progress.redirect_logging()
        else:
            from elastic_dew.observe.progress import Progress

            progress = Progress(plan.steps, total_slices=total_slices, log_every=plan.train.log_every)
            above = contextlib.nullcontext()
        try:
            with above, _quiet_logs(tty):
                yield [progress]
        finally:
            progress.close()

    def finished(self, plan: planning.RunPlan, outcome: execution.RunOutcome) -> None:
        if outcome.status != 0 or not self.summary:
            return
        from elastic_dew import record

        picture = None
        try:
            picture = record.draw_timeline(outcome.run_dir)
        except RuntimeError as err:  # matplotlib missing
            logger.warning("%s", err)
        out = self._out or sys.stdout
        out.write(record.format_summary(outcome.result.summary, outcome.run_dir) + "\n")
        if picture is not None:
            out.write(f"\ntimeline: {picture}\n")
