"""The test suite's own shape: no test module imports another test module.

A test module that imports another drags that module's fixtures and module-level work
into its own run, and ties the two together so neither can move. What suites share
lives in helper modules (tests/support/: waiting.py, harness.py, ...) or conftest.py.
import-linter cannot say this (its wildcards replace whole module names, not `test_*`),
so it is checked here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def is_test_module(dotted: str) -> bool:
    return dotted.split(".")[0] == "tests" and dotted.rsplit(".", 1)[-1].startswith("test_")


def imported_test_modules(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every test module `source` imports, in any import form."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_test_module(alias.name):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if is_test_module(node.module):
                yield node.lineno, node.module
            for alias in node.names:  # `from tests.daemon import test_metrics`
                if is_test_module(f"{node.module}.{alias.name}"):
                    yield node.lineno, f"{node.module}.{alias.name}"


def test_the_checker_sees_every_import_form() -> None:
    source = (
        "import tests.daemon.test_metrics\n"
        "from tests.unit.test_monitoring import ALERTS\n"
        "from tests.daemon import test_supervisor\n"
        "from tests.support.harness import scrape\n"
        "def late():\n    from tests.worker.test_lease import x\n"
    )
    assert sorted(imported_test_modules(source)) == [
        (1, "tests.daemon.test_metrics"),
        (2, "tests.unit.test_monitoring"),
        (3, "tests.daemon.test_supervisor"),
        (6, "tests.worker.test_lease"),
    ]


def test_no_test_module_imports_another() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
        for path in sorted(TESTS.rglob("test_*.py"))
        for line, module in imported_test_modules(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "move what they share into a helper module:\n" + "\n".join(found)
