"""No test file imports another test file: what two test files share lives in tests/support/ (or in
tests/conftest.py), so editing one test file cannot break another.

Read from the source with ``ast`` (nothing is imported): every ``import`` and ``from ... import``
counts, inside functions too. A test file is a module ``test_*`` directly under tests/ (pytest
puts tests/ on ``sys.path``, so such a module is importable as ``test_x`` or ``tests.test_x``).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out += [(node.module, node.lineno)]
            out += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return out


def imports_of_test_files(root: Path = TESTS) -> list[str]:
    """``file:line imports test_x`` for each import of a test file by a module under ``root``."""
    test_files = {path.stem for path in root.glob("test_*.py")}
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for module, line in _imported_modules(path):
            parts = module.split(".")
            name = parts[1] if parts[0] == "tests" and len(parts) > 1 else parts[0]
            entry = f"{path.relative_to(root)}:{line} imports {name}"
            if name in test_files and entry not in found:
                found.append(entry)
    return found


def test_no_test_file_imports_another_test_file():
    found = imports_of_test_files()
    assert not found, ("shared test helpers belong in tests/support/ or tests/conftest.py:\n"
                       + "\n".join(found))


def test_the_check_finds_every_form_of_such_an_import(tmp_path):
    """The check itself sees ``from test_x import``, ``import test_x``, ``from tests.test_x`` and
    ``from tests import test_x``, inside a function too, from tests/support/ as well."""
    (tmp_path / "test_a.py").write_text("def helper():\n    pass\n")
    (tmp_path / "support").mkdir()
    (tmp_path / "test_b.py").write_text("from test_a import helper\nimport os\n")
    (tmp_path / "test_c.py").write_text("def test():\n    import test_a\n")
    (tmp_path / "test_d.py").write_text("from tests.test_a import helper\nfrom tests import test_a\n")
    (tmp_path / "support" / "runs.py").write_text("from test_a import helper\n")
    (tmp_path / "test_e.py").write_text("from support.runs import helper\nimport test_e_data\n")
    assert imports_of_test_files(tmp_path) == [
        "support/runs.py:1 imports test_a",
        "test_b.py:1 imports test_a",
        "test_c.py:2 imports test_a",
        "test_d.py:1 imports test_a",
        "test_d.py:2 imports test_a",
    ]
