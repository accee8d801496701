"""The `cairnqd` command line, run as a real process against real SQLite and Postgres.

Each test writes a config into its own directory and runs `python -m cairnqd.cli`
there, asserting on exit codes (cairnqd/daemon/exitcodes.py), stdout and stderr. `reload` is tested
against a stand-in daemon that holds the real state file and answers SIGHUP the way
the supervisor does, so these tests do not depend on the supervisor.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairnqd.daemon.parent.statefile import AlreadyRunning, StateFile, state_path
from tests.support.cli import Run, cli_env, database_line, write_config
from tests.support.waiting import wait_for


def test_postgres_commands_refuse_an_unmigrated_database(
    tmp_path: Path, pg_dsn: str, run: Run
) -> None:
    write_config(tmp_path, database_line("postgres", pg_dsn))
    refused = run("stats")
    assert refused.returncode == 65
    assert "migration(s) pending" in refused.stderr and "cairnqd migrate" in refused.stderr
    assert run("migrate").returncode == 0
    assert run("stats").returncode == 0


# -- config ---------------------------------------------------------------------------


def test_bad_config_reports_every_problem_with_its_position(tmp_path: Path, run: Run) -> None:
    path = tmp_path / "cairnq.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            version: 1
            database:
              path: ./tasks.db
              busy_timeout: 5
            handlers: [cairnqd.demo:registry]
            groups:
              default:
                queues: [default]
                processes: two
                concurrancy: 3
            """
        )
    )
    for args in (["check"], ["-c", "cairnq.yaml", "run"], [], ["stats"], ["config", "dump"]):
        result = run(*args)
        assert result.returncode == 78, (args, result.stderr)
        file = "cairnq.yaml" if "-c" in args else "./cairnq.yaml"  # as given, or the default
        assert result.stderr.splitlines() == [
            f"{file}:4:17: database.busy_timeout: expected a duration like 30s, 5m, 1h, "
            "got 5: add a unit, e.g. 5s",
            f"{file}:9:16: groups.default.processes: expected an integer ≥ 1, got 'two'",
            f"{file}:10:5: groups.default.concurrancy: unknown key 'concurrancy'; "
            "did you mean 'concurrency'?",
            f"cairnqd: {file}: 3 problems in the config",
        ]
        assert result.stdout == ""


@pytest.mark.timing
def test_check_refuses_an_alias_bomb_at_once(sqlite_config: Path, run: Run) -> None:
    laughs = "".join(
        f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9) if n else 'lol'}]\n" for n in range(10)
    )
    text = sqlite_config.read_text()
    sqlite_config.write_text(text + laughs)
    line = len(text.splitlines()) + 5  # l4: its sixth alias passes 10000 expanded nodes
    started = time.monotonic()
    result = run("check", timeout=30)
    assert time.monotonic() - started < 15
    assert result.returncode == 78
    assert result.stderr.startswith(
        f"./cairnq.yaml:{line}:35: aliases expand to more than 10000 nodes"
    ), result.stderr


def test_missing_config_file(run: Run) -> None:
    result = run("-c", "nope.yaml", "check")
    assert result.returncode == 78
    assert "nope.yaml: cannot read the config file" in result.stderr


def test_check_ok_prints_a_summary(sqlite_config: Path, run: Run) -> None:
    result = run("check", "-c", str(sqlite_config))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"{sqlite_config}: OK (1 group, 2 queues, sqlite)" in out
    assert "group default: processes 1, concurrency 4, queues default, mail" in out
    assert "retention: every 10m: status=succeeded, older than 7d;" in out
    assert "metrics: off, ~" in out and " series" in out
    assert "handlers" not in out  # not imported without --handlers

    result = run("-c", str(sqlite_config), "check", "--handlers")
    assert result.returncode == 0, result.stderr
    assert "group default: handlers demo.echo, demo.fail, demo.sleep" in result.stdout


def test_check_handlers_reports_import_failures(tmp_path: Path, run: Run) -> None:
    extra = "  reports:\n    queues: [reports]\n    handlers: [no_such_module_xyz:registry]\n"
    config = write_config(tmp_path, "path: ./tasks.db")
    config.write_text(config.read_text().replace("metrics:", extra + "metrics:"))
    assert run("check").returncode == 0  # syntax alone is fine
    result = run("check", "--handlers")
    assert result.returncode == 78
    assert result.stdout.startswith("./cairnq.yaml: FAILED (2 groups, 3 queues, sqlite)")
    assert "group default: handlers demo.echo" in result.stdout
    lines = result.stderr.splitlines()
    assert lines[0].startswith(
        "handlers: group reports: no_such_module_xyz:registry: cannot import"
    )
    assert lines[1] == "cairnqd: ./cairnq.yaml: 1 problem; cairnqd would not start"


