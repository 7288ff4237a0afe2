"""``elastic-dew k8s validate`` after a plain install: its schema libraries are the ``k8s``
extra, ``./dev`` installs that extra, and a missing library is refused with the command that
installs it. A missing library is simulated by hiding the module from the import system
(``sys.modules[name] = None``): uninstalling packages from the test's environment is not an
option.
"""

from __future__ import annotations

import re
import sys
import tomllib

import pytest

from elastic_dew.k8s import cli as k8s_cli
from elastic_dew.k8s import validate as V

from conftest import REPO


def _extras() -> dict[str, list[str]]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_k8s_extra_holds_the_schema_libraries_and_the_test_extra_keeps_them():
    extras = _extras()
    assert {"jsonschema", "kubernetes-validate"} <= _names(extras["k8s"])
    assert {"jsonschema", "kubernetes-validate"} <= _names(extras["test"])


def test_dev_installs_the_k8s_extra():
    install = [line for line in (REPO / "dev").read_text().splitlines() if "pip install" in line and "-e" in line]
    assert install and "k8s" in re.search(r"\.\[([^\]]*)\]", install[0]).group(1).split(",")


@pytest.mark.parametrize("module", ["jsonschema", "kubernetes_validate"])
def test_validate_without_a_schema_library_exits_2_naming_the_k8s_extra(module, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, module, None)
    args = k8s_cli_args(["validate", str(REPO / "k8s" / "jobset-elastic.yaml"), str(REPO / "k8s" / "high-prior-job.yaml")])
    assert k8s_cli.run(args) == 2
    err = capsys.readouterr().err
    assert f"{module} is not installed" in err
    assert "pip install 'elastic-dew[k8s]'" in err and V.INSTALL_K8S in err


def k8s_cli_args(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser(prog="elastic-dew k8s")
    k8s_cli.configure(parser)
    return parser.parse_args(argv)
