"""`cairnqd dashboard -c FILE`: the dashboard without a daemon, for an ops host that
runs no workers (or beside a daemon whose config leaves `dashboard.listen` off).

It reads the same database as the daemon. The Workers page shows the children of a
daemon running this config on this host, asked over its control socket as `cairnqd
status` asks; with none, it says so.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from cairnqd.config import Config
from cairnqd.daemon.exitcodes import CONFIG, OK
from cairnqd.daemon.logs import LoggingSetupError, configure_logging
from cairnqd.daemon.parent.control import DaemonUnreachable, ask_daemon, control_path
from cairnqd.daemon.parent.statefile import state_path
from cairnqd.dashboard.data import DashboardData
from cairnqd.dashboard.server import DashboardBindError, DashboardServer

log = logging.getLogger("cairnqd.dashboard")


def local_daemon(config_path: str, config: Config) -> Any:
    path = control_path(state_path(os.path.abspath(config_path), config.runtime_dir))

    def view() -> dict[str, Any]:
        try:
            return ask_daemon(path, timeout_s=2.0)
        except DaemonUnreachable as exc:
            raise RuntimeError(f"no daemon runs this config on this host ({exc})") from None

    return view


def run_dashboard(config_path: str, config: Config) -> int:
    """Serve until SIGTERM or SIGINT; 78 when the dashboard cannot be served."""
    try:
        configure_logging(config.logging, process_label="dashboard")
    except LoggingSetupError as exc:
        print(f"cairnqd: {exc}")
        return CONFIG
    if config.dashboard.listen is None:
        log.error(
            "dashboard.listen is off in %s: set it to host:port (e.g. 127.0.0.1:8470)",
            config_path,
        )
        return CONFIG
    data = DashboardData(config, daemon_view=local_daemon(config_path, config))
    server = DashboardServer(config, data)
    try:
        port = server.start()
    except DashboardBindError as exc:
        log.error("%s; set dashboard.listen to a free port", exc)
        return CONFIG
    listen = config.dashboard.listen
    host = f"[{listen.host}]" if ":" in listen.host else listen.host
    log.info("dashboard on http://%s:%d/", host, port)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    while not stop.wait(1.0):
        pass
    log.info("dashboard stopping")
    server.stop()
    return OK


__all__ = ["run_dashboard"]
