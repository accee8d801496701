"""`cairnqd init` writes a starter config that `check` accepts and never overwrites;
the wheel carries the example config, the systemd unit and the monitoring files."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cairnqd.cli.shipped import SHIPPED, shipped_path, shipped_root
from tests.support.cli import REPO, Run, cli_env


def test_init_writes_a_config_check_accepts_and_prints_the_next_commands(
    tmp_path: Path, run: Run
) -> None:
    done = run("init", "app")
    assert done.returncode == 0, done.stderr
    config = tmp_path / "app" / "cairnq.yaml"
    assert done.stdout.splitlines() == [
        "wrote app/cairnq.yaml",
        "next:",
        "  cairnqd -c app/cairnq.yaml migrate    # create the SQLite database",
        "  cairnqd -c app/cairnq.yaml            # run the daemon (Ctrl-C stops it)",
    ]
    text = config.read_text()
    assert "  - cairnqd.demo:registry\n  # - myapp.tasks:registry\n" in text
    assert str(shipped_root() / "config" / "cairnq.example.yaml") in text
    checked = run("-c", "app/cairnq.yaml", "check", "--handlers")
    assert checked.returncode == 0, checked.stderr
    assert "app/cairnq.yaml: OK (1 group, 1 queue, sqlite)" in checked.stdout
    assert f"database: sqlite {tmp_path / 'app' / 'cairnq.db'} (not contacted)" in checked.stdout
    assert "group default: handlers demo.echo, demo.fail, demo.sleep" in checked.stdout
    # The first of the two printed commands works as printed.
    assert run("-c", "app/cairnq.yaml", "migrate").returncode == 0
    assert (tmp_path / "app" / "cairnq.db").exists()


def test_init_never_overwrites(tmp_path: Path, run: Run) -> None:
    (tmp_path / "cairnq.yaml").write_text("mine\n")
    done = run("init")
    assert done.returncode == 1
    assert done.stderr == "cairnqd: ./cairnq.yaml already exists; not overwriting it\n"
    assert (tmp_path / "cairnq.yaml").read_text() == "mine\n"


def test_init_writes_a_yaml_file_named_instead_of_a_directory(tmp_path: Path, run: Run) -> None:
    done = run("init", "conf/prod.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "wrote conf/prod.yaml"
    assert (tmp_path / "conf" / "prod.yaml").is_file()
    assert run("-c", "conf/prod.yaml", "check").returncode == 0
    # An existing file is no directory to write cairnq.yaml in, nor overwritten.
    (tmp_path / "notes.txt").write_text("mine\n")
    done = run("init", "notes.txt")
    assert done.returncode == 64
    assert done.stderr.startswith("cairnqd: notes.txt is a file, not a directory")
    done = run("init", "conf/prod.yaml")
    assert done.returncode == 1 and "conf/prod.yaml already exists" in done.stderr


def test_shipped_files_are_found_in_a_checkout() -> None:
    assert shipped_root() == REPO
    for name in SHIPPED:
        assert shipped_path(name).is_file(), name


@pytest.mark.slow
def test_the_wheel_carries_the_shipped_files(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)]
    built = subprocess.run(pip, capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("cairnqd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SHIPPED:
        assert f"cairnqd/_shipped/{name}" in names, name
    # Unpacked and imported from there, the package finds its own copies.
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    env = {**cli_env(), "PYTHONPATH": str(unpacked)}
    code = (
        "from cairnqd.cli.shipped import shipped_path\n"
        "print(shipped_path('systemd/cairnqd.service'))"
    )
    found = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert found.returncode == 0, found.stderr
    shipped = unpacked / "cairnqd" / "_shipped" / "systemd" / "cairnqd.service"
    assert found.stdout.strip() == str(shipped)
