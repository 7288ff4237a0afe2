"""``elastic_dew.runtime``: process set-up, its decisions, and preemption outside a pool.

Decisions that read the environment run in this process with the environment set as a
scheduler would set it. Where the thing decided about cannot exist here (Slurm, mpirun,
a Pathways server, a CUDA plugin, a GPU pool), the call into it is replaced by a recorder
and the test says so. Anything about signals, exit status or a started backend runs in a
real subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import resource
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from elastic_dew import runtime
from elastic_dew.runtime import backend, compilation_cache, limits, pool, preemption
from elastic_dew.runtime import (
    PREEMPTED_EXIT,
    Layout,
    Preempted,
    Wandb,
    prepare_process,
    run_timestamp,
    use_compilation_cache,
)
from elastic_dew.runtime.backend import cuda_plugin
from elastic_dew.runtime.compilation_cache import JAX_MIN_COMPILE_TIME_S
from elastic_dew.runtime.xla_flags import EXECUTION_TIMEOUT

pytestmark = pytest.mark.libraries  # JAX's distributed and preemption services

HANG_GUARD = 120


def _python(code: str, *, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    for name in [k for k in full_env if k.startswith(("SLURM_", "OMPI_", "DEW_"))]:
        del full_env[name]
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=HANG_GUARD, env=full_env,
    )


@pytest.fixture
def clean_env(monkeypatch):
    """The process environment with no scheduler in it, restored afterwards, and a
    recorder in place of ``jax.distributed.initialize`` (no cluster exists here)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "DEW_", "WANDB_")) or name in (
            "JAX_COORDINATOR_ADDRESS", "KUBERNETES_SERVICE_HOST", "CUDA_VISIBLE_DEVICES",
            "TOKENIZERS_PARALLELISM", "JAX_NUM_CPU_DEVICES", "TPU_VISIBLE_CHIPS",
        ):
            del os.environ[name]
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    calls: list[dict] = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    yield calls
    os.environ.clear()
    os.environ.update(saved)


def _slurm(ntasks: int, **extra: str) -> None:
    os.environ.update(
        SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="node[001-002]", SLURM_NTASKS=str(ntasks),
        SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", **extra,
    )


# ------------------------------------------------------------------------- constants


def test_the_public_constants_are_the_seeds():
    assert EXECUTION_TIMEOUT == "30m"
    assert PREEMPTED_EXIT == 128 + signal.SIGTERM == 143
    assert set(runtime.__all__) >= {
        "prepare_process", "Preempted", "PreemptionNotice",
        "run_timestamp", "PREEMPTED_EXIT", "Wandb", "Layout",
    }


@pytest.mark.slow
def test_importing_the_runtime_and_preparing_a_lone_process_do_not_import_jax():
    out = _python(
        "import sys, elastic_dew.runtime as r; r.prepare_process(multi_host=False);"
        "print('jax' in sys.modules)"
    )
    assert out.stdout.strip() == "False", out.stderr


# ------------------------------------------------------------------- 1. rlimits


