"""``elastic-dew simulate -- COMMAND``: any Python training program, unmodified, on simulated slices.

COMMAND is the program as its users start it: ``python -m MODULE ARGS...``, ``python
SCRIPT.py ARGS...`` or a console script of an installed Python package. It runs in a child
process with the CPU devices set before JAX starts and
:class:`~elastic_dew.simulate.SimulatedSlices` entered before its first line
(:mod:`elastic_dew.simulate.launcher`), so pathwaysutils' ``Manager`` and
``elastic_retry``, Orbax and the program's own loop meet simulated slice losses, hangs,
returns and preemptions as on Pathways. A process that ends as a preempted or killed
controller does (:data:`elastic_dew.supervisor.RESTART_STATUSES`) is started again with the
same fault log, as a JobSet restarts its pod (:func:`elastic_dew.supervisor.supervise`), so
each fault fires once across the restarts.

The program's own output passes through unchanged. At the end one verdict is printed (to
standard error): the faults fired and never fired, each ``elastic_retry`` attempt's active
slices, each process's exit status and wall time; ``--report FILE`` writes the same as JSON.
The verdict also says what each fault cost the program and names the mistakes it made
(:mod:`elastic_dew.simulate.diagnosis`, from what the program's processes did:
``watch.jsonl`` in the run directory). The exit status is the program's last one (``128 +
N`` for a process ended by signal ``N``), or 1 when it is 0 but a scheduled fault never
fired or a problem was found that ``--allow`` does not accept.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from elastic_dew.console import add_flag, refusal
from elastic_dew.observe.logs import TEXT_FORMAT
from elastic_dew.proxy import records as proxy_records
from elastic_dew.settings import SettingError
from elastic_dew.run import FAILED_EXIT, USAGE_EXIT, SimConfig
from elastic_dew.run.planning import RUNS_DIR
from elastic_dew.rundir import FAULTS_FILE, WATCH_FILE, FaultLog, read_records
from elastic_dew.runtime import run_timestamp
from elastic_dew.simulate.diagnosis import Diagnosis, check_allowed, diagnose, fault_record, with_output_causes
from elastic_dew.simulate.schedule import check_fault_slices, parse_schedule
from elastic_dew.simulate.launcher import ENVIRONMENT, LaunchSettings
from elastic_dew.simulate.step_count import NO_STEP_FOUND
from elastic_dew.supervisor import supervise
from elastic_dew.commands.user_command import CommandError, ResolvedCommand, check_interpreter, resolve

__all__ = ["configure", "run", "Verdict", "verdict", "ATTEMPTS_FILE", "LOG_FILE", "WATCH_FILE"]

logger = logging.getLogger(__name__)

_PROG = "elastic-dew simulate"
#: Each process's start and each ``elastic_retry`` attempt's active slices (JSON lines).
ATTEMPTS_FILE = "attempts.jsonl"
#: The command's own log, in the run directory.
LOG_FILE = "simulate.log"
DEFAULT_RESTARTS = 3
#: Where the simulated slices meet the program: inside its process, or through the IFRT proxy.
BOUNDARIES = ("in-process", "proxy")

def configure(parser: argparse.ArgumentParser) -> None:
    # The simulated slices and the schedule: the run's own settings, built from their declarations.
    for name in ("slices", "devices_per_slice", "schedule"):
        add_flag(parser, name)
    parser.add_argument("--fault-log", metavar="FILE",
                        help="the fault log; a restarted process fires no fault it holds (default RUN_DIR/faults.jsonl)")
    parser.add_argument("--step-function", metavar="NAME",
                        help="count a step at each dispatch of the function of this name (the function given to "
                             "jax.jit) instead of the simulator's rule (docs/simulator.md)")
    parser.add_argument("--restarts", type=int, default=DEFAULT_RESTARTS, metavar="N",
                        help="start the program again at most N times after a preemption or a kill")
    parser.add_argument("--boundary", choices=BOUNDARIES, default="in-process",
                        help="in-process: the simulator inside the program's process; proxy: the program runs with "
                             "JAX_PLATFORMS=proxy on a local Pathways backend and calls pathwaysutils.initialize() "
                             "itself, nothing patched (docs/pathways-boundary.md: every fault; the rules it can see)")
    parser.add_argument("--report", metavar="FILE", help="write the verdict as JSON to FILE")
    parser.add_argument("--allow", action="append", default=[], metavar="KIND",
                        help="accept problems of this kind (reported, not failing the run); repeatable "
                             "(docs/your-trainer.md lists the kinds)")
    parser.add_argument("--run-dir", metavar="DIR", help="where the fault log, the attempts and this command's "
                                                          "log go (default runs/simulate_TIMESTAMP)")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                        help="the program: python -m MODULE ..., python SCRIPT.py ... or a console script")


def child_environment(sim: SimConfig, settings: LaunchSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The program's environment: CPU devices for the slices before JAX starts, the
    launcher's settings, and the cloud metadata server out of reach (unless set)."""
    env = dict(os.environ if base is None else base)
    env["JAX_PLATFORMS"] = "cpu"
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    flags.append(f"--xla_force_host_platform_device_count={sim.slices * sim.devices_per_slice}")
    env["XLA_FLAGS"] = " ".join(flags)
    env[ENVIRONMENT] = settings.to_json()
    env.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
    env.setdefault("NO_GCE_CHECK", "True")
    return env


