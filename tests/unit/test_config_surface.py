"""The config package's modules talk through public names only: no module imports
another's underscore name, so what one module keeps private stays free to change."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cairnqd"


def private_imports(source: str) -> list[tuple[int, str, str]]:
    """(line, module, name) for each underscore name imported from cairnqd.config."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cairnqd.config"):
            found += [
                (node.lineno, node.module or "", alias.name)
                for alias in node.names
                if alias.name.startswith("_")
            ]
    return found


def test_the_checker_sees_a_private_import() -> None:
    source = "from cairnqd.config.kinds import Kind, _secret\nfrom cairnqd.config import x\n"
    assert private_imports(source) == [(1, "cairnqd.config.kinds", "_secret")]


def test_no_module_imports_a_private_name_of_the_config_package() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} from {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, module, name in private_imports(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "\n".join(found)


def test_the_lazy_names_are_the_ones_mypy_is_shown() -> None:
    """cairnqd/config/__init__.py lists its names twice: imports under TYPE_CHECKING
    (what mypy checks) and `_HOME` (what is loaded on first use). They must agree, and
    each must resolve."""
    import cairnqd.config as config

    tree = ast.parse((PACKAGE / "config" / "__init__.py").read_text(encoding="utf-8"))
    shown = {
        alias.name: (node.module or "").removeprefix("cairnqd.config.")
        for guard in tree.body
        if isinstance(guard, ast.If) and ast.unparse(guard.test) == "TYPE_CHECKING"
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert shown == config._HOME
    assert set(config.__all__) <= set(shown)
    for name in shown:
        assert getattr(config, name) is getattr(
            __import__(f"cairnqd.config.{shown[name]}", fromlist=[name]), name
        )
