"""A timeout on how long a step's result may take: a slice that stops answering is a slice loss.

A slice that hangs (a worker that stops answering without an error) makes the read of a
step's result wait for ever, and pathwaysutils' retry only acts on an error. The
:class:`StepDeadline` reads the result in a worker thread and waits for it at most
:meth:`StepDeadline.seconds`; past that it raises the ``DEADLINE_EXCEEDED`` runtime error
pathwaysutils counts as a slice down, so the run recovers (waits for slices, restores the
newest state) instead of hanging. The worker stuck on the hung read is abandoned (a daemon
thread) and a fresh one takes the next read.

:func:`read_each` limits several reads the same way (the slice health check's probes, one
per slice): a read past the timeout is reported late, not waited for.

The timeout is ``ElasticConfig.step_timeout`` when set. Otherwise it follows the run: 20
times the median of the last 100 completed steps' times, never under 60 s, or never under
600 s when the run waits for every slice (pause-resume); until 5 steps have been timed in
this process (the first steps pay one-time costs) it is 600 s.

Why the floors (``docs/elastic.md``, "The step deadline and Pathways' transparent
suspend"): a slice whose worker Pathways suspended transparently (a preempted worker's
state saved, the worker resumed when GKE reschedules its pod) stops answering for as long
as the rescheduling takes, then completes its work with no error. Declaring it lost re-does
the steps since the last snapshot and recompiles, twice (at the loss and at its return).
A run that waits for every slice gains nothing from that: it must wait for the slice
anyway, so it waits up to :data:`PAUSE_FLOOR`. A run that carries on without a slice
(replica-resize) trains on the survivors meanwhile, so past :data:`FLOOR` a stall is
cheaper as a slice loss and a scale-up when the slice returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import statistics
import threading
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

import jax

__all__ = ["StepDeadline", "read_each", "ReadThread", "MULTIPLE", "FLOOR", "PAUSE_FLOOR", "BEFORE_TIMED", "TIMED_STEPS",
           "WINDOW"]

logger = logging.getLogger(__name__)

#: The automatic timeout: this many times the median step ...
MULTIPLE = 20.0
#: ... but never under this many seconds (a run that carries on without a slice) ...
FLOOR = 60.0
#: ... or this many, in a run that waits for every slice (pause-resume) ...
PAUSE_FLOOR = 600.0
#: ... and this many seconds until :data:`TIMED_STEPS` steps have been timed.
BEFORE_TIMED = 600.0
TIMED_STEPS = 5
#: The median is over this many most recent steps.
WINDOW = 100

_T = TypeVar("_T")
_K = TypeVar("_K", bound=Hashable)


class StepDeadline:
    """Reads a step's result within a timeout, else raises ``DEADLINE_EXCEEDED``.

    ``fixed`` is ``ElasticConfig.step_timeout`` (``None``: automatic, from the steps timed
    with :meth:`observe`). ``waits_for_every_slice``: the run pauses while any slice is
    down (``minimum_slice_count=None``), so the automatic timeout is never under
    :data:`PAUSE_FLOOR` instead of :data:`FLOOR`.

    Args:
        fixed: the timeout in seconds, or ``None`` for the automatic one.
        waits_for_every_slice: the run waits for every slice (pause-resume).

    Raises:
        ValueError: ``fixed`` is not above 0.
    """

    def __init__(self, fixed: float | None = None, *, waits_for_every_slice: bool = False) -> None:
        if fixed is not None and not fixed > 0:
            raise ValueError(f"step_timeout={fixed} must be > 0 seconds, or None for automatic")
        self.fixed = fixed
        self.floor = PAUSE_FLOOR if waits_for_every_slice else FLOOR
        self._times: deque[float] = deque(maxlen=WINDOW)
        self._reader: ReadThread | None = None
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        """Count one completed step's time towards the automatic timeout.

        Args:
            seconds: the step's wall time.
        """
        self._times.append(seconds)

    def seconds(self) -> float:
        """The timeout now.

        Returns:
            Seconds a read may take.
        """
        if self.fixed is not None:
            return self.fixed
        if len(self._times) < TIMED_STEPS:
            return BEFORE_TIMED
        return max(self.floor, MULTIPLE * statistics.median(self._times))

    def read(self, read: Callable[[], _T], step: int, ready: Callable[[], bool] | None = None) -> _T:
        """``read()`` (a read of step ``step``'s result), within :meth:`seconds`.

        ``ready`` (the result's ``is_ready``) says whether the result has arrived: then
        nothing can hang and it is read on the calling thread, without the hand-off to the
        reading thread (with the read one step behind, the common case).

        Args:
            read: reads the result (``lambda: float(loss)``).
            step: the step whose result it is (named in the error).
            ready: says whether the result has arrived, or ``None``.

        Returns:
            What ``read`` returned.

        Raises:
            jax.errors.JaxRuntimeError: ``DEADLINE_EXCEEDED`` when the result does not arrive
                in time (pathwaysutils counts it as a slice down); an error of the read
                itself is raised as it is.
        """
        if ready is not None and ready():
            return read()
        timeout = self.seconds()
        with self._lock:
            if self._reader is None:
                self._reader = ReadThread()
            reader = self._reader
        future = reader.submit(read)
        del read  # the reader holds it only until it ran: a failed step's arrays must go
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            with self._lock:
                if self._reader is reader:
                    self._reader = None  # its thread is stuck on the hung read: leave it behind
            reader.stop()
            logger.error("step %d's result did not arrive within %.3g s: treating it as a lost slice", step, timeout)
            raise jax.errors.JaxRuntimeError(
                f"DEADLINE_EXCEEDED: step {step}'s result did not arrive within {timeout:.3g} s "
                "(the step deadline, ElasticConfig.step_timeout): a slice stopped answering (elastic_dew.elastic.deadline)"
            ) from None
        finally:
            del future  # its error's traceback holds this frame: no cycle keeps arrays alive

    def close(self) -> None:
        """Let the reading thread go (it ends once its read, if any, returns)."""
        with self._lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.stop()


def read_each(
    reads: Mapping[_K, Callable[[], _T]], seconds: float
) -> tuple[dict[_K, concurrent.futures.Future], list[_K]]:
    """Run ``reads`` in turn on a reading thread, waiting at most ``seconds`` for each.

    Returns ``(done, late)``: ``done`` maps each read that finished in time to its future
    (``result()`` gives its value or raises its error), ``late`` lists the reads that did
    not. A late read's thread is abandoned (it is stuck on that read) and the reads after
    it go on in a fresh thread, each with its own ``seconds``: one hung read costs one bound
    and never makes a healthy read after it late. With nothing late one thread does it all.
    """
    if not seconds > 0:
        raise ValueError(f"seconds={seconds} must be > 0")
    pending = list(reads)
    done: dict[_K, concurrent.futures.Future] = {}
    late: list[_K] = []
    while pending:
        reader = ReadThread()
        submitted = [(key, reader.submit(reads[key])) for key in pending]
        pending = []
        try:
            for position, (key, future) in enumerate(submitted):
                finished, _ = concurrent.futures.wait([future], timeout=seconds)
                if finished:
                    done[key] = future
                    continue
                late.append(key)
                for later_key, later in submitted[position + 1:]:
                    later.cancel()  # the stuck thread skips it if it ever gets there
                    pending.append(later_key)
                break
        finally:  # also when a signal handler raises here (a preemption notice in a wait)
            reader.stop()
    return done, late


class ReadThread:
    """One daemon thread running reads in turn, for as long as its user reads (a thread per
    read would start one every step): the step deadline's, :func:`read_each`'s, and the
    training data's (:func:`~elastic_dew.elastic.loop.data.read_within`). A read stuck on a
    hung slice or a stalled storage never keeps the process from exiting
    (``concurrent.futures`` threads are joined at exit).

    Args:
        role: what the thread reads; it is named ``elastic-dew-ROLE``.
    """

    def __init__(self, role: str = "read") -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"elastic-dew-{role}", daemon=True)
        self.thread.start()

    def submit(self, read: Callable[[], _T]) -> concurrent.futures.Future:
        """Run ``read`` after the reads before it; its future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((read, future))
        return future

    def __call__(self, job: Callable[[], None]) -> threading.Thread:
        """Run ``job`` after the reads before it; the thread (a ``runner`` of
        :func:`~elastic_dew.elastic.state.storage.bounded`)."""
        self.submit(job)
        return self.thread

    def stop(self) -> None:
        """End the thread once the read it runs, if any, returns."""
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            read, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(read())
            except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(error)
                del error
            # Nothing of a finished read stays referenced here (a failed attempt's arrays
            # must be freed before the next attempt starts).
            del item, read, future
