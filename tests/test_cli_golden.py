"""Every command's ``--help`` and every settings refusal, compared with files checked in.

``tests/golden/help/*.txt`` hold the ``--help`` of ``elastic-dew`` and of each of its
subcommands (nested ones included), of a recipe's own ``python -m elastic_dew.recipes.mlp`` and of
``python -m elastic_dew.chaos``; ``tests/golden/refusals.txt`` holds, for each bad setting
quoted in ``docs/reliability.md#bad-input`` (and the renderer's and the other commands'
own), what the user typed and the whole refusal, exit status included. A change to a flag,
a help text or a refusal shows as a diff of these files, so it is one someone chose.

Regenerate after a change you mean (then read ``git diff tests/golden``)::

    ELASTIC_DEW_REGOLDEN=1 .venv/bin/python -m pytest -q tests/test_cli_golden.py

Help is formatted 100 columns wide. The files are argparse's output on Python 3.11 (the
lowest supported), compared exactly there; on newer Pythons, whose argparse lays help out
a little differently (3.13 writes ``-n, --nprocs NPROCS`` once and narrows the columns to
fit), they are compared word for word. Everything runs in-process; nothing trains.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from elastic_dew import cli
from elastic_dew._compat.argparse import actions

GOLDEN = Path(__file__).resolve().parent / "golden"
REGENERATE = os.environ.get("ELASTIC_DEW_REGOLDEN") == "1"

# ----------------------------------------------------------------------- help


def _help_pages() -> dict[str, list[str]]:
    """Each golden help page's name and the ``elastic-dew`` words whose ``--help`` it is."""
    pages = {"elastic-dew": []}
    for name in cli.SUBCOMMANDS:
        parser, _ = cli._parser([name])
        pages[name] = [name]
        for action in _sub_actions(_find(parser, [name])):
            for word in action.choices:
                pages[f"{name}-{word}"] = [name, word]
    return pages


def _sub_actions(parser: argparse.ArgumentParser) -> list:
    """The subcommand actions of ``parser``: those whose choices map words to parsers."""
    return [a for a in actions(parser) if isinstance(getattr(a, "choices", None), dict)]


