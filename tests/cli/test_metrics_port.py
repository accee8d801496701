"""A metrics port already in use stops the daemon with one line and exit 78, which the
systemd unit does not restart, instead of a traceback and 70 restarted forever."""

from __future__ import annotations

import configparser
import socket
import subprocess
import sys
from pathlib import Path

from cairnqd.daemon import exitcodes
from tests.support.cli import REPO, cli_env, database_line, write_config


def test_port_in_use_is_one_line_and_exit_78(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path, database_line("sqlite", str(tmp_path / "t.db")))
        text = config.read_text().replace("listen: off", f'listen: "127.0.0.1:{port}"')
        config.write_text(text)
        line = 1 + text.splitlines().index(f'  listen: "127.0.0.1:{port}"')
        done = subprocess.run(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(config)],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == exitcodes.CONFIG == 78, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert "cairnqd started" not in done.stderr and "spawned" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr
    assert (
        f"cannot start: cannot serve metrics on 127.0.0.1:{port}: the address is already in use"
        in errors[0]
    )
    assert f"set metrics.listen at {config}:{line}:11 to a free port, or off" in errors[0]


def test_the_unit_does_not_restart_on_78() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "systemd" / "cairnqd.service")
    assert "78" in unit["Service"]["RestartPreventExitStatus"].split()
