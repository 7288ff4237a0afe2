"""Which of an earlier attempt's arrays the program still holds, and by what: a search of the heap.

At an attempt's first step the watch asks, of the device arrays earlier attempts' steps
made, which something the program can still reach references (a chain of referrers up to a
running frame or a module's globals; a frame no thread runs, kept by a traceback, holds
nothing), and names the holders as a user would (a global, a local variable, a closure).
Python's public ``gc`` referrer lists only.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

from elastic_dew._compat import python as python_private
from elastic_dew.simulate.frames import LIBRARIES, THROUGH, in_modules
from elastic_dew.simulate.pathways_guards import live_arrays

__all__ = ["held_arrays", "holders", "live_frames", "still_held"]

#: The modules whose own frames and lists are the search's, never a holder.
_SEARCHING = ("elastic_dew.simulate.watch", "elastic_dew.simulate.watch_heap")


def held_arrays(inputs: list[Any], earlier: Callable[[Any], bool],
                described: int) -> tuple[list[Any], list[str]] | None:
    """The live device arrays ``earlier`` says an earlier attempt made, other than the step's
    ``inputs``, that the program still holds, and what holds the first ``described`` of them.

    Args:
        inputs: the arrays the attempt's first step was dispatched on (carried over on purpose).
        earlier: whether an array was made by an earlier attempt's steps.
        described: how many held arrays get their holders named (each a scan of the heap).

    Returns:
        ``(held, holders)``, or ``None`` when nothing is held.
    """
    gc.collect()
    carried = {id(a) for a in inputs}
    frames = live_frames()
    live = live_arrays()
    candidates = [array for array in live if earlier(array) and id(array) not in carried
                  and not array.is_deleted() and array.sharding.memory_kind != "pinned_host"]
    ours = {id(live), id(candidates), id(inputs)}
    kept = still_held(candidates, ours, frames)
    held = [array for array in candidates if id(array) in kept]
    if not held:
        return None
    names: list[str] = []
    first = held[:described]
    for array in first:
        for what in holders(array, ours | {id(held), id(first)}, frames):
            if what not in names:
                names.append(what)
    return held, names


def live_frames() -> set[int]:
    """The ids of every frame running now, on every thread."""
    return python_private.running_frames()


def _is_dead_frame(obj: Any, live_frames: set[int]) -> bool:
    """A frame no thread runs any more (held by a traceback: a log handler that keeps
    records keeps the failed attempt's frames; that is not the program holding state)."""
    return type(obj).__name__ == "frame" and id(obj) not in live_frames


def _foreign(obj: Any, ours: set[int], live_frames: set[int]) -> bool:
    """Whether ``obj`` is a referrer that counts: not a dead frame, not this module's own
    frames or lists."""
    if id(obj) in ours or _is_dead_frame(obj, live_frames):
        return False
    return not (type(obj).__name__ == "frame" and obj.f_globals.get("__name__") in _SEARCHING)


def _referrers(*objects: Any) -> list[Any]:
    """What references any of ``objects`` (``gc.get_referrers``), less the call's own argument
    tuple: Python 3.13's collector tracks that tuple, which holds every one of ``objects``, so
    a climb from it would find its own arguments at every level and never end."""
    found = gc.get_referrers(*objects)
    return [referrer for referrer in found if referrer is not objects]


#: How many levels of referrers :func:`still_held` climbs before it counts an array as held.
_LEVELS = 10


def still_held(candidates: list[Any], ours: set[int], live_frames: set[int]) -> set[int]:
    """The ids of the ``candidates`` something the program can still reach references: a
    chain of referrers from the array up to a running frame or a module's globals. A chain
    that ends at a frame no thread runs (a traceback kept by a log handler keeps the failed
    attempt's frames, their locals and their loops' iterators) holds nothing. One scan of
    the heap per level, for every candidate at once."""
    origins: dict[int, set[int]] = {id(c): {id(c)} for c in candidates}
    frontier: dict[int, Any] = {id(c): c for c in candidates}
    seen = set(frontier)
    held: set[int] = set()
    for _ in range(_LEVELS):
        if not frontier:
            return held
        objects = tuple(frontier.values())
        found = _referrers(*objects)
        following: dict[int, Any] = {}
        mine = ours | {id(objects), id(found), id(frontier), id(following), id(origins), id(candidates)}
        for referrer in found:
            if not _foreign(referrer, mine, live_frames):
                continue
            via = {id(x) for x in gc.get_referents(referrer)} & frontier.keys()
            reached = set().union(*(origins[v] for v in via)) if via else set()
            if type(referrer).__name__ == "frame" or (isinstance(referrer, dict) and _module_of(referrer)):
                held |= reached
            elif id(referrer) not in seen:
                seen.add(id(referrer))
                origins[id(referrer)] = reached
                following[id(referrer)] = referrer
            else:
                origins.setdefault(id(referrer), set()).update(reached)
        frontier = following
        del objects, found
    for key in frontier:  # still climbing: count it held rather than miss a leak
        held |= origins[key]
    return held


def holders(array: Any, ours: set[int], live_frames: set[int]) -> list[str]:
    """What references ``array``, as a user would name it: a global of a module, a local
    variable of a running function, a variable of a closure, found outwards through the
    containers and objects between (breadth first, a few levels)."""
    ours = set(ours)
    seen = {id(array)}
    level: list[tuple[Any, Any]] = [(array, None)]  # (object, the object it references on the way)
    ours.add(id(level))
    names: list[str] = []
    for _ in range(5):
        following: list[tuple[Any, Any]] = []
        ours.add(id(following))
        for obj, _inner in level:
            found = _referrers(obj)
            ours.add(id(found))
            for referrer in found:
                if id(referrer) in seen or not _foreign(referrer, ours, live_frames):
                    continue
                seen.add(id(referrer))
                name = _named(referrer, obj)
                if name is not None:
                    if name and name not in names:
                        names.append(name)
                elif isinstance(referrer, (list, dict, tuple, set)) or hasattr(referrer, "__dict__"):
                    following.append((referrer, obj))
        if names or not following:
            break
        level = following
    return names[:4]


def _module_of(namespace: Any) -> Any:
    return next((m for m in list(sys.modules.values()) if getattr(m, "__dict__", None) is namespace), None)


def _named(referrer: Any, obj: Any) -> str | None:
    """``referrer`` as a name the user knows, holding ``obj``; ``""`` for a holder that is
    not the program's (JAX's or elastic_dew's own frames and closures); ``None`` when it is
    a container or an object to look through."""
    what = type(obj).__name__
    if type(referrer).__name__ == "frame":
        if in_modules(referrer.f_globals.get("__name__", ""), THROUGH + LIBRARIES):
            return ""
        key = next((k for k, v in referrer.f_locals.items() if v is obj), "?")
        return f"the {what} {key}, a local variable of {referrer.f_code.co_name}()"
    if isinstance(referrer, dict) and (module := _module_of(referrer)) is not None:
        key = next((k for k, v in referrer.items() if v is obj), "?")
        return f"the {what} {module.__name__}.{key}"
    if type(referrer).__name__ == "cell":
        functions = [f for t in _referrers(referrer) if isinstance(t, tuple)
                     for f in _referrers(t) if callable(f) and getattr(f, "__closure__", None) is t]
        if not functions or in_modules(getattr(functions[0], "__module__", "") or "", THROUGH + LIBRARIES):
            return ""
        return f"a {what} in the closure of {functions[0].__qualname__}()"
    return None
