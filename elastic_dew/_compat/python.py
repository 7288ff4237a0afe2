"""The Python interpreter's private names elastic_dew uses (read against CPython 3.11 to 3.13).

An uncaught ``Preempted`` must end the program with status 143, but once ``sys.excepthook``
returns the interpreter exits with status 1 and nothing can change that: the runtime's exit
hook runs the interpreter's shutdown itself and leaves with ``os._exit``. Python offers no
public way to run that shutdown; its two steps are here.
"""

from __future__ import annotations

from collections.abc import Callable

from elastic_dew._compat import Private

__all__ = ["PRIVATE", "interpreter_shutdown", "running_frames"]

_THREADING_SHUTDOWN = Private(
    "python",
    "threading:_shutdown",
    why="the shutdown's first step: runs the threading atexit callbacks (which tell idle "
    "ThreadPoolExecutor workers, Grain's and Orbax's, to stop) and joins non-daemon threads; "
    "joining them without those callbacks would wait for ever",
    instead="a public interpreter shutdown (sys.exit cannot set the status from an excepthook)",
)
_RUN_EXITFUNCS = Private(
    "python",
    "atexit:_run_exitfuncs",
    why="the shutdown's second step, every atexit callback in order (an atexit callback that "
    "calls os._exit would skip each registered before it, logging's among them)",
    instead="a public interpreter shutdown (sys.exit cannot set the status from an excepthook)",
)

_CURRENT_FRAMES = Private(
    "python",
    "sys:_current_frames",
    why="the frame each thread runs now: the simulator's watch tells a frame that still runs "
    "(its locals hold what the program keeps) from one only a traceback keeps",
    instead="none public (threading gives no thread's frame; faulthandler only prints them)",
)

PRIVATE: tuple[Private, ...] = (_THREADING_SHUTDOWN, _RUN_EXITFUNCS, _CURRENT_FRAMES)


def interpreter_shutdown() -> tuple[Callable[[], None], Callable[[], None]]:
    """The interpreter's own shutdown steps: (join the threads, run the atexit callbacks)."""
    return _THREADING_SHUTDOWN.get(), _RUN_EXITFUNCS.get()


def running_frames() -> set[int]:
    """The ids of every frame some thread runs now (each thread's stack, outwards)."""
    ids: set[int] = set()
    for frame in _CURRENT_FRAMES.get()().values():
        while frame is not None:
            ids.add(id(frame))
            frame = frame.f_back
    return ids
