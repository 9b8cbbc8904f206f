"""The README is a front door that stays true: short, its two set-up commands are real Makefile
targets, CI runs the test command it names; and every exit code and environment variable the code
defines is documented in docs/operations.md, where the README sends operators."""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.cli import common

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _two_commands() -> list[str]:
    """The commands of the README's "Two commands" block (the first fenced block after it)."""
    section = README.split("## Two commands", 1)[1]
    block = section.split("```", 2)[1]
    return [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]


def test_the_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def test_the_two_commands_are_make_demo_and_make_test_and_both_are_makefile_targets():
    assert _two_commands() == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for command in _two_commands():
        target = command.split()[1]
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"no Makefile target {target!r}"
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "dpstream demo" in demo  # the main job on the embedded default


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in _two_commands()
    assert re.search(r"^make test\s*$", ci, re.MULTILINE)


def test_every_exit_code_is_documented_in_operations():
    operations = (ROOT / "docs" / "operations.md").read_text()
    table = operations.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    defined = {value for name, value in vars(common).items() if name.startswith("EXIT_")}
    assert defined == documented, f"defined {sorted(defined)}, documented {sorted(documented)}"


def test_every_environment_variable_the_code_reads_is_documented_in_operations():
    operations = (ROOT / "docs" / "operations.md").read_text()
    sources = [
        *(ROOT / "pipeline").rglob("*.py"),
        *(ROOT / "jobs").rglob("*.py"),
        ROOT / "deploy" / "create_topics.py",
    ]
    named = {m for path in sources for m in re.findall(r"DPSTREAM_[A-Z_]*[A-Z_]", path.read_text())}
    missing = sorted(name for name in named if name not in operations)
    assert not missing, f"environment variables not in docs/operations.md: {missing}"