def _find(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    for word in words:
        parser = next(a.choices[word] for a in _sub_actions(parser) if word in a.choices)
    return parser


_SHORT_LONG = re.compile(r"(-\w), (--[\w-]+) ([A-Z][A-Z_.=]*)")


def _canonical(text: str) -> str:
    """``text`` as compared: exactly on Python 3.11, word for word (and with 3.13's
    ``-n, --nprocs NPROCS`` read as 3.11's ``-n NPROCS, --nprocs NPROCS``) on newer ones."""
    if sys.version_info[:2] == (3, 11):
        return text
    return " ".join(_SHORT_LONG.sub(r"\1 \3, \2 \3", text).split())


def _exit_output(main: Callable[[], object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main()
    return out.getvalue()


def _help(name: str, words: list[str]) -> str:
    if name == "recipe":
        from elastic_dew import console

        return _exit_output(lambda: console.main("mlp", build=lambda **_: {}, argv=["--help"]))
    if name == "chaos-module":
        from elastic_dew import chaos

        return _exit_output(lambda: chaos.main(["--help"]))
    parser, _ = cli._parser(words)
    return _find(parser, words).format_help()


HELP_PAGES = {**_help_pages(), "recipe": [], "chaos-module": []}


def _compare(path: Path, actual: str) -> None:
    if REGENERATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.is_file(), f"{path} is missing: regenerate the goldens (see this module's docstring)"
    expected = path.read_text()
    assert _canonical(actual) == _canonical(expected), (
        f"{path.relative_to(GOLDEN.parent.parent)} differs from what the code prints; if the change is "
        "meant, regenerate (see this module's docstring) and say so in the commit"
    )


@pytest.mark.parametrize("name", sorted(HELP_PAGES))
def test_every_commands_help_reads_as_its_golden_file(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    _compare(GOLDEN / "help" / f"{name}.txt", _help(name, HELP_PAGES[name]))


def test_every_command_has_a_golden_help_page_and_no_page_is_left_over():
    assert sorted(p.stem for p in (GOLDEN / "help").glob("*.txt")) == sorted(HELP_PAGES)


# ----------------------------------------------------------------------- refusals

#: Command lines given to ``elastic-dew`` (run in an empty directory holding ``photos/cat.jpg``
#: and the file ``afile``), and Python expressions, each refused before anything is touched.
COMMANDS = [
    "train nosuch",
    "train mlp --global-batch 20 --min-slices 1",
    "train mlp --min-slices 5",
    "train mlp --min-slices 0",
    "train mlp --snapshot-every -1",
    "train mlp --checkpoint-every -2",
    "train mlp --steps 0",
    "train mlp --steps x",
    "train mlp --poll-interval 0",
    "train mlp --timeout 0",
    "train mlp --max-attempts 0",
    "train mlp --retry-reset-steps -1",
    "train mlp --step-timeout 0",
    "train mlp --model-axis 3",
    "train mlp --mtc-backup-minutes 0",
    "train mlp --log-every 0",
    "train mlp --microbatch 0",
    "train mlp --eval-every 0",
    "train mlp --slices 0",
    "train mlp --devices-per-slice 0",
    "train mlp --sharding diagonal",
    "train mlp --checkpoint-kind zip",
    "train mlp --schedule lose:1@3/lunch",
    "train mlp --schedule lose:9@3",
    "train mlp --schedule lose:3@17,restore:3@35",
    "train mlp --run-dir photos",
    "train mlp --run-dir afile/run",
    "train mlp --run-dir run --name y",
    "train mlp --set hidden",
    "train mlp --set depth=3",
    "train mlp --checkpoint-kind multi_tier --checkpoint-dir elsewhere",
    "JAX_PLATFORMS=proxy train mlp --schedule preempt@3 --slices 2",
    "JAX_PLATFORMS=proxy train mlp --run-dir /elastic-dew-no-such-mount/runs/x",
    "JAX_PLATFORMS=proxy ENABLE_PATHWAYS_PERSISTENCE=1 train mlp --run-dir run",
    "report photos",
    "report nothing-here",
    "launch -n 0 -- true",
    "launch -n 2",
    "launch -n 2 --grace -1 -- true",
    "launch -n 2 --env NOEQUALS -- true",
    "chaos --seed -1",
    "chaos --seeds 5:2",
    "chaos --seed 1 --workdir photos",
    "gcs-server --port 0",
    "gcs-server --bucket Bad_Name",
    "k8s render --name dew --tpu-type v5e --topology 4x8 --slices 2 --elastic-slices 3 --image r/c:1 "
    "--recipe lm --bucket gs://b-1",
    "k8s render --name dew --tpu-type v6e-16 --topology 4x8 --slices 2 --elastic-slices 1 --image r/c:1 "
    "--recipe lm --bucket gs://b-1",
    "k8s render --name dew --tpu-type v6e --slices 2 --elastic-slices 1 --image r/c:1 --recipe lm --bucket gs://b-1",
    "k8s render --name dew --tpu-type v6e-16 --slices 2 --elastic-slices 1 --image r/c:1 --recipe gpt "
    "--bucket gs://b-1",
    "k8s render --name dew --tpu-type v6e-16 --slices 2 --elastic-slices 1 --image r/c:1 --recipe lm "
    "--bucket gs://b-1 --mtc",
    "k8s render --name dew --tpu-type v6e-16 --slices 2 --elastic-slices 1 --image r/c:1 --recipe lm "
    "--bucket gs://b-1 --grace-seconds 10",
    "k8s render --name dew --tpu-type v6e-16 --slices 2 --elastic-slices 1 --image r/c:1 --recipe lm "
    "--bucket gs://b-1 --out missing/js.yaml",
    "k8s priority-class --name high --value 2000000000",
    "k8s checkpoint-config --name c --bucket gs://b-1 --tpu-type v6e --in-memory-size lots",
    "k8s validate missing.yaml",
    "plan --slices 0",
    "plan --slices 4 --step-seconds -1",
    "plan --slices 4 --slice-mtbf-hours 0",
    "plan --slices 4",
    "simulate --slices 0 -- python -c pass",
    "simulate --schedule lose:9@3 -- python -c pass",
    "simulate --restarts -1 -- python -m json.tool",
    "simulate -- nosuchprogram",
]

PYTHON = [
    "ElasticConfig(global_batch=0)",
    "ElasticConfig(minimum_slice_count=0)",
    "ElasticConfig(poll_interval=0)",
    "ElasticConfig(timeout=0)",
    "ElasticConfig(max_attempts=0)",
    "ElasticConfig(retry_reset_steps=-1)",
    "ElasticConfig(snapshot_every=-1)",
    "ElasticConfig(checkpoint_every=-5)",
    "ElasticConfig(model_axis=0)",
    "ElasticConfig(max_to_keep=0)",
    "ElasticConfig(batch_policy='linear')",
    "ElasticConfig(checkpoint_kind='zip')",
    "ElasticConfig(minimum_slice_count=5).check_slices(4)",
    "TrainConfig(log_every=0)",
    "TrainConfig(microbatch=0)",
    "TrainConfig(eval_batch=1.5)",
    "TrainConfig(sharding='diagonal')",
    "SimConfig(slices=0)",
    "RunConfig(recipe='mlp', steps=0)",
    "RunConfig(recipe='mlp', train={})",
    "ObserveOptions(log_format='xml')",
    "JobSetParams(name='dew', tpu_type='v5e', topology='4x8', slices=2, elastic_slices=3, image='r/c:1', "
    "recipe='lm', bucket='gs://b-1').check()",
    "JobSetParams(name='dew', tpu_type='v6e-16', topology='4x8', slices=2, elastic_slices=1, image='r/c:1', "
    "recipe='lm', bucket='gs://b-1').check()",
]


def _run_command(line: str, where: Path, monkeypatch) -> str:
    words, env = shlex.split(line), []
    while words and "=" in words[0]:
        env.append(words.pop(0))
        key, _, value = env[-1].partition("=")
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(words)
        except SystemExit as exited:  # argparse's usage errors
            status = exited.code
    # The refusal, and argparse's usage; not a library's log lines (JSON off a terminal).
    text = "".join(line for line in err.getvalue().replace(str(where), "TMP").splitlines(keepends=True)
                   if not line.startswith('{"severity"'))
    return f"$ {' '.join([*env, 'elastic-dew', shlex.join(words)])}\nexit {status}\n{text}"


def _run_python(expression: str) -> str:
    from elastic_dew.elastic.config import ElasticConfig
    from elastic_dew.k8s.params import JobSetParams
    from elastic_dew.observe.sinks import ObserveOptions
    from elastic_dew.run import RunConfig, SimConfig
    from elastic_dew.train_config import TrainConfig

    names = dict(ElasticConfig=ElasticConfig, TrainConfig=TrainConfig, SimConfig=SimConfig, RunConfig=RunConfig,
                 ObserveOptions=ObserveOptions, JobSetParams=JobSetParams)
    try:
        eval(expression, names)  # noqa: S307 - the expressions above, nothing else
    except (ValueError, TypeError) as error:
        return f">>> {expression}\n{type(error).__name__}: {error}\n"
    raise AssertionError(f"{expression} was not refused")


def test_every_refusal_reads_as_its_golden_file(tmp_path, monkeypatch, capsys):
    """One file, so a change to a refusal's wording is one diff to read."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("JOBSET_NAME", raising=False)
    # This process's JAX has started: a refused run must not set it up again.
    monkeypatch.setattr("elastic_dew.runtime.prepare_process", lambda **options: None)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "afile").write_text("x")
    blocks = []
    for line in COMMANDS:
        with monkeypatch.context() as scoped:
            blocks.append(_run_command(line, tmp_path, scoped))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "photos"], f"{line} wrote something"
    blocks += [_run_python(expression) for expression in PYTHON]
    _compare(GOLDEN / "refusals.txt", "\n".join(blocks))