@dataclasses.dataclass(frozen=True)
class Process:
    """One process of the run: its exit status, wall time, pid and attempts."""

    number: int
    status: int
    seconds: float
    pid: int | None
    attempts: tuple[tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a simulated run of a program did, and how ``elastic-dew simulate`` exits."""

    command: tuple[str, ...]
    slices: int
    devices_per_slice: int
    schedule: str
    run_dir: str
    processes: tuple[Process, ...]
    fired: tuple[dict[str, Any], ...]
    never_fired: tuple[str, ...]
    exit: int
    diagnosis: Diagnosis | None = None
    #: Through the proxy boundary: the losses that fired that the program never met (no
    #: request of its was answered ``DATA_LOSS`` after the loss).
    unmet: tuple[str, ...] = ()
    #: Why the faults never fired, when the step rule found no step in a program that ran to
    #: its end (it names ``--step-function``); empty otherwise.
    never_cause: str = ""
    #: The problem kinds the boundary cannot evaluate (through the proxy: those that need the
    #: program's process), each with what it needs.
    unseen: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit == 0

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["diagnosis"]
        out["processes"] = [{**dataclasses.asdict(p), "attempts": [list(a) for a in p.attempts]}
                            for p in self.processes]
        diagnosis = self.diagnosis
        out["costs"] = [c.to_json() for c in diagnosis.costs] if diagnosis else []
        out["totals"] = diagnosis.totals.to_json() if diagnosis else None
        out["problems"] = [p.to_json() for p in diagnosis.problems] if diagnosis else []
        out["unseen"] = [{"kind": kind, "needs": needs} for kind, needs in self.unseen]
        out["ok"] = self.ok
        return out

    def lines(self) -> list[str]:
        out = [f"{_PROG}: {shlex.join(self.command)} on {self.slices} slices of {self.devices_per_slice} "
               f"CPU devices, schedule {self.schedule or 'none'}"]
        for p in self.processes:
            attempts = " -> ".join("[" + ",".join(map(str, a)) + "]" for a in p.attempts) or "none"
            out.append(f"  process {p.number} (pid {p.pid}): exit {p.status} after {p.seconds:.1f} s; "
                       f"elastic_retry attempts on slices {attempts}")
        for f in self.fired:
            target = f" slice {f['slice']}" if f["slice"] is not None else ""
            out.append(f"  fired   {f['scheduled']}: {f['action']}{target} at step {f['step']} ({f['phase']}, "
                       f"pid {f['pid']})")
        for text in self.never_fired:
            out.append(f"  NEVER FIRED {text}" + (f" ({self.never_cause})" if self.never_cause else ""))
        for text in self.unmet:
            out.append(f"  NEVER MET {text}: the slice was lost, but no request of the program was answered "
                       "DATA_LOSS after it (the program never read or ran on the lost slice: the fault tested "
                       "nothing; fire it at a later step)")
        if self.diagnosis is not None:
            out.extend(self.diagnosis.lines())
        if self.unseen:
            out.append(f"  unseen  {', '.join(kind for kind, _ in self.unseen)}: not evaluated through the proxy "
                       "(each needs the program's process: its heap, its Manager, Orbax or Grain objects)")
        out.append(f"{_PROG}: {'ok' if self.ok else 'FAILED'}, exit {self.exit}; run directory {self.run_dir}")
        return out


class _ErrorOutput:
    """The program's error output, passed through to this command's as it comes, its tail
    kept for the causes the verdict names from it (``fd``: what the program writes to)."""

    TAIL = 64 * 1024

    def __init__(self) -> None:
        self._read, self.fd = os.pipe()
        self._tail = bytearray()
        self._thread = threading.Thread(target=self._pump, name="elastic-dew-simulate-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        sink = getattr(sys.stderr, "buffer", None)
        while chunk := os.read(self._read, 65536):
            if sink is not None:
                sink.write(chunk)
                sink.flush()
            else:
                sys.stderr.write(chunk.decode("utf-8", "replace"))
                sys.stderr.flush()
            self._tail += chunk
            del self._tail[:-self.TAIL]

    def close(self) -> str:
        """Stop passing output through (every process has ended); the tail it kept.

        Returns:
            The tail, decoded.
        """
        os.close(self.fd)
        self._thread.join(timeout=5)  # a process the program left behind may hold the pipe open
        if not self._thread.is_alive():
            os.close(self._read)
        return self._tail.decode("utf-8", "replace")


def _status_code(status: int) -> int:
    return 128 - status if status < 0 else status


def verdict(command: Sequence[str], sim: SimConfig, schedule_text: str, run_dir: Path, fault_log: Path,
            statuses: Sequence[int], seconds: Sequence[float], allow: Sequence[str] = (),
            boundary: str = "in-process", output: str = "") -> Verdict:
    """The verdict of a run whose processes ended with ``statuses`` after ``seconds`` each,
    with the diagnosis of what its processes did (``allow``: problem kinds accepted) and the
    causes its error output (``output``, the tail) names; through the ``proxy`` boundary, a
    loss that fired and that the program never met fails it as a fault that never fired does."""
    records = read_records(run_dir / ATTEMPTS_FILE)
    pids = [r["pid"] for r in records if r.get("start")]
    processes = []
    for number, (status, wall) in enumerate(zip(statuses, seconds, strict=True), 1):
        pid = pids[number - 1] if number <= len(pids) else None
        attempts = tuple(tuple(r["active"]) for r in records if r.get("pid") == pid and "active" in r)
        processes.append(Process(number, status, round(wall, 3), pid, attempts))
    schedule = parse_schedule(schedule_text)
    texts = [str(f) for f in schedule]
    fired = FaultLog(fault_log).fired(texts) if schedule else {}
    fired_json = tuple(fault_record(record) for _, record in sorted(fired.items(), key=lambda item: item[1].wall))
    never = tuple(text for index, text in enumerate(texts) if index not in fired)
    watched = run_dir / WATCH_FILE  # through the proxy, the backend's records (elastic_dew.proxy.records)
    by_program = proxy_records.charged_to_programs(fired_json, records) if boundary == "proxy" else fired_json
    found = diagnose(by_program, read_records(watched), allow) if watched.exists() else None
    if statuses and statuses[-1] != 0:
        found = with_output_causes(found, output, len(statuses), allow)
    unmet = proxy_records.unmet_losses(fired_json, records) if boundary == "proxy" else ()
    code = _status_code(statuses[-1])
    left = FaultLog(fault_log).never_fired() if never else []
    stepless = bool(left) and code == 0 and all(f.step < 0 for f in left)
    cause = NO_STEP_FOUND if stepless else ""
    if code == 0 and (never or unmet or (found is not None and found.defects)):
        code = FAILED_EXIT
    unseen = tuple(proxy_records.UNSEEN.items()) if boundary == "proxy" else ()
    return Verdict(tuple(command), sim.slices, sim.devices_per_slice, schedule_text, str(run_dir),
                   tuple(processes), fired_json, never, code, found, unmet, cause, unseen)


def _through_proxy(program: ResolvedCommand, sim: SimConfig, settings: LaunchSettings, run_dir: Path,
                   max_processes: int, restarting: Any, stderr: int | None = None) -> list[int]:
    """Run ``program`` as it is (its own interpreter, ``JAX_PLATFORMS=proxy``) on a local
    Pathways backend that fires the schedule at the steps it counts, restarted as in-process;
    each process announces itself to the backend (:mod:`elastic_dew.proxy.exec_program`)."""
    from elastic_dew.proxy import LocalPathways

    own = [*program.interpreter, "-m", program.target] if program.form == "module" else \
        [*program.interpreter, program.target]
    backend = LocalPathways(sim.slices, sim.devices_per_slice, schedule=sim.schedule,
                            step_function=settings.step_function, fault_log=settings.fault_log,
                            attempts=settings.attempts, log=run_dir / "proxy.log", watch=settings.watch)
    env = {k: v for k, v in os.environ.items() if k != ENVIRONMENT}
    env.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
    env.setdefault("NO_GCE_CHECK", "True")
    with backend:
        env.update(backend.client_env())
        child = [*backend.exec_prefix(), *own, *program.args]
        logger.info("through the local Pathways backend at %s: %s", backend.target, shlex.join(child))
        return supervise(child, max_processes=max_processes, on_restart=restarting, env=env, stderr=stderr)


def _refuse(problem: str) -> int:
    sys.stderr.write(f"{_PROG}: error: {problem}\n")
    return USAGE_EXIT


@contextlib.contextmanager
def _logging_to(path: Path, verbose: bool) -> Iterator[None]:
    """This command's log lines go to ``path``; the terminal shows only its warnings (all of
    them with ``-v``), its restart lines and its verdict."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    levels = [(h, h.level) for h in root.handlers]
    if not verbose:
        for h, level in levels:
            h.setLevel(max(level, logging.WARNING))
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for h, level in levels:
            h.setLevel(level)


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.restarts < 0:
        return _refuse(f"--restarts {args.restarts} must be >= 0")
    try:
        sim = SimConfig(**{name: value for name in ("slices", "devices_per_slice", "schedule")
                           if (value := getattr(args, f"sim.{name}", None)) is not None})
        try:
            schedule = parse_schedule(sim.schedule)
            check_fault_slices(schedule, sim.slices)
        except ValueError as err:
            raise SettingError(SimConfig, "schedule", sim.schedule, problem=str(err)) from None
        allow = check_allowed(args.allow)
        program = resolve(command)
        if args.boundary == "in-process":
            check_interpreter(program)
    except ValueError as err:  # a SettingError among them, worded with its flags
        return _refuse(refusal(err))
    run_dir = Path(args.run_dir) if args.run_dir else RUNS_DIR / f"simulate_{run_timestamp()}"
    if not args.run_dir and run_dir.exists():
        return _refuse(f"{run_dir} exists; give --run-dir")
    fault_log = Path(args.fault_log) if args.fault_log else run_dir / FAULTS_FILE
    try:
        FaultLog(fault_log).fired([str(f) for f in schedule])  # another run's log is refused here
    except ValueError as err:
        return _refuse(str(err))
    run_dir.mkdir(parents=True, exist_ok=True)
    with _logging_to(run_dir / LOG_FILE, bool(getattr(args, "verbose", False))):
        settings = LaunchSettings(sim.slices, sim.devices_per_slice, sim.schedule, str(fault_log.resolve()),
                                  args.step_function, str((run_dir / ATTEMPTS_FILE).resolve()),
                                  str((run_dir / WATCH_FILE).resolve()))
        child = program.launcher()
        logger.info("running %s under %d simulated slices of %d devices: %s", shlex.join(command), sim.slices,
                    sim.devices_per_slice, shlex.join(child))
        ended: list[float] = [time.monotonic()]

        def restarting(status: int, restarts: int) -> None:
            ended.append(time.monotonic())
            sys.stderr.write(f"{_PROG}: the program exited with {status} (preempted or killed); starting it again, "
                             f"as a JobSet restarts the pod (restart {restarts} of at most {args.restarts})\n")
            sys.stderr.flush()

        errors = _ErrorOutput()
        try:
            if args.boundary == "proxy":
                statuses = _through_proxy(program, sim, settings, run_dir, args.restarts + 1, restarting, errors.fd)
            else:
                statuses = supervise(child, max_processes=args.restarts + 1, on_restart=restarting,
                                     env=child_environment(sim, settings), stderr=errors.fd)
        finally:
            output = errors.close()
        ended.append(time.monotonic())
        seconds = [later - earlier for earlier, later in zip(ended, ended[1:])]
        result = verdict(command, sim, sim.schedule, run_dir, fault_log, statuses, seconds, allow, args.boundary,
                         output)
        sys.stderr.write("\n".join(result.lines()) + "\n")
        if args.report:
            Path(args.report).write_text(json.dumps(result.to_json(), indent=2) + "\n")
        logger.info("verdict: %s", json.dumps(result.to_json()))
        return result.exit

