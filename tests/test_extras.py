"""Optional dependencies are extras the stream processes never import (pipeline/extras.py), and a
command that needs a missing one stops with one line naming the extra."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.extras import EXTRA_OF, extra_of_error

REPO = Path(__file__).resolve().parents[1]


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split(">")[0].split("=")[0].split("[")[0].split("<")[0].strip().lower() for r in requirements}


def test_the_optional_packages_are_extras_not_core_dependencies():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = _requirement_names(project["dependencies"])
    assert not core & set(EXTRA_OF), sorted(core & set(EXTRA_OF))
    for module, extra in EXTRA_OF.items():
        assert module in _requirement_names(project["optional-dependencies"][extra]), (module, extra)


def test_make_installs_every_extra_the_commands_and_tests_use():
    makefile = (REPO / "Makefile").read_text()
    for extra in set(EXTRA_OF.values()):
        assert f",{extra}" in makefile.split('pip install --quiet -e ".[', 1)[1].split("]", 1)[0] + ",", extra


@pytest.mark.parametrize("argv, module, extra", [
    (["report", "--broker", "127.0.0.1:1", "--deployment", "x", "--out", "page.html"], "plotly", "report"),
    (["export", "--broker", "127.0.0.1:1", "--deployment", "x", "--release", "r", "--out", "x.parquet"],
     "pyarrow", "files"),
    (["demo"], "matplotlib", "plots"),
])
def test_a_command_without_its_extra_says_which_to_install(argv, module, extra, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: find_spec and import fail
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"pip install 'dpstream[{extra}]'" in err[0] and module in err[0], err


def test_an_import_error_names_the_extra_only_for_an_extras_module():
    """main()'s safety net for an extra's module imported deep inside a command."""
    line = extra_of_error(ModuleNotFoundError("no plotly", name="plotly.graph_objects"), "dpstream report")
    assert line == "dpstream report needs plotly, which is not installed: pip install 'dpstream[report]'"
    assert extra_of_error(ModuleNotFoundError("no numpy", name="numpy"), "dpstream report") is None
    assert extra_of_error(ImportError("cannot import name"), "dpstream report") is None
