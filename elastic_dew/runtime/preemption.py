"""How a run learns it is being preempted, and how it says it stopped for that reason.

:class:`PreemptionNotice` answers, once a step, whether a preemption notice reached the
run (in a pool, one step agreed by every process). :class:`Preempted` is what the run
raises after writing that step's checkpoint; uncaught, it ends the program with
:data:`PREEMPTED_EXIT`, the status SIGTERM itself would have left, once the program
called :func:`install_exit_hook` at its start. Importing this module changes nothing in
the process: the hook is installed only by that explicit call (``prepare_process`` makes
it too).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn

from elastic_dew._compat import python as python_private

__all__ = ["PREEMPTED_EXIT", "Preempted", "PreemptionNotice", "NoticeInWait", "install_exit_hook", "exit_preempted"]

logger = logging.getLogger(__name__)

#: The exit status of a program that stopped at a preemption notice: 128 + SIGTERM, the
#: status SIGTERM itself would have left.
PREEMPTED_EXIT = 128 + signal.SIGTERM


class Preempted(Exception):
    """The run stopped at a preemption notice, at ``step``, with that step's checkpoint
    and data position written: ``step`` is always the step a re-run resumes after, 0 when
    nothing could be persisted (a notice during a recovery with no snapshot or checkpoint
    to save, or no checkpoint directory).

    Uncaught in a program that called :func:`install_exit_hook`, it ends the program with
    :data:`PREEMPTED_EXIT` and no traceback, the way SIGTERM itself would have; the same
    program run again resumes from the checkpoint.

    Args:
        step: the step a re-run resumes after (0: nothing could be persisted).
    """

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted at step {step}")
        self.step = step

    def __reduce__(self):
        return (type(self), (self.step,))


class NoticeInWait(BaseException):
    """A preemption notice that arrived while the run waited (for slices), raised from the
    notice's SIGTERM handler so that the wait ends at once instead of at a step boundary the
    waiting run may never reach. A ``BaseException``, like ``KeyboardInterrupt``, so that no
    ``except Exception`` on the way (pathwaysutils' wait, a health check) swallows it; the
    run turns it into :class:`Preempted` after persisting what it can.
    """


def _interpreter_shutdown():
    """The interpreter's own shutdown steps, which only private functions expose.

    Once ``sys.excepthook`` returns, the interpreter exits with status 1 and nothing can
    change that, so the hook has to shut the interpreter down itself and leave with
    ``os._exit``. Python offers no public way to run that shutdown:
    ``threading._shutdown`` is its first part (it runs the threading atexit callbacks,
    which tell idle ``ThreadPoolExecutor`` workers such as Grain's and Orbax's to stop,
    and then joins non-daemon threads; joining them without those callbacks would wait for
    ever), and ``atexit._run_exitfuncs`` is its second. An ``atexit`` callback that calls
    ``os._exit`` is no substitute: callbacks run last-registered first, so every callback
    registered before it (logging's among them) would be skipped. Both functions are
    declared in the seam (:mod:`elastic_dew._compat.python`), whose canary fails loudly if
    a Python release removes either.
    """
    return python_private.interpreter_shutdown()


def exit_preempted() -> NoReturn:
    """End the process now with :data:`PREEMPTED_EXIT`, once the stop is durable.

    Call it only where the process ends anyway (a program's exit path), after the stop's
    checkpoint was committed and the run record closed. It does what must close for
    correctness, as the interpreter's shutdown would: in the main thread it joins the
    non-daemon threads (a writer still writing finishes; idle ``ThreadPoolExecutor``
    workers are told to stop first), runs every ``atexit`` callback (the libraries' own:
    child processes ended, buffers flushed), flushes the logs and the standard streams; then
    it leaves with ``os._exit``. What it skips is the interpreter's finalisation (freeing
    every object and module the run left, the backends' teardown), which writes nothing a
    re-run reads and only delays the exit.
    """
    join_threads, run_exitfuncs = _interpreter_shutdown()
    if threading.current_thread() is threading.main_thread():
        join_threads()
    try:
        run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed stream must not change the status
                pass
        os._exit(PREEMPTED_EXIT)


def _preempted_excepthook(exc_type, exc, tb) -> None:
    if not (isinstance(exc_type, type) and issubclass(exc_type, Preempted)):
        _previous_excepthook(exc_type, exc, tb)
        return
    logger.info("%s: exiting with status %d", exc, PREEMPTED_EXIT)
    exit_preempted()


_previous_excepthook = sys.excepthook


def install_exit_hook() -> None:
    """Make an uncaught :class:`Preempted` end the program with :data:`PREEMPTED_EXIT`.

    Call it once at program start (the ``elastic-dew`` CLI, each recipe's ``main()`` and
    :func:`~elastic_dew.runtime.prepare_process` do). It replaces ``sys.excepthook`` with
    a hook that, for ``Preempted``, ends the process as :func:`exit_preempted` does
    (non-daemon threads joined, ``atexit`` handlers run, the streams flushed) with
    status 143 and no traceback; every other exception goes to the hook that was there
    before. Calling it again changes nothing.
    """
    global _previous_excepthook
    if sys.excepthook is not _preempted_excepthook:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _preempted_excepthook


class PreemptionNotice:
    """Whether a preemption notice reached the run, asked once a step, from creation until
    :meth:`close`.

    A scheduler stops a job with SIGTERM and SIGKILLs it a grace period later. In a pool,
    JAX's preemption service takes the SIGTERM (XLA's notifier replaces the handler when
    the pool forms, so the process runs on), shares the notice through the coordination
    service, and :meth:`reached` agrees one step on every process. A pool whose preemption
    service is off (``jax_enable_preemption_service``) never reports a notice, and SIGTERM
    ends it as it always did. A process outside any pool, the Pathways controller
    included, has no such service: the notice is SIGTERM itself, caught from creation
    until :meth:`close`. A second SIGTERM is logged and ignored: the run is already
    stopping. Use it as a context manager to close it on the way out.

    Raises:
        RuntimeError: created outside a pool in a thread other than the main one (only the
            main thread may catch SIGTERM).
    """

    def __init__(self) -> None:
        import jax

        self._pooled = jax.distributed.is_initialized()
        # The pool made its preemption service when it formed, if this option was on then.
        self._service = self._pooled and bool(jax.config.jax_enable_preemption_service)  # type: ignore[attr-defined]  # jax.config declares its options at run time
        self._signals = 0
        self._reported = False
        self._previous: Any = None
        self._closed = False
        self._waiting = False
        #: When the notice arrived (``time.monotonic()``), or ``None``: the grace window runs from it.
        self.received: float | None = None
        if self._pooled:
            if not self._service:
                logger.info(
                    "the JAX preemption service is off (jax_enable_preemption_service): "
                    "this pool gets no preemption notice, and SIGTERM ends it"
                )
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "PreemptionNotice() outside a pool catches SIGTERM, which Python allows only "
                "in the main thread; create it there"
            )
        self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame) -> None:
        self._signals += 1
        if self._signals == 1:
            self.received = time.monotonic()
        if self._signals == 1 and self._waiting:
            self._waiting = False
            logger.warning("SIGTERM while waiting for slices: preemption notice, ending the wait")
            raise NoticeInWait()
        if self._signals == 1:
            logger.warning("SIGTERM: preemption notice, stopping at the next step")
        else:
            logger.warning("SIGTERM again (%d): ignored, already stopping", self._signals)

    def begin_wait(self) -> None:
        """The run starts waiting (for slices): a notice ends the wait at once.

        A notice that arrived before the wait (a SIGTERM just before a slice loss, whose
        step boundary never came) raises :class:`NoticeInWait` here, and one that arrives
        during the wait raises it from the handler: either way the run stops now, not at
        a step boundary after a wait the scheduler's grace period may not outlast.
        Outside a pool only: a pool's notice comes through JAX's preemption service, which
        agrees one stop step on every process at step boundaries, so a pooled wait ends
        on its own ``timeout`` and the agreed step's boundary stops the run after it.

        Raises:
            NoticeInWait: a notice arrived before the wait began (a ``BaseException``, so no
                ``except Exception`` on the way swallows it; the protocol turns it into
                :class:`Preempted`).
        """
        if self._pooled or self._closed:
            return
        if self._signals:
            logger.warning("a preemption notice is pending as the wait for slices begins: ending the wait")
            raise NoticeInWait()
        self._waiting = True

    def end_wait(self) -> None:
        """The wait is over: a notice is again only noted, for the next step boundary."""
        self._waiting = False

    def reached(self, step: int) -> bool:
        """Whether to stop at ``step``: in a pool, whether every process agreed on it;
        alone, whether SIGTERM arrived.

        Args:
            step: the step just completed.

        Returns:
            Whether the run stops after ``step``.
        """
        if self._pooled:
            hit = self._service and _reached_sync_point(int(step))
        else:
            hit = self._signals > 0
        if hit and not self._reported:
            self._reported = True
            logger.warning("preemption notice reached: stopping at step %d", step)
        return hit

    def interrupts(self) -> bool:
        """Whether work between two step boundaries (an evaluation pass) stops now, to be
        done again after the resume: alone, whether SIGTERM arrived. In a pool, never: JAX's
        preemption service agrees a stop only where every process asks with the same step
        (:meth:`reached`), so a pooled pass runs to its end and the boundary after it stops.

        Returns:
            Whether the work in progress stops now.
        """
        return not self._pooled and self._signals > 0

    def close(self) -> None:
        """Put back the SIGTERM handler this notice replaced."""
        if self._closed:
            return
        self._closed = True
        if not self._pooled and self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def __enter__(self) -> PreemptionNotice:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _reached_sync_point(step: int) -> bool:
    """JAX's preemption service: whether every process of the pool agreed to stop at ``step``.

    Asked only of a pool formed with the service on (``jax_enable_preemption_service``,
    read when the notice is created); JAX raises ``RuntimeError`` for a pool without one.
    """
    from jax.experimental import multihost_utils

    return bool(multihost_utils.reached_preemption_sync_point(step))