@pytest.mark.slow
def test_prepare_process_raises_the_soft_fd_and_core_limits_to_the_hard_ones():
    """The child lowers its own soft limits first (as a restrictive scheduler would have),
    then prepares; lowering them in a preexec_fn would fork this multithreaded process."""
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    core_hard = resource.getrlimit(resource.RLIMIT_CORE)[1]

    out = _python(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, {nofile_hard}))
        resource.setrlimit(resource.RLIMIT_CORE, (0, {core_hard}))
        from elastic_dew.runtime import prepare_process
        before = resource.getrlimit(resource.RLIMIT_NOFILE)[0], resource.getrlimit(resource.RLIMIT_CORE)[0]
        prepare_process(multi_host=False)
        after = resource.getrlimit(resource.RLIMIT_NOFILE)[0], resource.getrlimit(resource.RLIMIT_CORE)[0]
        print(*before, *after)
        """,
    )
    nofile_before, core_before, nofile_after, core_after = map(int, out.stdout.split())
    assert (nofile_before, core_before) == (64, 0), out.stderr
    expected_nofile = nofile_hard if nofile_hard != resource.RLIM_INFINITY else int(open("/proc/sys/fs/nr_open").read())
    assert nofile_after == expected_nofile
    assert core_after == core_hard


def test_prepare_process_never_lowers_a_limit_already_at_its_hard_value():
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits._raise_limit(resource.RLIMIT_NOFILE)
    limits._raise_limit(resource.RLIMIT_NOFILE)
    after = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert after[0] >= before[0] and after[1] == before[1]


# ------------------------------------------------------------------- 2. env vars


def test_an_offline_wandb_sets_wandb_mode_and_tokenizers_parallelism_is_turned_off(clean_env):
    prepare_process(Wandb(offline=True), multi_host=False)
    assert os.environ["WANDB_MODE"] == "offline"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_an_online_wandb_leaves_wandb_mode_alone(clean_env):
    prepare_process(Wandb(offline=False), multi_host=False)
    assert "WANDB_MODE" not in os.environ
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


def test_bad_arguments_are_refused_before_anything_changes(clean_env):
    for kwargs, needle in (
        ({"wandb": {"offline": True}}, "Wandb"),
        ({"multi_host": "yes"}, "multi_host"),
        ({"xla_flags": "xla_cpu_foo=1"}, "not an XLA flag"),
        ({"layout": {"params"}}, "Layout"),
        ({"compilation_cache_dir": 3}, "compilation_cache_dir"),
    ):
        before = dict(os.environ)
        with pytest.raises(ValueError, match=needle):
            prepare_process(**kwargs)
        assert dict(os.environ) == before
    with pytest.raises(ValueError, match="offline"):
        Wandb(offline="yes")


# ------------------------------------------------------------------- 3. XLA flags


@pytest.mark.slow
def test_xla_flags_are_appended_to_XLA_FLAGS_without_duplicates(clean_env, monkeypatch):
    """This pytest process may already run a backend; whether one started is set to no,
    since the test is about how flags merge (the started case runs in a subprocess)."""
    monkeypatch.setattr(backend, "_backend_started", lambda: False)
    monkeypatch.setattr(backend, "cuda_plugin", lambda: False)
    os.environ["XLA_FLAGS"] = "--xla_a=1 --xla_b=2"
    prepare_process(multi_host=False, xla_flags="--xla_b=2 --xla_c=3 --xla_a=9")
    assert os.environ["XLA_FLAGS"] == "--xla_a=9 --xla_b=2 --xla_c=3"
    prepare_process(multi_host=False, xla_flags="--xla_c=3")
    assert os.environ["XLA_FLAGS"] == "--xla_a=9 --xla_b=2 --xla_c=3"


@pytest.mark.parametrize(
    ("cuda", "before", "given", "after"),
    [
        (True, "--xla_a=1", None, f"--xla_a=1 --xla_gpu_execution_terminate_timeout={EXECUTION_TIMEOUT}"),
        (True, "--xla_gpu_execution_terminate_timeout=5m", None, "--xla_gpu_execution_terminate_timeout=5m"),
        (True, "", "--xla_gpu_execution_terminate_timeout=2h", "--xla_gpu_execution_terminate_timeout=2h"),
        (False, "--xla_a=1", None, "--xla_a=1"),
    ],
    ids=["cuda", "cuda_timeout_in_the_environment", "cuda_timeout_given", "no_cuda"],
)
def test_the_execution_timeout_is_added_only_with_the_cuda_plugin_and_never_over_one_already_set(
    cuda, before, given, after, clean_env, monkeypatch
):
    """No CUDA plugin is installed here: ``cuda_plugin()`` is made to answer."""
    monkeypatch.setattr(backend, "_backend_started", lambda: False)
    monkeypatch.setattr(backend, "cuda_plugin", lambda: cuda)
    os.environ["XLA_FLAGS"] = before
    prepare_process(multi_host=False, **({"xla_flags": given} if given else {}))
    assert os.environ["XLA_FLAGS"] == after


@pytest.mark.slow
def test_new_xla_flags_after_a_backend_started_are_refused_and_nothing_changes():
    out = _python(
        """
        import json, os, jax
        from elastic_dew.runtime import prepare_process
        jax.devices()
        before = dict(os.environ)
        try:
            prepare_process(multi_host=False, xla_flags="--xla_cpu_enable_fast_math=true")
        except RuntimeError as err:
            error = str(err)
        else:
            error = None
        same = dict(os.environ) == before
        prepare_process(multi_host=False, xla_flags=os.environ["XLA_FLAGS"])  # nothing new: fine
        print(json.dumps({"error": error, "unchanged": same}))
        """,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "TOKENIZERS_PARALLELISM": ""},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["error"] and "--xla_cpu_enable_fast_math=true" in result["error"]
    assert "before the first JAX call" in result["error"]
    assert result["unchanged"]


def test_cuda_plugin_is_found_by_its_module_without_importing_it(tmp_path, monkeypatch):
    assert cuda_plugin() is False  # no CUDA plugin in this environment
    plugin = tmp_path / "jax_cuda12_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cuda_plugin() is True


# ------------------------------------------------------------- 4. compilation cache


@pytest.fixture
def cache_config():
    """The session's cache settings (``tests/conftest.py``), put back after the test."""
    before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    yield
    use_compilation_cache(before[0], min_compile_time_s=before[1])


