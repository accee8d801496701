"""`reload --wait` prints what a reload changed; a reload that changes nothing keeps
the generation. Against the real daemon."""

from __future__ import annotations

from pathlib import Path

from cairnqd.daemon.parent.statefile import StateFile, state_path
from tests.support.cli import Run, database_line, running_daemon, write_config
from tests.support.waiting import wait_for


def test_reload_wait_prints_the_changes(
    tmp_path: Path, dialect: str, db_target: str, run: Run
) -> None:
    config = write_config(tmp_path, database_line(dialect, db_target))
    assert run("migrate").returncode == 0
    statefile = StateFile(state_path(config, str(tmp_path / "run")))
    with running_daemon(config, cwd=tmp_path) as daemon:
        wait_for("the daemon's state file", lambda: daemon.poll() is None and statefile.read())
        same = run("reload", "--wait", "60s")
        assert same.returncode == 0, same.stderr
        assert same.stdout.startswith("reload applied: nothing changed; still generation 1")
        state = statefile.read()
        assert state is not None and state["generation"] == 1
        assert state["reload"]["changes"] == []

        text = config.read_text().replace(
            "queues: [default, mail]", "queues: [default, mail]\n    concurrency: 2"
        )
        config.write_text(text + "retention:\n  interval: 5m\n")
        changed = run("reload", "--wait", "60s")
        assert changed.returncode == 0, changed.stderr
        lines = changed.stdout.splitlines()
        assert lines[0].startswith("reload applied: generation 2")
        assert lines[1:] == [
            "  group default rolls: its config changed",
            "  settings applied in place: retention.interval",
        ]
