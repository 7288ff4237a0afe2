"""pathwaysutils' private names and look-ups elastic_dew relies on (read against 0.1.13).

Three needs. The elastic layer gives pathwaysutils' ``Manager`` a slice health checker that
compiles once per slice: the ``Manager`` takes no checker, so the one module-level name its
look-ups construct is rebound process-wide. Its handled slice loss is logged at ERROR with a
traceback, which a log filter rewords, by the logger's name and the message's text. And the
simulator stands in for Pathways: it answers pathwaysutils' backend tests and slice
grouping, counts its waits for slices, and runs the ``Manager``'s monitor check under its
lock; each of those is a name pathwaysutils' own code looks up at every call, listed here.
Nothing here imports pathwaysutils (or JAX) until a name is used.
"""

from __future__ import annotations

import inspect
from typing import Any

from elastic_dew._compat import Private

__all__ = [
    "BACKEND_TESTS",
    "DEFAULT_CHECKER",
    "DONATING_OPS",
    "ELASTIC_TIME",
    "GET_SLICE_TO_DEVICES",
    "MANAGER_CHECK",
    "MANAGER_LOGGER",
    "PERSISTENCE_ENABLED",
    "PRIVATE",
    "SLICE_LOSS_MESSAGE",
    "WAIT_FOR_SLICES",
    "check_inactive_slices",
    "slice_loss_message_logged",
]

DEFAULT_CHECKER = Private(
    "pathwaysutils",
    "pathwaysutils.elastic.elastic:DefaultSliceHealthChecker",
    why="get_active_slice_indices(slice_to_devices, None), the end of every Manager path (its "
    "constructor, its monitor thread, elastic_retry's wait), constructs the checker by this "
    "module-level name, and Manager takes no checker: rebinding it is the one way in",
    instead="a Manager(checker=...) parameter passed down to get_active_slice_indices",
    params=("slice_to_devices",),
)
MANAGER_LOGGER = "pathwaysutils.elastic.manager"
SLICE_LOSS_MESSAGE = "Elastic event detected"
_MANAGER_RETRY = Private(
    "pathwaysutils",
    "pathwaysutils.elastic.manager:Manager.elastic_retry",
    why=f"logs a slice loss it handles as an ERROR {SLICE_LOSS_MESSAGE!r} with a traceback on "
    f"the {MANAGER_LOGGER!r} logger; a filter recognises that record by its logger and text",
    instead="a handled slice loss logged at WARNING, or a callback on it",
)
MANAGER_CHECK = Private(
    "pathwaysutils",
    "pathwaysutils.elastic.manager:Manager._check_inactive_slices",
    why="the monitor thread's check of the inactive slices: the simulator runs it under its "
    "lock and calls it at once when a slice's health changes",
    instead="a public Manager method that re-checks the inactive slices now",
)
GET_SLICE_TO_DEVICES = Private(
    "pathwaysutils",
    "pathwaysutils.elastic.elastic:get_slice_to_devices",
    why="Manager reads the slices' grouping through this module-level name; the simulator "
    "rebinds it to answer from its topology",
    instead="the grouping Pathways devices carry (device.slice_index), which CPU devices lack",
    params=("devices",),
)
WAIT_FOR_SLICES = Private(
    "pathwaysutils",
    "pathwaysutils.elastic.elastic:wait_for_slices",
    why="elastic_retry waits for slices through this module-level name; the simulator rebinds "
    "it to know while a loop waits",
    instead="a callback on the start and end of a wait for slices",
)
ELASTIC_TIME = Private(
    "pathwaysutils",
    "pathwaysutils.elastic.elastic:time",
    why="wait_for_slices pauses between its checks with time.sleep through this module "
    "binding; the simulator replaces it so a wait wakes as soon as a slice's health changes",
    instead="a sleep (or clock) parameter of wait_for_slices",
)
_INITIALIZE_BACKEND = Private(
    "pathwaysutils",
    "pathwaysutils._initialize:is_pathways_backend_used",
    why="pathwaysutils' own start-up asks its Pathways backend test by this private module's "
    "name; the simulator answers True there and at pathwaysutils.is_pathways_backend_used",
    instead="none: the backend test has no override",
)
_PUBLIC_BACKEND = Private(
    "pathwaysutils",
    "pathwaysutils:is_pathways_backend_used",
    why="the public binding of the same test, which callers read by module attribute; "
    "rebound by the simulator with the private one",
    instead="none: the backend test has no override",
)
PERSISTENCE_ENABLED = Private(
    "pathwaysutils",
    "pathwaysutils._initialize:_is_persistence_enabled",
    why="pathwaysutils' reading of ENABLE_PATHWAYS_PERSISTENCE (which values mean on, which it "
    "refuses); elastic_dew's tier-2 check reads the variable itself by the same rule, and "
    "tests/test_persistence.py holds the two together",
    instead="a public pathwaysutils.persistence_enabled()",
)
#: Both bindings of pathwaysutils' Pathways backend test.
BACKEND_TESTS = (_PUBLIC_BACKEND, _INITIALIZE_BACKEND)
#: pathwaysutils' mesh-axis operations that donate their inputs (``donate=``, ``arrays=``,
#: by name): Orbax's Snapshotter calls them by module attribute, and the simulator makes a
#: donated input read as deleted, as on Pathways.
DONATING_OPS = tuple(
    Private(
        "pathwaysutils",
        f"pathwaysutils.jax:{name}",
        why="Orbax's Snapshotter calls it by module attribute with donate=True; on the CPU "
        "client jaxlib leaves a donated input broken, so the simulator hands it views",
        instead="none: jaxlib's CPU client would leave a donated input deleted",
    )  # a nanobind function: no signature for the canary to read
    for name in ("concatenate_by_mesh_axis", "split_by_mesh_axis")
)

PRIVATE: tuple[Private, ...] = (
    DEFAULT_CHECKER,
    _MANAGER_RETRY,
    MANAGER_CHECK,
    GET_SLICE_TO_DEVICES,
    WAIT_FOR_SLICES,
    ELASTIC_TIME,
    *BACKEND_TESTS,
    *DONATING_OPS,
    PERSISTENCE_ENABLED,
)


def check_inactive_slices(manager: Any) -> None:
    """Run ``manager``'s monitor check of its inactive slices now."""
    getattr(manager, MANAGER_CHECK.name)()


def slice_loss_message_logged() -> bool:
    """Whether ``Manager.elastic_retry`` still logs :data:`SLICE_LOSS_MESSAGE` (the canary)."""
    source = inspect.getsource(_MANAGER_RETRY.get())
    return any(quote + SLICE_LOSS_MESSAGE + quote in source for quote in ('"', "'"))
