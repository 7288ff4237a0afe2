"""The XLA flags a process starts with, merged into ``XLA_FLAGS``.

XLA reads ``XLA_FLAGS`` once, when JAX opens a backend, so the flags a run asks for are
merged into the environment before the first JAX call: a flag already set takes the
requested value in place, a new one is appended, nothing appears twice. With JAX's CUDA
plugin installed, the execution watchdog (:data:`EXECUTION_TIMEOUT`) is added too.
"""

from __future__ import annotations

import shlex

__all__ = ["EXECUTION_TIMEOUT"]

#: How long one device execution of a process pool may run before XLA ends its process.
#:
#: A rank that stalls without failing leaves the other ranks inside a collective, and no
#: GPU backend times that out: the pool would hang for ever with every process alive.
#: XLA's execution watchdog ends a process whose execution runs past this, and
#: ``elastic-dew launch``, srun or the scheduler then stops the rest. An execution is a
#: whole step, which can run for minutes, so the limit is generous;
#: ``--xla_gpu_execution_terminate_timeout`` in ``XLA_FLAGS`` or ``xla_flags`` sets another.
EXECUTION_TIMEOUT = "30m"

_TIMEOUT_FLAG = "--xla_gpu_execution_terminate_timeout"
#: The flag that sets how many CPU devices XLA makes (read by the host layout check).
_CPU_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0]


def _merge_flags(existing: str, requested: str | None, add_timeout: bool) -> str:
    """``existing`` with ``requested`` merged in: a flag already set takes the requested
    value in place, new flags are appended, nothing appears twice."""
    tokens = shlex.split(existing)
    positions = {_flag_name(t): i for i, t in enumerate(tokens)}
    for token in shlex.split(requested or ""):
        name = _flag_name(token)
        if name in positions:
            tokens[positions[name]] = token
        else:
            positions[name] = len(tokens)
            tokens.append(token)
    if add_timeout and _TIMEOUT_FLAG not in positions:
        tokens.append(f"{_TIMEOUT_FLAG}={EXECUTION_TIMEOUT}")
    return " ".join(tokens)


def _refuse_late_flags(existing: str, wanted: str, started: bool) -> None:
    """Refuse flags that would change ``XLA_FLAGS`` after a backend read it."""
    if started and shlex.split(wanted) != shlex.split(existing):
        new = sorted(set(shlex.split(wanted)) - set(shlex.split(existing)))
        raise RuntimeError(
            f"a JAX backend already started in this process, so XLA flags {new} can no longer "
            "take effect; call prepare_process() before the first JAX call (the first line of "
            "main()), or set XLA_FLAGS in the environment before the process starts"
        )