def test_check_prints_warnings(tmp_path: Path, run: Run) -> None:
    write_config(tmp_path, "path: ./tasks.db", "retention:\n  rules: []\n")
    config = tmp_path / "cairnq.yaml"
    config.write_text(config.read_text().replace("listen: off", 'listen: "0.0.0.0:9464"'))
    result = run("check")
    assert result.returncode == 0
    assert "warning: ./cairnq.yaml:" in result.stderr
    assert "metrics.listen: serves metrics beyond this host" in result.stderr
    assert "retention: every 10m: off (rules: [])" in result.stdout


def test_config_dump_redacts_the_dsn_password(tmp_path: Path, run: Run) -> None:
    write_config(tmp_path, 'dsn: "postgresql://cairnq:s3cr3t@db.example:5432/cairnq"')
    for fmt in ("yaml", "json"):
        result = run("config", "dump", "--format", fmt)
        assert result.returncode == 0, result.stderr
        assert "s3cr3t" not in result.stdout
        assert "postgresql://cairnq:***@db.example:5432/cairnq" in result.stdout
    data = json.loads(run("config", "dump", "--format", "json").stdout)
    assert data["groups"]["default"]["queues"] == ["default", "mail"]
    assert data["database"]["path"] is None


def test_config_from_environment_variable(tmp_path: Path, sqlite_config: Path, run: Run) -> None:
    moved = sqlite_config.rename(tmp_path / "elsewhere.yaml")
    result = run("check", env=cli_env(CAIRNQD_CONFIG=str(moved)))
    assert result.returncode == 0, result.stderr
    assert f"{moved}: OK" in result.stdout


# -- usage and version ----------------------------------------------------------------


def test_usage_errors_exit_64(run: Run) -> None:
    for args in (["bogus"], ["stats", "--nope"], ["inspect"], ["submit", "x", "--timeout", "1s"],
                 ["submit", "x", "--delay", "soon"], ["cancel", "a", "--key", "b"]):  # fmt: skip
        result = run(*args)
        assert result.returncode == 64, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert "not a duration: 'soon'" in run("submit", "x", "--delay", "soon").stderr
    assert run("--help").returncode == 0
    assert "CAIRNQD_CONFIG" in run("--help").stdout


def test_version(run: Run) -> None:
    result = run("version")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("cairnqd ")
    assert lines[1] == "storage protocol 1"  # the protocol numbers: tests/test_release.py
    assert lines[4].startswith("python 3.")
    assert lines[5].startswith("sqlite 3.")
    assert lines[6].startswith("psycopg 3.") and "libpq" in lines[6]


# -- the database ---------------------------------------------------------------------


def test_migrate_prints_both_ledgers(db_config: Path, run: Run) -> None:
    result = run("migrate")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "protocol_version: 1" in out
    shared, ours = out.index("cairnq_migrations:"), out.index("cairnqd_migrations:")
    assert "0001_init.sql" in out[shared:ours]
    assert "cairnqd_0001_task_keys_task_idx.sql" in out[ours:]
    assert "APPLIED_AT" in out and "Z\n" in out
    assert run("migrate").stdout.count(".sql") == out.count(".sql")  # idempotent