def test_compilation_cache_dir_turns_on_the_persistent_cache_there_with_jaxs_own_threshold(
    clean_env, cache_config, tmp_path
):
    prepare_process(multi_host=False, compilation_cache_dir=tmp_path / "cache")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == JAX_MIN_COMPILE_TIME_S == 1.0


def test_a_simulated_run_keeps_its_compilation_cache_where_jaxs_own_variable_says_else_under_xdg_cache_home(
    monkeypatch, tmp_path
):
    from elastic_dew.run.planning import compilation_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert compilation_cache_dir() == tmp_path / "xdg" / "elastic_dew" / "jax-compilation-cache"
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert compilation_cache_dir() == tmp_path / "mine"


def test_use_compilation_cache_caches_programs_over_its_threshold_and_none_turns_it_off(cache_config, tmp_path):
    assert use_compilation_cache(tmp_path, min_compile_time_s=0) is True
    jax.jit(lambda x: x * 3 + 1)(np.arange(5.0)).block_until_ready()
    assert any(tmp_path.iterdir()), "a program compiled in under a second was not cached at threshold 0"
    assert use_compilation_cache(None) is False
    assert jax.config.jax_compilation_cache_dir is None
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(ValueError, match="min_compile_time_s"):
            use_compilation_cache(tmp_path, min_compile_time_s=bad)
    assert jax.config.jax_compilation_cache_dir is None  # refused before anything changed


def test_a_gpu_pool_on_a_jax_that_keys_pools_differently_compiles_without_the_cache(
    clean_env, cache_config, tmp_path, monkeypatch, caplog
):
    """No GPU pool exists here: the CUDA plugin, the pool size and the jax version are
    set as a two-process GPU pool on an older jax would report them."""
    monkeypatch.setattr(backend, "_backend_started", lambda: False)
    monkeypatch.setattr(backend, "cuda_plugin", lambda: True)
    monkeypatch.setattr(pool, "_pool_size", lambda: 2)
    os.environ["JAX_PLATFORMS"] = "cuda"
    before = jax.config.jax_compilation_cache_dir
    monkeypatch.setattr(compilation_cache, "_jax_version", lambda: (0, 4, 20))
    with caplog.at_level(logging.WARNING, logger="elastic_dew.runtime"):
        prepare_process(multi_host=False, compilation_cache_dir=tmp_path)
    assert jax.config.jax_compilation_cache_dir == before
    assert "without the persistent compilation cache" in caplog.text

    monkeypatch.setattr(compilation_cache, "_jax_version", lambda: (0, 10, 2))
    prepare_process(multi_host=False, compilation_cache_dir=tmp_path)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path)


def test_the_pinned_jax_keys_a_pool_alike():
    assert compilation_cache._pool_keys_alike(compilation_cache._jax_version())
    assert not compilation_cache._pool_keys_alike((0, 4, 20))


# ------------------------------------------------------------------- 5. the pool


def test_a_launcher_pool_is_joined_with_the_dew_variables_and_detection_off(clean_env):
    """``jax.distributed.initialize`` is a recorder: the decision is what is tested."""
    os.environ.update(DEW_PROCESS_COUNT="4", DEW_PROCESS_ID="2", JAX_COORDINATOR_ADDRESS="127.0.0.1:1234")
    _slurm(1)  # a launcher inside a one-task Slurm step: the launcher's placement wins
    prepare_process()
    assert clean_env == [{
        "coordinator_address": "127.0.0.1:1234", "num_processes": 4, "process_id": 2,
        "cluster_detection_method": "deactivate",
    }]


