"""The control socket bound again after a stop, as the daemon does when an upgrade
fails at the handover (its successor died after `ready`) or when its runtime directory
was removed under it: `cairnqd status` must get an answer from the new socket."""

from __future__ import annotations

from pathlib import Path

from cairnqd.daemon.parent.control import ControlServer, ask_daemon


def test_a_control_server_started_again_after_a_stop_answers(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    path = str(run / "cairnqd-test.sock")
    server = ControlServer(path)
    server.start()
    try:
        server.publish_due(lambda: {"generation": 1})
        assert ask_daemon(path)["generation"] == 1
        server.stop()
        server.start()
        assert ask_daemon(path, timeout_s=10)["generation"] == 1
    finally:
        server.stop()
