"""Sustained load through the daemon: do throughput, pickup latency and table sizes hold?

    python -m bench.soak --backend postgres --minutes 30 [--autovacuum off]
    python -m bench.soak --backend sqlite --minutes 30
    python -m bench.soak plot OUT.png soak-A.json soak-B.json   # several runs, one figure

A short burst says little about a queue that runs for months: dead rows pile up, indexes
bloat, the purge falls behind or the planner changes its mind. This bench keeps a steady
load on a running daemon and records, every `--sample` seconds:

- throughput: tasks succeeded in the interval (the daemon's own counters, scraped over
  HTTP from its metrics endpoint) beside the submit rate asked for;
- pickup p99: the 99th percentile of queue wait (run_at to claim) in the interval, from
  the deltas of the daemon's queue-wait histogram (fine buckets set in the config), so
  the figure is the bucket bound that holds 99% of the interval's pickups;
- size: table and index bytes (Postgres), database file + WAL bytes (SQLite), and the
  rows left, which the purge must keep bounded.

Postgres runs on a private cluster made with `initdb` on a free port, not on the shared
server: production runs with autovacuum on, and this machine's shared server has it off.
`--autovacuum off` runs the same load without it, to show it does not collapse.

The load: one submitter process (the "API") submits `--rate` tasks a second as
`submit_many` chunks every 50 ms, paced against the clock; the daemon drains with 2
children x concurrency 8 and purges succeeded tasks older than `--keep` every 10 s.
Writes `soak-<backend>-<when>.json`, a Markdown table and a PNG plot (matplotlib) to
`--out`. Needs `pip install matplotlib` for the plot (the JSON and table come without).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
import yaml

from bench.common import NOOP, OUT_DIR, REPO, interrupt_on_sigterm, print_table

ENV = {**os.environ, "PYTHONPATH": str(REPO)}
HANDLERS = "bench.daemon_handlers:registry"
#: Queue-wait buckets (seconds): fine at the low end, where a healthy queue lives.
WAIT_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60]
#: Submit chunks go out this often.
CHUNK_EVERY_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(0.1)


class PrivateCluster:
    """A throwaway Postgres cluster of the bench's own (initdb + pg_ctl) on a free port."""

    def __init__(self, autovacuum: bool) -> None:
        bindir = subprocess.run(
            ["pg_config", "--bindir"], check=True, capture_output=True, text=True
        ).stdout.strip()
        self._bin = Path(bindir)
        self.home = Path(tempfile.mkdtemp(prefix="cairnqd-soak-pg-"))
        self.port = free_port()
        # initdb refuses to run as root: run the server as the postgres user then.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.home, "postgres", "postgres")
        data = self.home / "data"
        self._run(str(self._bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
        settings = {
            "port": self.port,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.home}'",
            "autovacuum": "on" if autovacuum else "off",
            "max_connections": 100,
        }
        with open(data / "postgresql.auto.conf", "a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self._pg_ctl("start", "-w", "-l", str(self.home / "server.log"))
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        subprocess.run([*self._as, *argv], check=True, stdout=subprocess.DEVNULL)

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(self._bin / "pg_ctl"), "-D", str(self.home / "data"), *args)

    def stop(self) -> None:
        try:
            self._pg_ctl("stop", "-m", "fast", "-w")
        finally:
            shutil.rmtree(self.home, ignore_errors=True)


@dataclass
class Sample:
    minute: float  # end of the interval, minutes since the load started
    submitted_per_s: float
    succeeded_per_s: float
    pickup_p99_ms: float | None
    rows: int
    table_mib: float
    index_mib: float


def scrape(port: int) -> dict[str, Any]:
    """Succeeded count and the queue-wait histogram, summed over every label."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    succeeded = 0.0
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == "cairnq_tasks_succeeded_total":
                succeeded += s.value
            elif s.name == "cairnq_task_queue_wait_seconds_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return {"succeeded": succeeded, "buckets": buckets}


def p99_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The smallest bucket bound holding 99% of the pickups between two scrapes."""
    bounds = sorted(after)
    deltas = [after[b] - before.get(b, 0.0) for b in bounds]  # cumulative counts
    if not deltas or deltas[-1] <= 0:
        return None
    for bound, count in zip(bounds, deltas, strict=True):
        if count >= 0.99 * deltas[-1]:
            return bound * 1000
    return None


class Sizes:
    def __init__(self, backend: str, target: dict[str, Any]) -> None:
        self.backend, self.target = backend, target

    def read(self) -> tuple[int, float, float]:
        """Rows left, table MiB, index MiB (SQLite: file + WAL, and 0)."""
        mib = 1024 * 1024
        if self.backend == "sqlite":
            import sqlite3

            path = Path(self.target["path"])
            with sqlite3.connect(path, timeout=10) as conn:
                rows = conn.execute("select count(*) from cairnq_tasks").fetchone()[0]
            wal = Path(f"{path}-wal")
            size = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
            return int(rows), size / mib, 0.0
        with psycopg.connect(self.target["dsn"]) as conn:
            row = conn.execute(
                "select (select count(*) from cairnq_tasks),"
                " pg_table_size('cairnq_tasks'), pg_indexes_size('cairnq_tasks')"
            ).fetchone()
        assert row is not None
        return int(row[0]), row[1] / mib, row[2] / mib


def _client(target: dict[str, Any]) -> Any:
    import cairnqd

    if "path" in target:
        return cairnqd.CairnQ.sqlite(target["path"])
    return cairnqd.CairnQ.postgres(target["dsn"])


async def _migrate(target: dict[str, Any]) -> None:
    client = _client(target)
    await client.get("none")  # the first call migrates
    await client.close()


async def submitter(target: dict[str, Any], rate: float, seconds: float) -> None:
    """The API process: `rate` tasks a second in chunks, paced against the clock."""
    client = _client(target)
    start = time.monotonic()
    sent = 0
    try:
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(rate * elapsed) - sent
            if due > 0:
                await client.submit_many(
                    [{"name": NOOP, "payload": {"i": sent + i}} for i in range(due)]
                )
                sent += due
            await asyncio.sleep(CHUNK_EVERY_S)
    finally:
        await client.close()
    print(json.dumps({"submitted": sent}), flush=True)


def daemon_config(target: dict[str, Any], tmp: Path, port: int, keep: str) -> Path:
    config = {
        "version": 1,
        "database": target,
        "handlers": [HANDLERS],
        "runtime_dir": str(tmp / "run"),
        "metrics": {"listen": f"127.0.0.1:{port}", "wait_buckets": WAIT_BUCKETS},
        "retention": {
            "interval": "10s",
            "rules": [{"status": "succeeded", "older_than": keep}],
        },
        "groups": {
            "soak": {"queues": ["default"], "processes": 2, "concurrency": 8},
        },
    }
    (tmp / "run").mkdir(exist_ok=True)
    path = tmp / "cairnq.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def migrate(target: dict[str, Any]) -> None:
    """Create the schema before anyone connects (the submitter and the daemon race)."""
    argv = [sys.executable, "-m", "bench.soak", "migrate", json.dumps(target)]
    subprocess.run(argv, check=True, env=ENV)


def soak(
    backend: str, minutes: float, rate: float, sample_s: float, keep: str, autovacuum: bool
) -> tuple[list[Sample], dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="cairnqd-soak-"))
    cluster = PrivateCluster(autovacuum) if backend == "postgres" else None
    target: dict[str, Any] = (
        {"path": str(tmp / "soak.db")} if cluster is None else {"dsn": cluster.dsn}
    )
    port = free_port()
    daemon: subprocess.Popen[bytes] | None = None
    api: subprocess.Popen[str] | None = None
    try:
        migrate(target)
        config = daemon_config(target, tmp, port, keep)
        log = open(tmp / "daemon.log", "ab")  # noqa: SIM115 - closed with the daemon
        daemon = subprocess.Popen(
            [sys.executable, "-m", "cairnqd.cli", "-c", str(config)],
            stdout=log, stderr=subprocess.STDOUT, env=ENV,
        )  # fmt: skip
        wait_until("metrics endpoint", lambda: _answers(port), 60)
        seconds = minutes * 60
        argv = ["submit", json.dumps(target), str(rate), str(seconds)]
        api = subprocess.Popen(
            [sys.executable, "-m", "bench.soak", *argv], stdout=subprocess.PIPE, text=True, env=ENV
        )
        sizes = Sizes(backend, target)
        samples: list[Sample] = []
        start = time.monotonic()
        last = scrape(port)
        for k in range(1, int(seconds // sample_s) + 1):
            time.sleep(max(0.0, start + k * sample_s - time.monotonic()))
            now = scrape(port)
            rows, table, index = sizes.read()
            samples.append(
                Sample(
                    minute=round(k * sample_s / 60, 2),
                    submitted_per_s=rate,
                    succeeded_per_s=round((now["succeeded"] - last["succeeded"]) / sample_s, 1),
                    pickup_p99_ms=p99_ms(last["buckets"], now["buckets"]),
                    rows=rows, table_mib=round(table, 2), index_mib=round(index, 2),
                )
            )  # fmt: skip
            print(json.dumps(asdict(samples[-1])), flush=True)
            last = now
        out, _ = api.communicate(timeout=120)
        errors = _log_errors(tmp / "daemon.log")
        return samples, {
            "submitted": json.loads(out.splitlines()[-1])["submitted"],
            "errors": errors,
        }
    finally:
        if api is not None and api.poll() is None:
            api.kill()
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(120)
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
        return True
    except OSError:
        return False


def _log_errors(log: Path) -> int:
    return sum(1 for line in log.read_text(errors="replace").splitlines() if " ERROR " in line)


def summarize(samples: list[Sample]) -> dict[str, Any]:
    """First and last five samples' throughput, and whether pickup p99 drifted."""
    head, tail = samples[: max(1, len(samples) // 6)], samples[-max(1, len(samples) // 6) :]

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    first = mean([s.succeeded_per_s for s in head])
    last = mean([s.succeeded_per_s for s in tail])
    p99s = [s.pickup_p99_ms for s in samples if s.pickup_p99_ms is not None]
    return {
        "first_per_s": round(first, 1),
        "last_per_s": round(last, 1),
        "last_over_first": round(last / first, 3) if first else None,
        "pickup_p99_ms_first": mean([s.pickup_p99_ms or 0.0 for s in head]),
        "pickup_p99_ms_last": mean([s.pickup_p99_ms or 0.0 for s in tail]),
        "pickup_p99_ms_max": max(p99s) if p99s else None,
        "rows_max": max(s.rows for s in samples),
        "size_mib_max": max(s.table_mib + s.index_mib for s in samples),
    }


def plot(runs: dict[str, list[Sample]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for label, samples in runs.items():
        x = [s.minute for s in samples]
        axes[0].plot(x, [s.succeeded_per_s for s in samples], label=label)
        axes[1].plot(x, [s.pickup_p99_ms or float("nan") for s in samples], label=label)
        axes[2].plot(x, [s.table_mib + s.index_mib for s in samples], label=label)
    axes[0].set_ylabel("succeeded tasks/s")
    axes[1].set_ylabel("pickup p99 (ms, bucket bound)")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("table + index (MiB)")
    axes[2].set_xlabel("minutes")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle("cairnqd soak: steady submit + drain through the daemon")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "migrate":
        asyncio.run(_migrate(json.loads(sys.argv[2])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "plot":
        # Runs made apart (or at once, one process each) drawn in one figure:
        #   python -m bench.soak plot OUT.png soak-A.json soak-B.json ...
        merged: dict[str, list[Sample]] = {}
        for name in sys.argv[3:]:
            saved = json.loads(Path(name).read_text())
            for label, run in saved["runs"].items():
                merged[label] = [Sample(**sample) for sample in run["samples"]]
        sys.exit(0 if plot(merged, Path(sys.argv[2])) else 1)
    if len(sys.argv) > 1 and sys.argv[1] == "submit":
        target, rate, seconds = json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
        asyncio.run(submitter(target, rate, seconds))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=("sqlite", "postgres"))
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=800, help="tasks submitted a second")
    parser.add_argument("--sample", type=float, default=60, help="seconds per sample")
    parser.add_argument("--keep", default="1m", help="purge succeeded tasks older than this")
    parser.add_argument(
        "--autovacuum", action="append", choices=("on", "off"), help="Postgres (repeatable)"
    )
    parser.add_argument("--out", default=str(OUT_DIR))
    args = parser.parse_args()
    interrupt_on_sigterm()  # a soak killed by SIGTERM still stops its daemon and cluster
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Sample]] = {}
    report: dict[str, Any] = {"rate": args.rate, "minutes": args.minutes, "runs": {}}
    for backend in args.backend or ["sqlite", "postgres"]:
        modes = (args.autovacuum or ["on"]) if backend == "postgres" else ["-"]
        for mode in modes:
            label = backend if backend == "sqlite" else f"postgres, autovacuum {mode}"
            print(f"== {label}", flush=True)
            samples, extra = soak(
                backend, args.minutes, args.rate, args.sample, args.keep, mode != "off"
            )
            runs[label] = samples
            report["runs"][label] = {
                "summary": summarize(samples),
                **extra,
                "samples": [asdict(s) for s in samples],
            }
    # The pid too: runs started in the same second (at once, one process each) must
    # not overwrite each other's files.
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    (out / f"soak-{stamp}.json").write_text(json.dumps(report, indent=1))
    for label, samples in runs.items():
        print_table(
            f"{label}: every {args.sample:.0f}s at {args.rate:.0f} submits/s",
            ["minute", "succeeded/s", "pickup p99 ms", "rows", "table MiB", "index MiB"],
            [
                [f"{s.minute:g}", f"{s.succeeded_per_s:,.0f}",
                 "-" if s.pickup_p99_ms is None else f"{s.pickup_p99_ms:g}",
                 f"{s.rows:,}", f"{s.table_mib:.1f}", f"{s.index_mib:.1f}"]
                for s in samples
            ],
        )  # fmt: skip
        print(json.dumps({label: report["runs"][label]["summary"]}))
    if plot(runs, out / f"soak-{stamp}.png"):
        print(f"plot: {out / f'soak-{stamp}.png'}")


if __name__ == "__main__":
    main()
