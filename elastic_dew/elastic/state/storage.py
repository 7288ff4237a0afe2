"""Bounds on the persistent tier's storage: every save, commit, restore and listing ends.

A bucket that stops answering (or a FUSE mount, or a full or read-only disk) must never hold
the training loop for longer than a known timeout, and must never leave a save that was given
up as the step a restore reads. This module is the one home of:

- the timeout itself, the longest time without activity: :func:`automatic_timeout` (when
  ``storage_timeout`` is not given) sizes it from the state's bytes and the bandwidth the
  run measured so far (:class:`Bandwidth`: activity is counted a request at a time, so the
  timeout must outlast the largest object's transfer), never below :data:`FLOOR_SECONDS`;
  during a preemption's stop the stop's own time is also bounded by what is left of the
  grace window (:func:`grace_seconds`, :func:`stop_timeout`);
- :func:`bounded`: run one blocking storage call in a thread of its own and give up on it
  with :class:`StorageTimeout` once the storage made **no activity** for the timeout (no
  request answered, no byte moved, retries included: what
  :mod:`~elastic_dew.elastic.state.activity` reads from the storage clients), so a slow
  bucket that keeps answering is never taken for a stalled one. Python cannot cancel a
  thread, and neither Orbax nor the Cloud Storage clients can cancel a request, so the call
  is left running (:func:`stuck`), the caller stops using whatever it held (a fresh Orbax
  manager), and a command line run ends its process at once when it is done
  (:func:`end_if_stuck`);
- :class:`StorageError`: what failed (the operation, the storage, the step, the timeout, the
  cause) and :func:`classify`, the wording of a cause (no space, read-only, permission, a
  missing bucket) with its fix;
- the storage libraries' own settings and logs are apart
  (:mod:`~elastic_dew.elastic.state.storage_clients`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from elastic_dew.elastic.state.activity import METER, Meter

__all__ = [
    "FLOOR_SECONDS",
    "ASSUMED_BANDWIDTH",
    "SLACK",
    "GRACE_ENV",
    "DEFAULT_GRACE",
    "StorageError",
    "StorageTimeout",
    "Bandwidth",
    "automatic_timeout",
    "state_bytes",
    "grace_seconds",
    "stop_timeout",
    "bounded",
    "timed_out",
    "stuck",
    "abandoned_write",
    "mark",
    "end_if_stuck",
    "classify",
    "permanent",
    "client_timeout",
    "short",
    "left_since",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The smallest automatic storage timeout: a few minutes, so that a healthy bucket's slow
#: moment (a 429 storm the clients back off from) is never taken for a stall.
FLOOR_SECONDS = 180.0
#: Bytes per second assumed before the run has measured a save (Cloud Storage from one host
#: sustains several times this).
ASSUMED_BANDWIDTH = 20e6
#: The automatic timeout is this many times the state's transfer time at the measured bandwidth.
SLACK = 10.0
#: The environment variable the rendered JobSets set to their ``terminationGracePeriodSeconds``.
GRACE_ENV = "ELASTIC_DEW_GRACE_PERIOD"
#: The grace window when neither the setting nor :data:`GRACE_ENV` gives one: a Spot VM's notice.
DEFAULT_GRACE = 30.0


class StorageError(RuntimeError):
    """A persistent-tier operation that failed or passed its timeout.

    Args:
        message: what happened, with the fix.
        operation: ``save``, ``commit``, ``restore``, ``listing`` (or ``read`` of data).
        storage: the directory or ``gs://`` path.
        step: the step (``None`` for a listing).
        timeout: the seconds it was allowed.
        waited: how long it ran.
        cause: the library's error (``None`` for a timeout).
    """

    def __init__(self, message: str, *, operation: str, storage: str, step: int | None,
                 timeout: float | None = None, waited: float = 0.0, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.operation, self.storage, self.step = operation, storage, step
        self.timeout, self.waited, self.cause = timeout, waited, cause

    @classmethod
    def of(cls, operation: str, storage: str, step: int | None, error: BaseException,
           waited: float = 0.0) -> StorageError:
        """The error of ``operation`` that raised ``error``.

        Args:
            operation: what was done (``save``, ``commit``, ...).
            storage: the directory or ``gs://`` path.
            step: the step (``None`` for a listing).
            error: the library's error, worded by :func:`classify`.
            waited: how long it ran.

        Returns:
            The error, naming the storage, the step, the cause and its fix.
        """
        _, what, fix = classify(error)
        of_step = f" of step {step}" if step is not None else ""
        return cls(
            f"checkpoint {operation}{of_step} in {storage} failed: {what} "
            f"({type(error).__name__}: {short(error)}); {fix}",
            operation=operation, storage=storage, step=step, waited=waited, cause=error,
        )


class StorageTimeout(StorageError):
    """A persistent-tier operation whose storage had no activity for the storage timeout (a
    stalled bucket), or that did not finish within the time it was given (a grace window's share).

    Args:
        message: what happened.
        operation: as :class:`StorageError`'s, and so are the others.
        storage: the directory or ``gs://`` path.
        step: the step (``None`` for a listing).
        timeout: the storage timeout (``idle``), or the seconds it was given.
        waited: how long it ran.
        cause: ``None``.
        idle: whether it had no activity for ``timeout`` (else its given time passed).
    """

    def __init__(self, message: str, *, operation: str, storage: str, step: int | None,
                 timeout: float | None = None, waited: float = 0.0, cause: BaseException | None = None,
                 idle: bool = True) -> None:
        super().__init__(message, operation=operation, storage=storage, step=step, timeout=timeout,
                         waited=waited, cause=cause)
        self.idle = idle


def short(error: BaseException, limit: int = 240) -> str:
    """``error``'s text on one line, at most ``limit`` characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def classify(error: BaseException) -> tuple[str, str, str]:
    """``(kind, what happened, the fix)`` for a storage error raised by Orbax, TensorStore,
    gcsfs, google-cloud-storage or the file system, from its errno or its text; ``kind`` is
    ``full``, ``read_only``, ``permission``, ``missing`` or ``other``."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    codes = {getattr(e, "errno", None) for e in seen}
    text = " ".join(str(e) for e in seen).lower()
    if errno.ENOSPC in codes or "no space left" in text or "resource_exhausted" in text or "disk quota" in text:
        return "full", "the disk is full", "free space there (or give --checkpoint-dir on a larger disk)"
    if errno.EROFS in codes or "read-only file system" in text:
        return "read_only", "the file system is read-only", "remount it writable or give --checkpoint-dir on a writable one"
    if errno.EACCES in codes or errno.EPERM in codes or "permission" in text or _status(text, 403) or "forbidden" in text:
        return ("permission", "permission was refused",
                "grant the job's service account write access (roles/storage.objectUser) or fix the directory's owner")
    if any(isinstance(e, FileNotFoundError) for e in seen) or errno.ENOENT in codes or _status(text, 404) or "not found" in text or "notfound" in text or "does not exist" in text:
        return "missing", "the bucket or directory does not exist", "create it, or give the --checkpoint-dir that exists"
    return "other", "the storage refused or dropped the request", "check the storage's health and run the same command again"


def _status(text: str, code: int) -> bool:
    """Whether ``text`` holds HTTP status ``code`` as a number of its own, not three digits
    inside a path, a temporary directory's name or a hex id (a TensorStore spec's uuid)."""
    return re.search(rf"(?<![0-9a-z_/.\-]){code}(?![0-9a-z_/.\-])", text) is not None


def client_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a storage client's own per-request timeout ending a request that
    got no answer (gcsfs's ``FSTimeoutError``, an ``aiohttp`` or socket timeout,
    TensorStore's ``DEADLINE_EXCEEDED``): the storage stalled, it did not refuse."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return any(isinstance(e, TimeoutError) or "deadline_exceeded" in str(e).lower() for e in seen)


def permanent(failure: StorageError) -> bool:
    """Whether saving again cannot fix ``failure``: a refused permission, or a bucket that does
    not exist (on ``gs://``; a local directory that vanished is created again by the next
    save's fresh manager). The first save that fails so stops the run, where other failures
    count towards ``max_failed_saves``; a timeout never does (the storage may answer again)."""
    if isinstance(failure, StorageTimeout) or failure.cause is None:
        return False
    kind = classify(failure.cause)[0]
    return kind == "permission" or (kind == "missing" and failure.storage.startswith("gs://"))


class Bandwidth:
    """Bytes per second of the saves committed so far (the slowest of the last few, so a
    bucket's bad minute sizes the timeout, not its best one)."""

    KEEP = 5

    def __init__(self) -> None:
        self._rates: deque[float] = deque(maxlen=self.KEEP)

    def add(self, nbytes: int, seconds: float) -> None:
        """One committed save of ``nbytes`` that took ``seconds`` from its start to its commit."""
        if nbytes > 0 and seconds > 0:
            self._rates.append(nbytes / seconds)

    def bytes_per_second(self) -> float:
        """The slowest recent rate, or :data:`ASSUMED_BANDWIDTH` before any save is measured."""
        return min(self._rates) if self._rates else ASSUMED_BANDWIDTH


def automatic_timeout(nbytes: int, bandwidth: Bandwidth | None = None) -> float:
    """The storage timeout when none is given: :data:`SLACK` times the state's transfer time
    at the measured bandwidth, never below :data:`FLOOR_SECONDS`."""
    rate = (bandwidth or Bandwidth()).bytes_per_second()
    return max(FLOOR_SECONDS, SLACK * nbytes / rate)


def state_bytes(tree: Any) -> int:
    """The bytes a checkpoint of ``tree`` holds: each array leaf's global size, once."""
    import jax

    total = 0
    for leaf in jax.tree.leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        itemsize = getattr(dtype, "itemsize", 0) or 8  # a typed key's data: 8 bytes a key is enough here
        total += math.prod(shape) * itemsize
    return total


def grace_seconds(setting: float | None = None, env: dict[str, str] | None = None) -> float:
    """The preemption grace window: ``setting``, else :data:`GRACE_ENV` (which the rendered
    JobSets set from their ``terminationGracePeriodSeconds``), else :data:`DEFAULT_GRACE`.

    Raises ``ValueError`` for a :data:`GRACE_ENV` that is not a number > 0.
    """
    if setting is not None:
        return float(setting)
    value = (os.environ if env is None else env).get(GRACE_ENV)
    if not value:
        return DEFAULT_GRACE
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{GRACE_ENV}={value!r} must be a number of seconds > 0 (the pod's terminationGracePeriodSeconds)")
    return seconds


def stop_timeout(grace: float, noticed: float | None, storage_timeout: float | None = None,
               now: float | None = None) -> float:
    """The timeout on a preemption stop's save: what is left of the grace window, from the
    notice (``noticed``, a ``time.monotonic()``; now when unknown) less a margin for the
    process to exit (a tenth of the window, at least 2 s), and never above ``storage_timeout``
    when one is given (the stop's storage calls are also under the storage timeout's
    no-activity deadline, which :func:`bounded` applies on its own). At least 0.1 s, so the
    save is at least tried."""
    now = time.monotonic() if now is None else now
    margin = max(2.0, 0.1 * grace)
    left = grace - margin - (now - noticed if noticed is not None else 0.0)
    return max(0.1, left if storage_timeout is None else min(storage_timeout, left))


# -------------------------------------------------------------------------- bounded calls

_stuck_lock = threading.Lock()
_stuck: list[threading.Thread] = []


_abandoned_writes = 0


def stuck() -> list[threading.Thread]:
    """The storage calls given up on that are still running (their threads)."""
    with _stuck_lock:
        _stuck[:] = [thread for thread in _stuck if thread.is_alive()]
        return list(_stuck)


def abandoned_write() -> None:
    """Note a write given up on whose library threads may never end (an Orbax save past its
    timeout, forgotten without being waited for), or a run stopped by a storage error whose
    writers' shutdown would only add noise: :func:`end_if_stuck` then ends the process."""
    global _abandoned_writes
    with _stuck_lock:
        _abandoned_writes += 1


def mark() -> tuple[frozenset[threading.Thread], int]:
    """What is stuck now, for :func:`end_if_stuck`'s ``since``."""
    with _stuck_lock:
        return frozenset(_stuck), _abandoned_writes


def timed_out(what: str, *, operation: str, storage: str, step: int | None, timeout: float | None,
              waited: float, idle: bool, measured: bool = True, verb: str = "finish") -> StorageTimeout:
    """The one wording of a storage operation given up on: no activity for the storage timeout
    (``idle``; without a activity meter, not finished within it), or past the time it was given.

    Args:
        what: the operation, as the message names it (``checkpoint save of step 4 in DIR``).
        operation: as :class:`StorageTimeout`'s.
        storage: as :class:`StorageTimeout`'s.
        step: as :class:`StorageTimeout`'s.
        timeout: the storage timeout (``idle``) or the time it was given.
        waited: seconds since it began.
        idle: whether it had no activity for ``timeout``.
        measured: whether activity was measured (else an idle timeout reads as not finished).
        verb: what it did not do in time (``finish``, ``commit``).

    Returns:
        The error, to raise or to record.
    """
    if idle and not measured:
        message = f"{what} did not {verb} within the storage timeout of {timeout:g} s: the storage is not answering"
    elif idle:
        message = (f"{what} had no activity for the storage timeout of {timeout:g} s (no request answered, "
                   f"no byte moved; {waited:.1f} s since it began): the storage is not answering")
    else:
        message = f"{what} did not {verb} within the {timeout:.3g} s it was given"
    return StorageTimeout(message, operation=operation, storage=storage, step=step, timeout=timeout, waited=waited,
                          idle=idle)


def bounded(operation: str, storage: str, step: int | None, timeout: float, call: Callable[[], T],
            *, noun: str = "checkpoint", activity: Meter | None = METER, since: float | None = None,
            total: float | None = None,
            runner: Callable[[Callable[[], None]], threading.Thread] | None = None) -> T:
    """``call()``, given up on with :class:`StorageTimeout` once the storage had no activity
    for ``timeout`` seconds (worded as ``noun`` ``operation``, e.g. ``checkpoint save``).

    Activity is what ``activity`` (:data:`~elastic_dew.elastic.state.activity.METER`, the
    process's storage clients) counts: a request answered, a byte moved, retries included.
    A call that stays active is never given up on for its length. With ``activity``
    ``None`` (a read nothing measures, such as the training data's) ``timeout`` is the call's
    whole duration. ``since`` (a ``time.monotonic()``, default now) is when the operation
    began, for a wait on one that started earlier (a commit in flight); ``total``, when
    given, limits the wait itself, active or not (a grace window's share).

    The call runs in a daemon thread of its own, or on the long-lived thread ``runner``
    hands it to (``runner(job)`` runs ``job`` there and returns that thread, for a call
    made every step); its result is returned and its exception raised as they are (a slice
    lost while a save reads the arrays stays a ``JaxRuntimeError``). A call given up on
    keeps running, its thread listed by :func:`stuck` while alive.

    Raises:
        StorageTimeout: no activity for ``timeout`` seconds, or ``total`` passed.
    """
    box: dict[str, Any] = {}
    done = threading.Event()
    context = _caller_context()

    def target() -> None:
        try:
            with context():
                box["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = error
        finally:
            done.set()

    started = time.monotonic()
    origin = started if since is None else min(since, started)
    if runner is None:
        thread = threading.Thread(target=target, name=f"elastic-dew-storage-{operation}", daemon=True)
        thread.start()
    else:
        thread = runner(target)
    while not done.is_set():
        now = time.monotonic()
        last = origin if activity is None else max(origin, activity.last_activity())
        idle_left = last + timeout - now
        total_left = math.inf if total is None else started + total - now
        if idle_left <= 0 or total_left <= 0:
            with _stuck_lock:
                _stuck.append(thread)
            of_step = f" of step {step}" if step is not None else ""
            raise timed_out(f"{noun} {operation}{of_step} in {storage}", operation=operation, storage=storage,
                            step=step, timeout=timeout if idle_left <= 0 else total, waited=now - origin,
                            idle=idle_left <= 0, measured=activity is not None)
        done.wait(max(0.005, min(idle_left, total_left, _TICK)))
    if "error" in box:
        raise box.pop("error")
    return box.pop("value")


#: The most seconds a bounded call waits between two looks at the activity clock.
_TICK = 0.25


def _caller_context() -> Callable[[], contextlib.AbstractContextManager]:
    """The calling thread's JAX default device, to enter in the thread a bounded call runs in:
    pathwaysutils runs each attempt under ``jax.default_device``, and JAX keys its compile
    cache by the thread's context, so a save's programs compiled ahead are found again."""
    if "jax" not in sys.modules:
        return contextlib.nullcontext
    import jax

    device = jax.config.jax_default_device  # type: ignore[attr-defined]  # jax.config declares its options at run time
    if device is None:
        return contextlib.nullcontext
    return lambda: jax.default_device(device)


def left_since(since: tuple[frozenset[threading.Thread], int]) -> int:
    """How many storage calls or writes given up on after ``since`` (:func:`mark`) may still run."""
    return sum(_left_since(since))


def _left_since(since: tuple[frozenset[threading.Thread], int]) -> tuple[int, int]:
    """The storage calls still waiting, and the writes given up on, since ``since``."""
    threads, writes = since
    waiting = sum(1 for thread in stuck() if thread not in threads)
    with _stuck_lock:
        return waiting, _abandoned_writes - writes


def end_if_stuck(code: int, since: tuple[frozenset[threading.Thread], int] = (frozenset(), 0)) -> None:
    """End the process now with ``code`` when a storage call or write given up on may still run.

    Its thread (and the writer threads of the Orbax manager behind it, which the interpreter
    joins at exit) would otherwise keep the process alive until the storage answers, maybe
    never. Logs and standard streams are flushed first. Returns when nothing was given up
    on after ``since`` (:func:`mark`, taken as a command starts: a program that runs
    commands in its own process is not ended for an earlier one's).
    """
    waiting, given_up = _left_since(since)
    if not waiting + given_up:
        return
    if waiting:
        logger.warning("ending the process with %d storage call(s) still waiting on the storage", waiting)
    else:  # only writers that failed or were given up on: their shutdown would print noise
        logger.info("ending the process without waiting for the storage libraries' writers")
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