def test_a_launcher_that_left_no_coordinator_is_refused_with_the_fix(clean_env):
    os.environ.update(DEW_PROCESS_COUNT="2", DEW_PROCESS_ID="0")
    with pytest.raises(ValueError, match="JAX_COORDINATOR_ADDRESS.*elastic-dew launch"):
        prepare_process()
    assert clean_env == [] and "TOKENIZERS_PARALLELISM" not in os.environ


def test_a_one_task_slurm_step_forms_no_pool(clean_env):
    """No Slurm here: its variables are set as srun sets them for one task."""
    _slurm(1)
    prepare_process()
    assert clean_env == []


def test_a_one_task_slurm_step_forms_a_pool_when_the_run_asks_for_one(clean_env):
    _slurm(1)
    prepare_process(multi_host=True)
    assert clean_env == [{}]


def test_a_one_task_slurm_step_started_by_mpirun_forms_a_pool(clean_env):
    """No mpirun here: Open MPI's variable is set as mpirun sets it."""
    _slurm(1, OMPI_MCA_orte_hnp_uri="1531576320.0;tcp://10.96.0.1:34911")
    prepare_process()
    assert clean_env == [{}]


def test_a_several_task_slurm_step_with_fewer_tasks_than_gpus_on_the_node_is_refused(clean_env):
    _slurm(2, SLURM_STEP_TASKS_PER_NODE="1(x2)", CUDA_VISIBLE_DEVICES="0,1,2,3")
    with pytest.raises(ValueError, match="--ntasks-per-node=4"):
        prepare_process()
    assert clean_env == [] and "TOKENIZERS_PARALLELISM" not in os.environ


def test_a_several_task_slurm_step_with_one_task_per_gpu_forms_a_pool(clean_env):
    _slurm(8, SLURM_STEP_TASKS_PER_NODE="4(x2)", CUDA_VISIBLE_DEVICES="0,1,2,3")
    prepare_process()
    assert clean_env == [{}]


def test_multi_host_false_never_asks_for_a_pool(clean_env):
    os.environ.update(DEW_PROCESS_COUNT="2", DEW_PROCESS_ID="0", JAX_COORDINATOR_ADDRESS="127.0.0.1:1")
    _slurm(4)
    prepare_process(multi_host=False)
    assert clean_env == []


