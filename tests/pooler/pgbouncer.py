"""A real PgBouncer of the test suite's own, in front of the test Postgres.

`PgBouncer` writes its own pgbouncer.ini and userlist into a private directory, starts
`pgbouncer` on a free local port in the pool mode asked for (trust auth: the test
server trusts local connections), waits until it answers, and stops it afterwards.
Every database on the server is reachable through it (`* =` in [databases]), so the
suite's throwaway databases need no entry of their own.

PgBouncer refuses to run as root: as root it is started with `-u postgres` (the
server's own user, which exists wherever the Debian server package is installed), and
its directory is handed to that user. With KEEP_PGB=1 in the environment the directory
(pgbouncer.ini, pgbouncer.log) is left behind for a look after the test.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.support.databases import PG_DSN, REQUIRE_PG
from tests.support.waiting import wait_for

#: Where Debian puts it; also looked up on PATH.
_KNOWN_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str:
    """The pgbouncer executable; a missing one skips, or fails under CAIRNQD_REQUIRE_PG=1
    (CI installs it: .ci/run)."""
    found = shutil.which("pgbouncer") or next(
        (p for p in _KNOWN_PATHS if os.access(p, os.X_OK)), None
    )
    if found is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer)"
        if REQUIRE_PG:
            pytest.fail(message)
        pytest.skip(message)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One PgBouncer process in `mode` (session or transaction)."""

    def __init__(self, mode: str, *, pool_size: int = 20) -> None:
        self.mode = mode
        self.pool_size = pool_size
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"cairnqd-pgbouncer-{mode}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        upstream = psycopg.conninfo.conninfo_to_dict(PG_DSN)
        self.user = str(upstream.get("user") or "postgres")
        self._upstream_host = str(upstream.get("host") or "127.0.0.1")
        self._upstream_port = str(upstream.get("port") or "5432")

    def dsn(self, target_dsn: str) -> str:
        """`target_dsn` (a database on the test server) reached through this pooler."""
        dbname = psycopg.conninfo.conninfo_to_dict(target_dsn).get("dbname") or "postgres"
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def _write_config(self) -> Path:
        ini = self.dir / "pgbouncer.ini"
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        ini.write_text(
            "[databases]\n"
            f"* = host={self._upstream_host} port={self._upstream_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            f"admin_users = {self.user}\n"
            f"pool_mode = {self.mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            "max_db_connections = 0\n"
            # psycopg sends none of these, but libpq-based tools may.
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        return ini

    def start(self) -> PgBouncer:
        binary = pgbouncer_binary()
        ini = self._write_config()
        command = [binary, str(ini)]
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.dir, account.pw_uid, account.pw_gid)
            for path in self.dir.iterdir():
                os.chown(path, account.pw_uid, account.pw_gid)
            command = [binary, "-u", "postgres", str(ini)]
        # Its log lines also go to stderr: into a file, never a pipe nobody reads (once
        # the pipe's 64 KiB filled, PgBouncer would block on the write and hang).
        with open(self.dir / "pgbouncer.out", "wb") as out:
            self.proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir
            )

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                out = (self.dir / "pgbouncer.out").read_text(errors="replace")
                raise AssertionError(f"pgbouncer exited {self.proc.returncode}: {out}{self.log()}")
            try:
                with psycopg.connect(self.dsn(PG_DSN), connect_timeout=2) as conn:
                    conn.execute("select 1")
                return True
            except psycopg.OperationalError:
                return False

        wait_for(f"pgbouncer ({self.mode}) to answer on port {self.port}", answers, 30)
        return self

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # immediate shutdown: clients are dropped
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not os.environ.get("KEEP_PGB"):
            shutil.rmtree(self.dir, ignore_errors=True)
