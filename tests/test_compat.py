"""The canary of the seam (``elastic_dew._compat``): every private name of another library
elastic_dew uses is still there, with the shape the project uses.

An upgrade of jax, jaxlib, Orbax, Grain, pathwaysutils or ml-goodput-measurement (or a new
Python, for argparse) that removes or reshapes one fails here, and the failure names the
library, its installed version and the name, so the fix starts in one place. The private
names only the tests use have their own seam, ``tests/private_names.py``, checked here too.
"""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest

from elastic_dew import _compat
from elastic_dew._compat import Private, version

import private_names

pytestmark = pytest.mark.libraries

SEAM = Path(_compat.__file__).parent
#: Every private name, with where it is declared: the library's seam, then the tests' own.
ALL = [(f"elastic_dew._compat.{module}", point) for module, points in _compat.all_private().items()
       for point in points] + [("tests/private_names.py", point) for point in private_names.PRIVATE]


def _where(point: Private) -> str:
    return f"{point.library} {version(point.library)}: {point.path}"


@pytest.mark.parametrize(("declared", "point"), ALL, ids=[p.path for _, p in ALL])
def test_each_private_name_of_the_seam_is_there_with_the_parameters_the_project_passes(declared, point):
    problem = point.check()
    assert problem is None, f"{_where(point)}: {problem} ({declared} declares it; see its why and instead)"


def test_each_private_name_says_why_no_public_api_serves_and_what_would_replace_it():
    for module, point in ALL:
        assert point.why.strip() and point.instead.strip(), f"{module}: {point.path} lacks its why or instead"
        assert version(point.library) != "not installed", f"{point.path}: no distribution named {point.library!r}"


def test_every_seam_module_is_listed_and_declares_its_names():
    modules = {path.stem for path in SEAM.glob("*.py") if path.stem != "__init__"}
    assert modules == set(_compat.MODULES)
    assert all(_compat.all_private()[name] for name in _compat.MODULES)


def test_the_pool_state_answers_the_three_questions_the_runtime_asks():
    from elastic_dew._compat import jax as jax_private

    state = jax_private.PRIVATE[0].get()
    for field in ("client", "num_processes", "process_id"):
        assert hasattr(state, field), f"jax {version('jax')}: jax._src.distributed.global_state lacks {field}"
    assert (jax_private.pool_client(), jax_private.pool_size(), jax_private.pool_process_id()) == (None, 1, 0)


def test_a_compiled_program_names_the_function_it_was_lowered_from():
    import jax

    from elastic_dew._compat import jax as jax_private

    def train_step(x):
        return x + 1

    compiled = jax.jit(train_step).lower(1.0).compile()
    assert jax_private.compiled_name(compiled) == "jit(train_step)", (
        f"jax {version('jax')}: jax.stages.Compiled._executable.unsafe_call.name no longer names the function"
    )


def test_the_simulator_finds_jaxs_jit_seam():
    from elastic_dew._compat import jax as jax_private

    assert jax_private.jit_seam(), f"jax {version('jax')}: the jit internals the simulator replaces are gone"
    jax_private.clear_jit_caches()
    assert jax_private.trace_state_clean()


def test_pathwaysutils_still_logs_a_handled_slice_loss_with_the_text_the_filter_matches():
    import logging

    from elastic_dew._compat import pathwaysutils as pw_private

    assert pw_private.slice_loss_message_logged(), (
        f"pathwaysutils {version('pathwaysutils')}: Manager.elastic_retry no longer logs "
        f"{pw_private.SLICE_LOSS_MESSAGE!r}"
    )
    from pathwaysutils.elastic import manager

    assert manager.__name__ == pw_private.MANAGER_LOGGER
    assert logging.getLogger(pw_private.MANAGER_LOGGER) is manager._logger


def test_the_formatter_shows_a_default_only_where_shows_default_says():
    from elastic_dew._compat.argparse import DefaultsHelpFormatter, actions

    class Hidden(DefaultsHelpFormatter):
        def shows_default(self, action):
            return action.dest != "quiet"

    parser = argparse.ArgumentParser(formatter_class=Hidden)
    parser.add_argument("--steps", type=int, default=7, help="steps")
    parser.add_argument("--quiet", default="yes", help="quiet")
    text = parser.format_help()
    assert re.search(r"steps \(default: 7\)", text) and "quiet (default" not in text, (
        f"Python {version('python')}: argparse's ArgumentDefaultsHelpFormatter._get_help_string changed"
    )
    assert [a.dest for a in actions(parser)] == ["help", "steps", "quiet"]


@pytest.mark.slow
def test_the_seam_imports_no_library_until_a_name_is_used_but_orbaxs_subclass():
    """The runtime reads the seam before JAX may start, and the slice-loss log filter is
    installed without JAX: only the Orbax modules (a subclass of its Snapshotter) import their library."""
    import subprocess
    import sys

    code = (
        "import sys; import elastic_dew._compat as c\n"
        "for m in c.MODULES:\n"
        "    if not m.startswith('orbax'): __import__('elastic_dew._compat.' + m)\n"
        "print(sorted(n for n in ('jax', 'orbax', 'grain', 'pathwaysutils', 'ml_goodput_measurement') if n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_the_seam_signature_check_names_a_parameter_that_is_gone():
    point = Private("python", "argparse:ArgumentParser.add_argument", why="w", instead="i", params=("no_such",))
    assert point.check() is None  # add_argument takes **kwargs
    point = Private("python", "inspect:signature", why="w", instead="i", params=("no_such",))
    assert "no longer takes no_such" in point.check()
    assert "is gone" in Private("python", "inspect:no_such_name", why="w", instead="i").check()
    assert inspect.isfunction(Private("python", "inspect:signature", why="w", instead="i").get())
