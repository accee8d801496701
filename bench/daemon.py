"""The daemon's own costs, measured against the bare worker in the same run.

1. Drain: 60,000 pre-loaded no-op tasks drained by `cairnqd` with P children versus P
   bare `Worker.serve()` processes with the same handler, concurrency and database
   (SQLite file or Postgres). Ratio daemon / bare: the supervisor should cost nothing.
   Single runs scatter by 10-20% on a 2-core machine, so the sides alternate over 6
   rounds (ABBA order), each run starts after a checkpoint and a sync, and the ratio
   is given both of the medians and as the median of the rounds' own ratios. CPU per
   task (children + parent against the bare workers, from /proc) is given beside it.
   Side by side as well: P children and P bare workers drain one queue at the same
   time, and the ratio is the tasks the children did over the bare workers' (drift
   cancels out of it; rounds scatter by a few percent instead of 10-20%).
2. Recovery: a child is SIGKILLed while running a task (lease 60 s); the time until the
   task is running again on another child (the parent's hand-back, not lease expiry).
3. Memory: resident size of the parent and of one child, idle and after the drain.

    python -m bench.daemon --backend sqlite
    python -m bench.daemon --backend postgres --dsn postgresql://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import yaml

REPO = Path(__file__).resolve().parents[1]
HANDLERS = "bench.daemon_handlers:registry"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 300, every: float = 0.005
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)


class Database:
    """A fresh database per data point, and the few reads the bench needs."""

    def __init__(self, backend: str, dsn: str, tmp: Path, connections: int = 1) -> None:
        self.backend = backend
        self.admin_dsn = dsn
        if backend == "sqlite":
            self.path = str(tmp / f"bench-{uuid.uuid4().hex[:8]}.db")
            self.target: dict[str, Any] = {"path": self.path}
        else:
            self.name = f"bench_daemon_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'create database "{self.name}"')
            self.dsn = psycopg.conninfo.make_conninfo(dsn, dbname=self.name)
            # One pool connection per process on both sides: the daemon's default
            # (`connections_per_child`), which the bare worker is given too, so the
            # ratio measures the daemon, not a pool size (`--connections`).
            self.target = {
                "dsn": self.dsn,
                "auto_migrate": True,
                "connections_per_child": connections,
            }

    def scalar(self, sql: str) -> Any:
        if self.backend == "sqlite":
            with sqlite3.connect(self.path, timeout=5) as conn:
                row = conn.execute(sql).fetchone()
                return row[0] if row else None
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(sql).fetchone()
            return row[0] if row else None

    def server_cpu(self) -> dict[int, float]:
        """CPU seconds so far of every Postgres backend connected to this database but
        the asking one (the server runs on this host); {} for SQLite."""
        if self.backend == "sqlite":
            return {}
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                "select pid from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid()"
            ).fetchall()
        usage: dict[int, float] = {}
        for (pid,) in rows:
            with contextlib.suppress(OSError):
                usage[int(pid)] = cpu_seconds(int(pid))
        return usage

    def settle(self) -> None:
        """Before a measured drain: write out what earlier runs left dirty (a
        Postgres checkpoint, the page cache), so no run pays for its predecessor's
        writeback. Unsettled, runs in a row differed by up to 25%."""
        if self.backend == "postgres":
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                conn.execute("checkpoint")
        os.sync()

    def drop(self) -> None:
        if self.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path + suffix)
        if self.backend == "postgres":
            with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
                conn.execute(f'drop database if exists "{self.name}" with (force)')


def helper(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench.daemon_handlers", *args]


def preload(db: Database, n: int) -> None:
    subprocess.run(helper("preload", json.dumps(db.target), str(n)), check=True, env=ENV)
    if n and db.backend == "postgres":
        # The shared server runs with autovacuum off, so nothing would ever analyze the
        # table: the claims would be planned for the empty table the workers first saw
        # (as bench.drain does, and as autovacuum would in production).
        with psycopg.connect(db.dsn, autocommit=True) as conn:
            conn.execute("analyze cairnq_tasks")


def pending(db: Database) -> int:
    return int(db.scalar("select count(*) from cairnq_tasks where status <> 'succeeded'"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def last_completion(db: Database) -> float:
    """The wall-clock second of the last task's completion (the database's clock: this
    machine's for SQLite, the local server's for Postgres)."""
    return int(db.scalar("select max(completed_at_ms) from cairnq_tasks")) / 1000


def cycles_per_1k(db: Database) -> float:
    """Claim transactions per 1,000 tasks: every row one transaction completes gets the
    same `completed_at_ms` (as bench.drain's histogram uses), so the groups by worker
    and completion time are the cycles. Fewer tasks per cycle cost more CPU per task
    on both sides, so a ratio read without this can be the sizer's, not the daemon's."""
    groups = db.scalar(
        "select count(*) from (select 1 from cairnq_tasks "
        "group by worker_id, completed_at_ms) as cycles"
    )
    total = db.scalar("select count(*) from cairnq_tasks")
    return 1000 * int(groups) / max(1, int(total))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def daemon_config(
    database: dict[str, Any], run_dir: Path, groups: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """A config serving bench/daemon_handlers.py on `database` (the config's section),
    metrics on an ephemeral port, with `groups`."""
    return {
        "version": 1,
        "database": database,
        "handlers": [HANDLERS],
        "runtime_dir": str(run_dir),
        "metrics": {"listen": "127.0.0.1:0"},
        "groups": groups,
    }


class Daemon:
    def __init__(self, db: Database, tmp: Path, processes: int, lease: str = "30s") -> None:
        # A runtime directory per daemon: nothing one run leaves (state file, control
        # socket) is seen by the next.
        run = tmp / f"run-{uuid.uuid4().hex[:8]}"
        group = {
            "queues": ["default"],
            "processes": processes,
            "concurrency": 8,
            "lease": lease,
            "poll_interval": "500ms",
        }
        config = daemon_config(db.target, run, {"bench": group})
        config["retention"] = {"rules": []}
        run.mkdir()
        self.config = tmp / f"cairnq-{uuid.uuid4().hex[:6]}.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = open(tmp / "daemon.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(self.config)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=ENV,
        )
        self.processes = processes
        wait_for("children", lambda: len(self.children()) == processes, timeout=60, every=0.05)

    def children(self) -> list[int]:
        return children_of(self.proc.pid)

    def ready(self) -> int:
        return sum(1 for pid in self.children() if process_title(pid).endswith(" ready"))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()


def bare_workers(db: Database, processes: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(helper("worker", json.dumps(db.target)), env=ENV) for _ in range(processes)
    ]


def stop_all(daemon: Daemon | None, workers: list[subprocess.Popen[bytes]]) -> None:
    """Stop a run's daemon and bare workers (TERM: they drain), and wait for them."""
    if daemon is not None:
        daemon.stop()
    for w in workers:
        w.send_signal(signal.SIGTERM)
    for w in workers:
        w.wait(60)


def drain_once(
    kind: str, backend: str, dsn: str, tmp: Path, processes: int, n: int, connections: int = 1
) -> dict[str, float]:
    """Workers start idle on an empty queue; all n tasks then appear in one commit, and
    the clock runs from that commit to the last completion, so neither side pays for
    its start-up inside the measurement."""
    db = Database(backend, dsn, tmp, connections)
    try:
        preload(db, 0)  # migrate before anyone connects
        daemon: Daemon | None = None
        workers: list[subprocess.Popen[bytes]] = []
        if kind == "daemon":
            daemon = Daemon(db, tmp, processes)
            wait_for("children ready", lambda: daemon.ready() == processes, timeout=60)
            pids = [daemon.proc.pid, *daemon.children()]
        else:
            workers = bare_workers(db, processes)
            pids = [w.pid for w in workers]
            time.sleep(3)  # a bare serve() has no readiness signal; imports take ~1 s
        workers_cpu = [p for p in pids if daemon is None or p != daemon.proc.pid]
        db.settle()
        cpu_before = {pid: cpu_seconds(pid) for pid in pids}
        server_before = db.server_cpu()
        preload(db, n)
        started = time.time()  # the preload has committed: the tasks are visible now
        # Polled slowly: each poll counts the whole table, and at 50 a second those
        # counts took half a core from the drain they measure (more noise than signal
        # on a 2-core machine). The end is the last completion the table records.
        wait_for("drain", lambda: pending(db) == 0, every=0.25)
        elapsed = last_completion(db) - started
        spent = {pid: cpu_seconds(pid) - before for pid, before in cpu_before.items()}
        # Backends that were there before the drain, plus any it opened (whole). The
        # preload's and the polls' own backends have exited and are not counted.
        server = sum(v - server_before.get(pid, 0.0) for pid, v in db.server_cpu().items())
        cpu = {
            # The processes that run tasks (children, or the bare workers), and the
            # daemon's parent: microseconds of CPU per task drained.
            "worker_cpu_us": sum(spent[pid] for pid in workers_cpu) / n * 1e6,
            "parent_cpu_us": 0.0 if daemon is None else spent[daemon.proc.pid] / n * 1e6,
            "server_cpu_us": server / n * 1e6,
        }
        cpu["cycles_per_1k"] = cycles_per_1k(db)
        rss = {f"rss_kib_{i}": float(rss_kib(pid)) for i, pid in enumerate(pids)}
        stop_all(daemon, workers)
        return {"tasks_per_s": n / elapsed, **cpu, **rss}
    finally:
        db.drop()


def drain_together(
    backend: str, dsn: str, tmp: Path, processes: int, n: int, connections: int = 1
) -> dict[str, float]:
    """P daemon children and P bare workers drain the same n tasks at the same time;
    the share each side completed. Run side by side, both see the same machine, server
    and moment, so the drift that makes back-to-back drains scatter by 10-20% cancels
    out: a child that does more work per task simply takes fewer of them. The parent's
    own CPU slows both sides alike here, so it is reported beside (the sequential
    drains include it)."""
    db = Database(backend, dsn, tmp, connections)
    daemon: Daemon | None = None
    workers: list[subprocess.Popen[bytes]] = []
    try:
        preload(db, 0)
        daemon = Daemon(db, tmp, processes)
        wait_for("children ready", lambda: daemon.ready() == processes, timeout=60)
        workers = bare_workers(db, processes)
        time.sleep(3)  # a bare serve() has no readiness signal; imports take ~1 s
        children = daemon.children()
        pids = [daemon.proc.pid, *children, *(w.pid for w in workers)]
        db.settle()
        before = {pid: cpu_seconds(pid) for pid in pids}
        preload(db, n)
        wait_for("drain", lambda: pending(db) == 0, every=0.25)
        spent = {pid: cpu_seconds(pid) - b for pid, b in before.items()}
        by_daemon = int(
            db.scalar("select count(*) from cairnq_tasks where worker_id like '%:bench.%'")
        )
        by_bare = n - by_daemon
        return {
            "share_ratio": by_daemon / max(1, by_bare),
            "daemon_tasks": float(by_daemon),
            "child_cpu_us": sum(spent[p] for p in children) / max(1, by_daemon) * 1e6,
            "bare_cpu_us": sum(spent[w.pid] for w in workers) / max(1, by_bare) * 1e6,
            "parent_cpu_us": spent[daemon.proc.pid] / n * 1e6,
        }
    finally:
        stop_all(daemon, workers)
        db.drop()


def recovery_once(backend: str, dsn: str, tmp: Path) -> dict[str, float]:
    """SIGKILL the child running a task; seconds until the task runs again."""
    db = Database(backend, dsn, tmp)
    daemon = None
    try:
        daemon = Daemon(db, tmp, 2, lease="60s")
        wait_for("children ready", lambda: daemon.ready() == 2, timeout=60)
        idle = {"parent_kib": rss_kib(daemon.proc.pid), "child_kib": rss_kib(daemon.children()[0])}
        marker = tmp / f"release-{uuid.uuid4().hex[:6]}"
        preload_block(db, str(marker))
        running = "select worker_id from cairnq_tasks where status = 'running' and attempt = {}"
        worker_id = wait_for("first attempt", lambda: db.scalar(running.format(1)), timeout=60)
        slot = int(worker_id.split(":")[1].split(".")[1])
        victim = next(p for p in daemon.children() if _slot_of(p) == slot)
        killed = time.perf_counter()
        os.kill(victim, signal.SIGKILL)
        wait_for("second attempt", lambda: db.scalar(running.format(2)), timeout=60, every=0.002)
        seconds = time.perf_counter() - killed
        marker.touch()
        return {"kill_to_running_s": seconds, **{f"idle_{k}": v for k, v in idle.items()}}
    finally:
        if daemon is not None:
            daemon.stop()
        db.drop()


def process_title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _slot_of(pid: int) -> int | None:
    """The slot in a child's process title (`cairnqd: worker [group] 2/4 ...`)."""
    match = re.search(r"\] (\d+)/\d+", process_title(pid))
    return int(match.group(1)) - 1 if match else None


def preload_block(db: Database, marker: str) -> None:
    subprocess.run(helper("block", json.dumps(db.target), marker), check=True, env=ENV)


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def report_recovery(args: argparse.Namespace, tmp: Path, results: dict[str, Any]) -> None:
    runs = [recovery_once(args.backend, args.dsn, tmp) for _ in range(max(3, args.repeats))]
    results["recovery"] = {"median": median_of(runs), "runs": runs}
    med = results["recovery"]["median"]
    worst = max(r["kill_to_running_s"] for r in runs)
    print(
        f"{args.backend} SIGKILL -> running again: median "
        f"{med['kill_to_running_s'] * 1000:.0f} ms, max {worst * 1000:.0f} ms; idle RSS "
        f"parent {med['idle_parent_kib'] / 1024:.1f} MiB, "
        f"child {med['idle_child_kib'] / 1024:.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=60_000)
    parser.add_argument(
        "--connections", type=int, default=1,
        help="Postgres: connections per process on both sides (connections_per_child)",
    )  # fmt: skip
    parser.add_argument(
        "--procs", type=int, nargs="+", default=[1, 2], help="process counts to measure"
    )
    parser.add_argument("--no-recovery", action="store_true", help="measure the drains only")
    parser.add_argument("--out", default=str(REPO / "bench/out"))
    args = parser.parse_args()
    results: dict[str, Any] = {
        "backend": args.backend,
        "tasks": args.tasks,
        "repeats": args.repeats,
        "connections": args.connections,
    }
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for processes in args.procs:
            # Round-robin, the first side alternating, so drift of the machine or the
            # shared server over the minutes of a run hits both sides alike.
            by_kind: dict[str, list[dict[str, float]]] = {"bare": [], "daemon": []}
            for round_ in range(args.repeats):
                order = ("bare", "daemon") if round_ % 2 == 0 else ("daemon", "bare")
                for kind in order:
                    by_kind[kind].append(
                        drain_once(
                            kind,
                            args.backend,
                            args.dsn,
                            tmp,
                            processes,
                            args.tasks,
                            args.connections,
                        )
                    )
            for kind, runs in by_kind.items():
                med = median_of(runs)
                results[f"drain_{kind}_{processes}"] = {"median": med, "runs": runs}
                print(
                    f"{args.backend} drain {kind:6} x{processes}: "
                    f"{med['tasks_per_s']:8.0f} tasks/s, CPU per task: "
                    f"task processes {med['worker_cpu_us']:.1f} µs, "
                    f"parent {med['parent_cpu_us']:.2f} µs, "
                    f"claim cycles per 1k tasks {med['cycles_per_1k']:.1f}"
                    + (
                        f", Postgres backends {med['server_cpu_us']:.1f} µs"
                        if args.backend == "postgres"
                        else ""
                    )
                )
            ratio = (
                results[f"drain_daemon_{processes}"]["median"]["tasks_per_s"]
                / results[f"drain_bare_{processes}"]["median"]["tasks_per_s"]
            )
            # Each round's own ratio too: the two sides of a round ran back to back,
            # so drift between rounds cancels out of it.
            per_round = [
                d["tasks_per_s"] / b["tasks_per_s"]
                for d, b in zip(by_kind["daemon"], by_kind["bare"], strict=True)
            ]
            results[f"ratio_daemon_over_bare_{processes}"] = ratio
            results[f"ratio_per_round_{processes}"] = per_round
            results[f"ratio_median_of_rounds_{processes}"] = statistics.median(per_round)
            # A second measure beside throughput, and a direct one: CPU per task of the
            # daemon's processes (children + parent) over the bare workers', per round.
            # It says whether a slower round was work done or time spent waiting.
            cpu_rounds = [
                (d["worker_cpu_us"] + d["parent_cpu_us"]) / b["worker_cpu_us"]
                for d, b in zip(by_kind["daemon"], by_kind["bare"], strict=True)
            ]
            results[f"cpu_ratio_per_round_{processes}"] = cpu_rounds
            print(
                f"{args.backend} daemon / bare CPU per task with {processes} process(es): "
                f"median of rounds {statistics.median(cpu_rounds):.3f}; each round: "
                + " ".join(f"{r:.2f}" for r in cpu_rounds)
            )
            print(
                f"{args.backend} daemon / bare with {processes} process(es): {ratio:.2f} "
                f"(median of rounds {statistics.median(per_round):.2f}; each round: "
                + " ".join(f"{r:.2f}" for r in per_round)
                + ")"
            )
            rounds = [
                drain_together(args.backend, args.dsn, tmp, processes, args.tasks, args.connections)
                for _ in range(args.repeats)
            ]
            results[f"together_{processes}"] = {"median": median_of(rounds), "runs": rounds}
            med = median_of(rounds)
            print(
                f"{args.backend} side by side, {processes} child(ren) + {processes} bare: "
                f"tasks done by children / by bare workers: median "
                f"{med['share_ratio']:.3f}; each round: "
                + " ".join(f"{r['share_ratio']:.3f}" for r in rounds)
                + f"; CPU per task child {med['child_cpu_us']:.1f} µs, "
                f"bare {med['bare_cpu_us']:.1f} µs, parent {med['parent_cpu_us']:.2f} µs"
            )
        if not args.no_recovery:
            report_recovery(args, tmp, results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"daemon-{args.backend}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