def test_migrate_dry_run_lists_what_would_run_and_migrate_marks_it(
    tmp_path: Path, dialect: str, db_target: str, run: Run
) -> None:
    write_config(tmp_path, database_line(dialect, db_target))
    dry = run("migrate", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    listed = [line.strip() for line in dry.stdout.splitlines() if line.startswith("  ")]
    assert listed[0] == "0001_init.sql" and listed[-1].startswith("cairnqd_")
    assert "would apply" in dry.stdout
    assert run("migrate", "--dry-run").stdout == dry.stdout  # it applied nothing
    done = run("migrate")
    assert done.returncode == 0, done.stderr
    marked = [line for line in done.stdout.splitlines() if line.endswith("applied now")]
    assert len(marked) == len(listed)
    assert f"applied now: {len(listed)} (" in done.stdout
    again = run("migrate", "--dry-run")
    assert "nothing to apply: the database is up to date" in again.stdout
    assert "applied now: 0" in run("migrate").stdout


def test_migrate_unreachable_database_exits_69(tmp_path: Path, run: Run) -> None:
    write_config(tmp_path, 'dsn: "postgresql://nobody:pw@127.0.0.1:1/none"')
    for command in ("migrate", "stats"):
        result = run(command)
        assert result.returncode == 69, result.stderr
        assert result.stderr.startswith("cairnqd: cannot connect to Postgres")
        assert "pw@" not in result.stderr and "***" in result.stderr
        assert len(result.stderr.splitlines()) == 1


def test_not_a_cairnq_database_exits_65(tmp_path: Path, run: Run) -> None:
    (tmp_path / "junk.db").write_bytes(b"this is not a sqlite file" * 100)
    write_config(tmp_path, "path: ./junk.db")
    result = run("migrate")
    assert result.returncode == 65, result.stderr
    assert "junk.db is not a SQLite database cairnqd can use" in result.stderr


def _submit(run: Run, *args: str) -> str:
    result = run("submit", *args)
    assert result.returncode == 0, result.stderr
    task_id = result.stdout.strip()
    assert task_id.startswith("task_")
    return task_id


def test_task_round_trip(db_config: Path, run: Run) -> None:
    first = _submit(run, "demo.echo", "--payload", '{"n": 1}', "--queue", "mail", "--key", "k1")
    assert _submit(run, "demo.echo", "--key", "k1", "--queue", "mail") == first  # reuse
    second = _submit(run, "demo.sleep", "--payload", "[1, 2]", "--priority", "5", "--delay", "1h")

    listed = json.loads(run("list", "--json").stdout)
    assert {t["id"] for t in listed} == {first, second}
    only = json.loads(run("list", "--queue", "mail", "--json").stdout)
    assert [t["id"] for t in only] == [first]
    table = run("list", "--status", "queued").stdout
    assert first in table and second in table and "ATTEMPT" in table
    assert run("list", "--name", "nope").stdout.strip().endswith("(no tasks)")

    shown = json.loads(run("inspect", first, "--json").stdout)
    assert shown["payload"] == {"n": 1} and shown["queue"] == "mail"
    by_key = run("inspect", "--key", "k1").stdout
    assert f"id: {first}" in by_key and '"n": 1' in by_key and "created_at_ms: " in by_key
    assert run("inspect", "--key", "nope").returncode == 1

    stats = json.loads(run("stats", "--json").stdout)
    assert stats["mail"]["queued"] == 1 and stats["default"]["queued"] == 1
    assert set(json.loads(run("stats", "--queue", "mail", "--json").stdout)) == {"mail"}
    stats_lines = run("stats").stdout.splitlines()
    assert stats_lines[0].split() == [
        "QUEUE",
        "QUEUED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "CANCELED",
        "TOTAL",
    ]
    assert stats_lines[-2].split() == ["(all)", "2", "0", "0", "0", "0", "2"]
    assert stats_lines[-1].startswith("RUNNING counts every claimed task")

    result = run("cancel", first)
    assert (result.returncode, result.stdout) == (0, f"{first} canceled\n")
    result = run("cancel", "--key", "k1")
    assert result.returncode == 1
    assert (
        f"task {first} is canceled: only queued or running tasks can be canceled" in result.stderr
    )
    assert run("cancel", "task_nope").stderr == "cairnqd: no task task_nope\n"

    result = run("retry", "--key", "k1", "--reset-attempt")
    assert (result.returncode, result.stdout) == (0, f"{first} queued (attempt 0/3)\n")
    result = run("retry", second)
    assert (
        result.returncode == 1 and "only failed or canceled tasks can be retried" in result.stderr
    )

    assert run("cancel", first).returncode == 0
    # Bare purge: the configured rules only (canceled after 7d), so nothing yet.
    assert "would delete up to 0 task(s) by retention.rules" in run("purge", "--dry-run").stdout
    assert "would delete 1 task(s): all finished tasks, older than 0s" in (
        run("purge", "--dry-run", "--older-than", "0s").stdout
    )
    assert "would delete 0" in run("purge", "--dry-run", "--older-than", "1d").stdout
    assert "would delete 0" in run("purge", "--dry-run", "--status", "failed").stdout
    assert run("inspect", first).returncode == 0  # dry run deleted nothing
    result = run("purge", "--status", "canceled", "--queue", "mail", "--limit", "1", "--yes")
    assert result.stdout == "deleted 1 task(s): status=canceled, queue=mail, older than 0s\n"
    assert run("inspect", first).returncode == 1
    assert [t["id"] for t in json.loads(run("list", "--json").stdout)] == [second]


def test_submit_payload_errors(sqlite_db: Path, tmp_path: Path, run: Run) -> None:
    result = run("submit", "demo.echo", "--payload", '{"a": }')
    assert result.returncode == 65
    assert result.stderr == (
        "cairnqd: --payload: invalid JSON at line 1 column 7 (char 6): Expecting value\n"
    )
    (tmp_path / "bad.json").write_text('{\n  "a": 1,\n}')
    result = run("submit", "demo.echo", "--payload-file", "bad.json")
    assert result.returncode == 65 and "bad.json: invalid JSON at line 3 column 1" in result.stderr
    assert run("submit", "demo.echo", "--payload-file", "missing.json").returncode == 66
    (tmp_path / "good.json").write_text('{"from": "file"}')
    task_id = _submit(run, "demo.echo", "--payload-file", "good.json")
    assert json.loads(run("inspect", task_id, "--json").stdout)["payload"] == {"from": "file"}
    from_stdin = run("submit", "demo.echo", "--payload-file", "-", stdin='{"from": "stdin"}')
    task_id = from_stdin.stdout.strip()
    assert json.loads(run("inspect", task_id, "--json").stdout)["payload"] == {"from": "stdin"}
    # A rejected key is "nothing done", not a crash.
    _submit(run, "demo.echo", "--key", "once")
    result = run("submit", "demo.echo", "--key", "once", "--conflict", "reject")
    assert result.returncode == 1 and "already exists" in result.stderr


def test_submit_wait_without_a_worker_times_out(sqlite_db: Path, run: Run) -> None:
    result = run("submit", "demo.echo", "--wait", "--timeout", "300ms")
    assert result.returncode == 75, result.stderr
    task_id = result.stdout.strip()
    assert task_id.startswith("task_")  # printed before waiting, so it can be followed
    assert f"task {task_id} did not finish within 300ms: never claimed" in result.stderr


# -- reload against a stand-in daemon --------------------------------------------------

FAKE_DAEMON = """\
import os, signal, sys
from setproctitle import setproctitle
from cairnqd.daemon.parent.statefile import StateFile, after_reload, initial_state, state_path

config, runtime_dir, mode, log = sys.argv[1:5]
# What `cairnqd reload` checks before it signals a pid: the master's title.
setproctitle(f"cairnqd: master [{os.path.abspath(config)}] gen=1 (stand-in)")
statefile = StateFile(state_path(config, runtime_dir))
statefile.acquire()
state = initial_state(config)
statefile.write(state)
pending = []
signal.signal(signal.SIGHUP, lambda signum, frame: pending.append(signum))
signal.signal(signal.SIGUSR2, lambda signum, frame: pending.append(signum))
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
print("ready", flush=True)
try:
    while True:
        signal.pause()
        while pending:
            signum = pending.pop(0)
            with open(log, "a") as f:
                f.write(signal.Signals(signum).name + "\\n")
            if mode == "silent":
                continue
            ok = mode == "ok"
            errors = [] if ok else ["cairnq.yaml:3:5: groups.x: boom", "cairnq.yaml:4:1: again"]
            generation = state["generation"] + (1 if ok else 0)
            state = after_reload(state, ok=ok, errors=errors, generation=generation)
            statefile.write(state)
finally:
    statefile.release()
"""


class FakeDaemon:
    def __init__(self, process: subprocess.Popen[str], log: Path) -> None:
        self.process = process
        self.log = log

    @property
    def pid(self) -> int:
        return self.process.pid

    def signals(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


@pytest.fixture
def fake_daemon(tmp_path: Path, sqlite_config: Path) -> Iterator[Callable[[str], FakeDaemon]]:
    started: list[subprocess.Popen[str]] = []

    def start(mode: str) -> FakeDaemon:
        log = tmp_path / f"signals-{len(started)}.log"
        args = [str(sqlite_config), str(tmp_path / "run"), mode, str(log)]
        process = subprocess.Popen(
            [sys.executable, "-c", FAKE_DAEMON, *args], stdout=subprocess.PIPE, text=True
        )
        started.append(process)
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        return FakeDaemon(process, log)

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()


def test_reload_without_a_daemon_exits_69(sqlite_config: Path, tmp_path: Path, run: Run) -> None:
    result = run("reload", "--wait", "5s")
    assert result.returncode == 69
    assert result.stderr.startswith("cairnqd: no cairnqd running for ./cairnq.yaml: no state file")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    result = run("reload", "--pid", dead.stdout.strip())
    assert result.returncode == 69 and "no process" in result.stderr


def test_reload_wait_applied(fake_daemon: Callable[[str], FakeDaemon], run: Run) -> None:
    daemon = fake_daemon("ok")
    result = run("reload", "--wait", "10s")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"reload applied: generation 2 (pid {daemon.pid})\n"
    result = run("reload", "--all", "--wait", "10s", "--pid", str(daemon.pid))
    assert result.returncode == 0, result.stderr
    assert "generation 3" in result.stdout
    assert daemon.signals() == ["SIGHUP", "SIGUSR2"]
    result = run("reload")  # no wait: just the signal
    assert result.stdout == f"sent SIGHUP to cairnqd (pid {daemon.pid})\n"


def test_reload_wait_refused_prints_the_errors(
    fake_daemon: Callable[[str], FakeDaemon], run: Run
) -> None:
    daemon = fake_daemon("refuse")
    result = run("reload", "--wait", "10s")
    assert result.returncode == 78
    assert result.stderr.splitlines() == [
        "cairnq.yaml:3:5: groups.x: boom",
        "cairnq.yaml:4:1: again",
        f"cairnqd: reload refused; still running generation 1 (pid {daemon.pid})",
    ]


def test_reload_wait_times_out(fake_daemon: Callable[[str], FakeDaemon], run: Run) -> None:
    daemon = fake_daemon("silent")
    result = run("reload", "--wait", "500ms")
    assert result.returncode == 75
    assert f"no reload outcome from pid {daemon.pid} within 0.5s" in result.stderr
    assert daemon.signals() == ["SIGHUP"]


def test_reload_reaches_the_daemon_even_with_a_broken_config(
    fake_daemon: Callable[[str], FakeDaemon], sqlite_config: Path, tmp_path: Path, run: Run
) -> None:
    """The daemon, not the CLI, judges the new config: the CLI only needs to find it."""
    daemon = fake_daemon("refuse")
    text = sqlite_config.read_text()
    sqlite_config.write_text(text.replace("queues: [default, mail]", "queues: 3\n    nope: 1"))
    result = run("reload", "--wait", "10s")
    assert result.returncode == 78, result.stderr
    assert daemon.signals() == ["SIGHUP"]
    # Past a syntax error nothing can be read, runtime_dir included: the daemon is
    # found by its process and the lock it holds, and still gets the reload.
    sqlite_config.write_text(text + "bogus: [1\n")
    result = run("reload", "--wait", "10s")
    assert result.returncode == 78, result.stderr
    assert "no cairnqd running" not in result.stderr
    assert f"does not parse; the daemon for it (pid {daemon.pid}) keeps its state" in (
        result.stderr
    )
    assert "cairnq.yaml:3:5: groups.x: boom" in result.stderr
    assert daemon.signals() == ["SIGHUP", "SIGHUP"]
    # A file that names another runtime_dir than the daemon started with: the same.
    moved = text.replace(str(tmp_path / "run"), str(tmp_path / "elsewhere"))
    assert moved != text
    sqlite_config.write_text(moved)
    result = run("reload", "--wait", "10s")
    assert result.returncode == 78, result.stderr
    assert f"names runtime_dir {tmp_path / 'elsewhere'}; the daemon for it" in result.stderr
    assert daemon.signals() == ["SIGHUP", "SIGHUP", "SIGHUP"]


def test_reload_without_wait_refuses_a_broken_config_unsent(
    fake_daemon: Callable[[str], FakeDaemon], sqlite_config: Path, run: Run
) -> None:
    """Without --wait nobody would see the daemon's refusal: the CLI refuses first."""
    daemon = fake_daemon("ok")
    text = sqlite_config.read_text()
    for broken in (text + "bogus: [1\n", text.replace("queues: [default, mail]", "queues: 3")):
        sqlite_config.write_text(broken)
        result = run("reload")
        assert result.returncode == 78, result.stderr
        lines = result.stderr.splitlines()
        assert any(line.startswith("./cairnq.yaml:") for line in lines), lines  # file:line
        assert "not sent to the daemon, which keeps its running config" in lines[-1]
        assert "sent SIGHUP" not in result.stdout
    assert daemon.signals() == []
    sqlite_config.write_text(text)
    result = run("reload")
    assert result.returncode == 0, result.stderr
    assert daemon.signals() == ["SIGHUP"]


def test_reload_with_a_broken_config_and_no_daemon_says_both(sqlite_config: Path, run: Run) -> None:
    sqlite_config.write_text(sqlite_config.read_text() + "bogus: [1\n")
    result = run("reload", "--wait", "5s")
    assert result.returncode == 69
    assert "cairnq.yaml does not parse, so its runtime_dir was not read" in result.stderr
    assert f"no process is titled 'cairnqd: master [{sqlite_config}]'" in result.stderr


def test_reload_refuses_a_stale_state_file(
    fake_daemon: Callable[[str], FakeDaemon], sqlite_config: Path, tmp_path: Path, run: Run
) -> None:
    daemon = fake_daemon("ok")
    statefile = StateFile(state_path(sqlite_config, str(tmp_path / "run")))
    with pytest.raises(AlreadyRunning) as info:  # what a second daemon would hit
        statefile.acquire()
    assert info.value.pid == daemon.pid
    # SIGKILL: the state file stays behind, but the kernel drops the lock.
    daemon.process.kill()
    daemon.process.wait()
    assert Path(statefile.path).exists()
    result = run("reload", "--wait", "5s")
    assert result.returncode == 69
    assert "is stale" in result.stderr


# -- the daemon itself -----------------------------------------------------------------


def test_run_starts_reloads_and_stops(sqlite_config: Path, tmp_path: Path, run: Run) -> None:
    statefile = StateFile(state_path(sqlite_config, str(tmp_path / "run")))
    with subprocess.Popen(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(sqlite_config)],
        cwd=tmp_path,
        env=cli_env(),
        stderr=subprocess.PIPE,
        text=True,
    ) as daemon:
        try:

            def state_written() -> bool:
                assert daemon.poll() is None, daemon.stderr.read() if daemon.stderr else ""
                return statefile.read() is not None

            wait_for("the daemon's state file", state_written, 30)
            state = statefile.read()
            assert state is not None and state["pid"] == daemon.pid
            result = run("reload", "--wait", "30s")
            assert result.returncode == 0, result.stderr
            # With a worker, --wait prints the result, or exits 1 when the task failed.
            result = run("submit", "demo.echo", "--payload", '{"x": [1]}', "--wait")
            assert result.returncode == 0, result.stderr
            task_id, result_json = result.stdout.split("\n", 1)
            assert task_id.startswith("task_") and json.loads(result_json) == {"x": [1]}
            result = run("submit", "demo.fail", "--wait", "--timeout", "30s")
            assert result.returncode == 1, result.stderr
            assert "failed: {" in result.stderr and '"code": "demo_failure"' in result.stderr
            assert run("-c", str(sqlite_config), "run").returncode == 75  # the lock is held
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=60) == 0
    assert statefile.read() is None