@pytest.mark.slow
def test_no_cluster_environment_is_a_single_host_run(clean_env):
    """The real ``jax.distributed.initialize``, in a fresh process (it refuses to run once
    a backend has started, as pytest's has): with no cluster it raises the ValueError naming
    the coordinator address before touching anything, which is swallowed."""
    env = {k: v for k, v in os.environ.items()}
    result = _python(
        textwrap.dedent(
            """
            import jax
            from elastic_dew.runtime import prepare_process
            prepare_process()
            assert not jax.distributed.is_initialized()
            try:
                prepare_process(multi_host=True)
            except RuntimeError as error:
                assert "multi_host=True requires" in str(error), error
                print("refused")
            """
        ),
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "refused"


def test_every_other_failure_to_join_propagates(clean_env, monkeypatch):
    def broken(**kw):
        raise RuntimeError("coordination service unreachable")

    monkeypatch.setattr(jax.distributed, "initialize", broken)
    with pytest.raises(RuntimeError, match="unreachable"):
        prepare_process()

    def other_value_error(**kw):
        raise ValueError("process_id and num_processes must be nonnegative")

    monkeypatch.setattr(jax.distributed, "initialize", other_value_error)
    with pytest.raises(ValueError, match="nonnegative"):
        prepare_process()


# ------------------------------------------------------------------- 6. Pathways


def test_a_pathways_controller_runs_pathwaysutils_initialize_and_forms_no_pool(
    clean_env, cache_config, monkeypatch, caplog, tmp_path
):
    """No Pathways server exists here: ``pathwaysutils.initialize`` is a recorder."""
    import pathwaysutils

    pathways_calls = []
    monkeypatch.setattr(pathwaysutils, "initialize", lambda: pathways_calls.append(1))
    os.environ["JAX_PLATFORMS"] = "proxy"
    before = jax.config.jax_compilation_cache_dir
    with caplog.at_level(logging.WARNING, logger="elastic_dew.runtime"):
        prepare_process(compilation_cache_dir=tmp_path)
    assert pathways_calls == [1]
    assert clean_env == []
    assert jax.config.jax_compilation_cache_dir == before
    assert "Pathways keeps its own compilation cache" in caplog.text
    with pytest.raises(ValueError, match="Pathways"):
        prepare_process(multi_host=True)


# ------------------------------------------------------------------- 7. Layout


def test_layout_names_only_known_state_parts():
    assert Layout(host={"params", "opt_state"}).host == frozenset({"params", "opt_state"})
    assert Layout().host == frozenset()
    with pytest.raises(ValueError, match="grads"):
        Layout(host=frozenset({"params", "grads"}))
    with pytest.raises(ValueError, match="set of state parts"):
        Layout(host="params")


def test_host_params_need_cpu_beside_the_accelerator(clean_env):
    os.environ["JAX_PLATFORMS"] = "cuda"
    before = dict(os.environ)
    with pytest.raises(ValueError, match="JAX_PLATFORMS=cuda,cpu"):
        prepare_process(multi_host=False, layout=Layout(host=frozenset({"params"})))
    assert dict(os.environ) == before
    prepare_process(multi_host=False, layout=Layout(host=frozenset({"opt_state"})))


def test_host_params_need_one_cpu_device_per_accelerator_established_before_the_call(clean_env, monkeypatch):
    """No GPU here: the accelerators are the ones ``CUDA_VISIBLE_DEVICES`` names, and the
    backend is reported as not yet started, as at the top of a recipe."""
    monkeypatch.setattr(backend, "_backend_started", lambda: False)
    monkeypatch.setattr(backend, "cuda_plugin", lambda: False)
    os.environ.update(JAX_PLATFORMS="cuda,cpu", CUDA_VISIBLE_DEVICES="0,1", XLA_FLAGS="")
    layout = Layout(host=frozenset({"params"}))
    with pytest.raises(ValueError, match="JAX_NUM_CPU_DEVICES"):
        prepare_process(multi_host=False, layout=layout)
    os.environ["JAX_NUM_CPU_DEVICES"] = "1"
    with pytest.raises(ValueError, match="1 CPU device.*2 accelerator.*JAX_NUM_CPU_DEVICES=2"):
        prepare_process(multi_host=False, layout=layout)
    del os.environ["JAX_NUM_CPU_DEVICES"]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    prepare_process(multi_host=False, layout=layout)
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


def test_host_params_are_checked_against_a_started_backend_without_changing_it(clean_env, monkeypatch):
    """This pytest process runs a CPU backend with 8 devices and has no accelerator: the
    local accelerator count is made to report 2, then 8, as a started GPU backend would."""
    jax.devices()
    platforms = jax.config.jax_platforms
    os.environ["JAX_PLATFORMS"] = "cuda,cpu"
    layout = Layout(host=frozenset({"params"}))
    monkeypatch.setattr(jax, "local_device_count", lambda *a, **k: 2)
    with pytest.raises(ValueError, match="started backend has 8 CPU device.*2 accelerator"):
        prepare_process(multi_host=False, layout=layout)
    monkeypatch.setattr(jax, "local_device_count", lambda *a, **k: 8)
    prepare_process(multi_host=False, layout=layout)
    assert jax.config.jax_platforms == platforms and len(jax.devices()) == 8


# -------------------------------------------------------- 8. alone: the notice is SIGTERM


@pytest.mark.slow
def test_a_lone_process_catches_sigterm_reports_it_once_and_close_restores_the_handler():
    out = _python(
        """
        import json, logging, os, signal, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
        from elastic_dew.runtime import PreemptionNotice
        def previous(signum, frame):
            pass
        signal.signal(signal.SIGTERM, previous)
        notice = PreemptionNotice()
        result = {"replaced": signal.getsignal(signal.SIGTERM) is not previous}
        result["before"] = notice.reached(0)
        os.kill(os.getpid(), signal.SIGTERM)
        result["after"] = [notice.reached(1), notice.reached(2)]
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: ignored, still reached
        result["second"] = notice.reached(3)
        notice.close()
        result["restored"] = signal.getsignal(signal.SIGTERM) is previous
        with PreemptionNotice() as other:
            result["inside"] = signal.getsignal(signal.SIGTERM) is not previous
        result["restored_by_with"] = signal.getsignal(signal.SIGTERM) is previous
        print(json.dumps(result))
        """
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result == {
        "replaced": True, "before": False, "after": [True, True], "second": True,
        "restored": True, "inside": True, "restored_by_with": True,
    }
    assert out.stderr.count("SIGTERM: preemption notice") == 1
    assert out.stderr.count("ignored, already stopping") == 1
    assert out.stderr.count("preemption notice reached: stopping at step 1") == 1
    assert "reached: stopping at step 2" not in out.stderr


# ------------------------------------------------------------------- 9. Preempted


def test_preempted_carries_its_step_and_survives_pickling():
    err = pickle.loads(pickle.dumps(Preempted(12)))
    assert isinstance(err, Preempted) and err.step == 12 and "12" in str(err)


@pytest.mark.slow
def test_an_uncaught_preempted_exits_143_with_no_traceback():
    out = _python(
        """
        from elastic_dew.runtime import Preempted, prepare_process
        prepare_process(multi_host=False)
        print("stopping", flush=True)
        raise Preempted(7)
        """
    )
    assert out.returncode == PREEMPTED_EXIT
    assert out.stdout == "stopping\n"
    assert out.stderr == ""


@pytest.mark.slow
def test_an_uncaught_preempted_exits_143_after_install_exit_hook_alone_and_atexit_still_runs():
    out = _python(
        """
        import atexit
        from elastic_dew.runtime import Preempted, install_exit_hook
        install_exit_hook()
        atexit.register(lambda: print("atexit ran", flush=True))
        raise Preempted(3)
        """
    )
    assert out.returncode == PREEMPTED_EXIT
    assert out.stdout == "atexit ran\n"
    assert out.stderr == ""


@pytest.mark.slow
def test_an_uncaught_preempted_exits_143_while_idle_thread_pools_are_alive():
    """Grain and Orbax keep idle ThreadPoolExecutor workers, which only stop when the
    interpreter's threading shutdown tells them to: the exit must not wait for them."""
    out = _python(
        """
        import concurrent.futures
        from elastic_dew.runtime import Preempted, install_exit_hook
        install_exit_hook()
        pool = concurrent.futures.ThreadPoolExecutor(2)
        pool.submit(lambda: 1).result()
        raise Preempted(5)
        """
    )
    assert out.returncode == PREEMPTED_EXIT
    assert out.stderr == ""


@pytest.mark.slow
def test_other_uncaught_exceptions_still_reach_the_previous_hook():
    out = _python(
        """
        import sys
        from elastic_dew.runtime import prepare_process
        prepare_process(multi_host=False)
        raise KeyError("not a preemption")
        """
    )
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "not a preemption" in out.stderr


@pytest.mark.slow
def test_importing_the_runtime_leaves_sys_excepthook_alone_and_an_uncaught_preempted_is_a_plain_error():
    out = _python(
        """
        import sys
        before = sys.excepthook
        import elastic_dew.runtime
        from elastic_dew.runtime import (
            backend, compilation_cache, layout, limits, pool, preemption, prepare, timestamp,
            xla_flags,
        )
        print(sys.excepthook is before, flush=True)
        raise elastic_dew.runtime.Preempted(4)
        """
    )
    assert out.stdout == "True\n"
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "preempted at step 4" in out.stderr


@pytest.mark.slow
def test_install_exit_hook_installs_the_hook_once_and_chains_to_the_previous_one():
    out = _python(
        """
        import sys
        from elastic_dew.runtime import install_exit_hook, preemption
        before = sys.excepthook
        install_exit_hook()
        installed = sys.excepthook
        install_exit_hook()  # again: nothing changes, the previous hook stays the original
        print(installed is not before, sys.excepthook is installed,
              preemption._previous_excepthook is before, flush=True)
        raise KeyError("not a preemption")
        """
    )
    assert out.stdout == "True True True\n"
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "not a preemption" in out.stderr


# ------------------------------------------------------------------- 10. the clock


def test_run_timestamp_alone_is_the_local_wall_clock_in_the_run_name_format():
    stamp = run_timestamp()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d", stamp)


def test_the_runtime_offers_every_name_of_the_seed_api_page_without_a_warning():
    """``elastic_dew.runtime`` is, point by point, the ``dew.training.runtime`` page: its six
    names stay public (in ``__all__``) and import with no DeprecationWarning."""
    import warnings

    seed_names = {"EXECUTION_TIMEOUT", "prepare_process", "cuda_plugin", "Preempted",
                  "PreemptionNotice", "run_timestamp"}
    assert seed_names <= set(runtime.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in sorted(seed_names):
            assert getattr(runtime, name) is not None
