"""`python_path`: `check --handlers` and every child import handlers from the same
directories, relative to the config file, whatever directory cairnqd starts in."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import Run, running_daemon, write_config

TASKS = """\
from cairnqd.registry import TaskRegistry

registry = TaskRegistry()


@registry.task("app.double")
async def double(ctx, payload):
    return {"n": payload["n"] * 2}
"""


def groups(handlers: str, extra: str = "") -> str:
    return (
        f"{extra}handlers: [{handlers}]\ngroups:\n  default:\n    queues: [default]\n"
        "metrics:\n  listen: off\nshutdown_timeout: 5s\n"
    )


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """tmp_path/app holds the config and the package `apptasks`; tests run from
    tmp_path/shell, where nothing is importable."""
    (tmp_path / "shell").mkdir()
    package = tmp_path / "app" / "apptasks"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(TASKS)
    return tmp_path / "app"


def test_default_python_path_is_the_config_directory_for_check_and_children(
    tmp_path: Path, app: Path, run: Run
) -> None:
    config = write_config(app, "path: tasks.db", groups=groups("apptasks.tasks:registry"))
    shell = tmp_path / "shell"
    checked = run("-c", "../app/cairnq.yaml", "check", "--handlers", cwd=shell)
    assert checked.returncode == 0, checked.stderr
    assert "group default: handlers app.double" in checked.stdout
    assert run("-c", str(config), "migrate").returncode == 0
    with running_daemon(config, cwd=shell) as daemon:
        done = run(
            "-c", str(config), "submit", "app.double", "--payload", '{"n": 21}',
            "--wait", "--timeout", "60s", cwd=shell,
        )  # fmt: skip
        assert done.returncode == 0, (done.stderr, daemon.poll())
        assert json.loads(done.stdout.split("\n", 1)[1]) == {"n": 42}


def test_relative_python_path_entries(tmp_path: Path, app: Path, run: Run) -> None:
    (app / "apptasks").rename(tmp_path / "apptasks")
    write_config(
        app, "path: tasks.db", groups=groups("apptasks.tasks:registry", "python_path: [..]\n")
    )
    checked = run("-c", "app/cairnq.yaml", "check", "--handlers")
    assert checked.returncode == 0, checked.stderr
    # Without the entry the handlers are not found, from the same directory.
    write_config(app, "path: tasks.db", groups=groups("apptasks.tasks:registry"))
    missing = run("-c", "app/cairnq.yaml", "check", "--handlers")
    assert missing.returncode == 78
    assert "No module named 'apptasks'" in missing.stderr
    assert f"sys.path starts with {app}" in missing.stderr


def test_a_missing_python_path_directory_is_a_warning(app: Path, run: Run) -> None:
    write_config(
        app, "path: tasks.db", groups=groups("apptasks.tasks:registry", "python_path: [., lib]\n")
    )
    checked = run("-c", "app/cairnq.yaml", "check")
    assert checked.returncode == 0
    assert f"python_path[1]: {app / 'lib'} is not a directory" in checked.stderr


@pytest.mark.parametrize(
    ("source", "line", "error"),
    [
        ("import os\n\nvalue = undefined_name\n", 3, "NameError"),
        ("def broken(:\n    pass\n", 1, "SyntaxError"),
        ("import os\nimport not_installed_anywhere\n", 2, "ModuleNotFoundError"),
    ],
)
def test_handler_import_errors_name_file_and_line(
    app: Path, run: Run, source: str, line: int, error: str
) -> None:
    (app / "apptasks" / "broken.py").write_text(textwrap.dedent(source))
    write_config(app, "path: tasks.db", groups=groups("apptasks.broken:registry"))
    checked = run("-c", "app/cairnq.yaml", "check", "--handlers")
    assert checked.returncode == 78
    first = checked.stderr.splitlines()[0]
    where = f"{app / 'apptasks' / 'broken.py'}:{line}: "
    assert first.startswith(f"handlers: group default: {where}"), first
    assert error in first


def test_a_missing_attribute_names_the_module_file(app: Path, run: Run) -> None:
    write_config(app, "path: tasks.db", groups=groups("apptasks.tasks:registri"))
    checked = run("-c", "app/cairnq.yaml", "check", "--handlers")
    assert checked.returncode == 78
    assert f"{app / 'apptasks' / 'tasks.py'}:1: apptasks.tasks:registri: " in checked.stderr
    assert "has no attribute registri" in checked.stderr