def test_submit_warns_of_a_task_no_group_would_run_and_strict_refuses_it(
    sqlite_db: Path, run: Run
) -> None:
    misspelled = run("submit", "demo.ech")
    assert misspelled.returncode == 0, misspelled.stderr
    assert (
        "warning: no handler for task 'demo.ech' in the groups claiming queue 'default' "
        "(default) (did you mean 'demo.echo'?)" in misspelled.stderr
    )
    nowhere = run("submit", "demo.echo", "--queue", "mial")
    assert nowhere.returncode == 0
    assert "no group in" in nowhere.stderr and "claims queue 'mial'" in nowhere.stderr
    assert "(they claim default, mail)" in nowhere.stderr
    refused = run("submit", "demo.ech", "--strict")
    assert refused.returncode == 65
    assert "nothing was submitted" in refused.stderr and not refused.stdout
    served = run("submit", "demo.echo", "--queue", "mail", "--strict")
    assert served.returncode == 0 and served.stderr == ""
    listed = json.loads(run("list", "--json").stdout)
    assert sorted(t["name"] for t in listed) == ["demo.ech", "demo.echo", "demo.echo"]


def test_pausing_a_queue_nothing_knows_warns_but_pauses(sqlite_db: Path, run: Run) -> None:
    typo = run("pause", "--queue", "mial")
    assert typo.returncode == 0 and "paused mial" in typo.stdout
    assert "queue 'mial' is claimed by no group" in typo.stderr
    known = run("pause", "--queue", "mail")
    assert known.returncode == 0 and known.stderr == ""
    assert run("resume", "--queue", "mial", "--queue", "mail").returncode == 0
