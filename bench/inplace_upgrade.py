"""A binary upgrade under load, probed: `cairnqd upgrade` into another release while
tasks stream, with every task's executions counted and every group's ready children
watched.

1. Two copies of this tree's package are installed in turn behind one symlink on
   PYTHONPATH: the running release, and a next one that reports another version and
   speaks the next pipe protocol (what `reload --all` cannot load).
2. Starts the daemon on a fresh database (group `a`: 2 processes, group `b`: 1, 8 slots
   each) and submits `--tasks` tasks at `--rate` per second over both groups' queues.
   Each handler appends the task id, the pipe protocol of the code running it and the
   monotonic time it started to a file (O_APPEND), so the counting loses nothing.
3. A third of the way in, points the symlink at the next release and runs
   `cairnqd upgrade --wait 2m`, while a thread reads /proc every 10 ms for the worker
   children titled `ready`, per group, under either parent.
4. Counts: each task run exactly once and `succeeded`, executions by release, the fewest
   ready children seen per group, how long the upgrade took, and the wait from submit
   to start (all tasks, and those submitted while the upgrade ran). Exits 1 on any task
   run twice or never, or a group below its size.

    python -m bench.inplace_upgrade --backend sqlite --backend postgres --tasks 3000 --rate 200
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import fresh_target, logging_handlers, main_entry, percentile, print_table

REPO = Path(__file__).resolve().parents[1]
GROUPS = {"a": 2, "b": 1}

HANDLERS = logging_handlers(
    "INPLACE_PROBE_LOG",
    "{ctx.task.id} {PROTOCOL_VERSION} {time.monotonic():.6f}",
    imports="import time\n\nfrom cairnqd.daemon.wire.messages import PROTOCOL_VERSION",
)


def make_release(root: Path, name: str, version: str, pipe_protocol: int) -> Path:
    """A copy of this tree's package (and the protocol's SQL beside it) that reports
    `version` and speaks `pipe_protocol`: what a `pip install -U` of another release
    would put on disk. tests/daemon/test_upgrade.py uses it too."""
    tree = root / name
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "cairnqd", tree / "cairnqd", ignore=skip)
    shutil.copytree(REPO / "protocol", tree / "protocol")
    messages = tree / "cairnqd" / "daemon" / "wire" / "messages.py"
    lines = [
        f"PROTOCOL_VERSION = {pipe_protocol}" if line.startswith("PROTOCOL_VERSION = ") else line
        for line in messages.read_text().splitlines()
    ]
    messages.write_text("\n".join(lines) + "\n")
    init = tree / "cairnqd" / "__init__.py"
    init.write_text(init.read_text().replace('return version("cairnqd")', f"return {version!r}"))
    return tree


def install(current: Path, release: Path) -> None:
    """Point `current` at `release` at once, as a deploy swaps what is installed."""
    staged = current.with_name(current.name + ".new")
    staged.symlink_to(release)
    os.replace(staged, current)


def _config(folder: Path, backend: str, target: str) -> Path:
    database = {"path": target} if backend == "sqlite" else {"dsn": target, "auto_migrate": True}
    document: dict[str, Any] = {
        "version": 1,
        "database": database,
        "handlers": ["probe_handlers:registry"],
        "python_path": [str(folder)],
        "groups": {
            name: {"queues": [f"q{name}"], "processes": n, "concurrency": 8}
            for name, n in GROUPS.items()
        },
        "shutdown_timeout": "30s",
        "metrics": {"listen": "127.0.0.1:0"},
        "runtime_dir": str(folder / "run"),
    }
    path = folder / "cairnq.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    return path


class ReadyWatch:
    """The fewest worker children titled `ready` per group, under any master of the
    config, sampled every 10 ms from /proc while it runs."""

    def __init__(self, config: Path) -> None:
        self.master = f"cairnqd: master [{config}]"
        self.fewest = dict(GROUPS)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            titles, parents = {}, {}
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    raw = (entry / "cmdline").read_bytes()
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                titles[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            masters = {pid for pid, title in titles.items() if title.startswith(self.master)}
            for group in GROUPS:
                ready = sum(
                    1
                    for pid, title in titles.items()
                    if parents[pid] in masters and f"[{group}]" in title and title.endswith("ready")
                )
                self.fewest[group] = min(self.fewest[group], ready)
            self.samples += 1
            time.sleep(0.01)


async def _submit(
    backend: str, target: str, n: int, rate: float, at_third: asyncio.Event
) -> dict[str, float]:
    import cairnqd

    client = (
        cairnqd.CairnQ.sqlite(target) if backend == "sqlite" else cairnqd.CairnQ.postgres(target)
    )
    submitted: dict[str, float] = {}
    queues = [f"q{name}" for name in GROUPS]
    async with client:
        began = time.monotonic()
        for i in range(n):
            at = time.monotonic()
            task = await client.submit("probe.run", {"i": i}, queue=queues[i % len(queues)])
            submitted[task.id] = at
            if i == n // 3:
                at_third.set()
            lag = began + (i + 1) / rate - time.monotonic()
            if lag > 0:
                await asyncio.sleep(lag)
    return submitted


async def _succeeded(backend: str, target: str) -> int:
    import cairnqd

    client = (
        cairnqd.CairnQ.sqlite(target) if backend == "sqlite" else cairnqd.CairnQ.postgres(target)
    )
    async with client:
        stats = await client.stats()
    return sum(by.get("succeeded", 0) for by in stats.values())


def _start(config: Path, env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(config), "run"],
        env=env,
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=config.parent,
        start_new_session=True,
    )


def _cli(config: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cairnqd.cli", "-c", str(config), *args],
        env=env,
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


async def probe(backend: str, n: int, rate: float) -> tuple[bool, list[str]]:
    from cairnqd.daemon.wire.messages import PROTOCOL_VERSION

    with tempfile.TemporaryDirectory(prefix="inplace_upgrade_") as tmp:
        folder = Path(tmp)
        (folder / "probe_handlers.py").write_text(HANDLERS)
        log = folder / "executions.log"
        running = make_release(folder, "running", "0.0.1", PROTOCOL_VERSION)
        following = make_release(folder, "next", "0.0.2", PROTOCOL_VERSION + 1)
        current = folder / "installed"
        install(current, running)
        env = {**os.environ, "PYTHONPATH": str(current), "INPLACE_PROBE_LOG": str(log)}
        async with fresh_target(backend, "inplace") as target:  # type: ignore[arg-type]
            config = _config(folder, backend, target)
            daemon = _start(config, env, folder / "daemon.out")
            try:
                await asyncio.sleep(3.0)  # migrates and starts
                third = asyncio.Event()
                submitting = asyncio.create_task(_submit(backend, target, n, rate, third))
                await third.wait()
                install(current, following)
                with ReadyWatch(config) as watch:
                    began = time.monotonic()
                    done = await asyncio.to_thread(_cli, config, env, "upgrade", "--wait", "2m")
                    ended = time.monotonic()
                submitted = await submitting
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    succeeded = await _succeeded(backend, target)
                    if succeeded >= n:
                        break
                    await asyncio.sleep(0.5)
            finally:
                state = json.loads(next((folder / "run").glob("*.json")).read_text())
                os.kill(state["pid"], signal.SIGTERM)
                await asyncio.to_thread(daemon.wait, 60)
        rows = [line.split() for line in log.read_text().splitlines()]
        runs = collections.Counter(row[0] for row in rows)
        by_release = collections.Counter(
            "running" if int(row[1]) == PROTOCOL_VERSION else "next" for row in rows
        )
        waits = [float(row[2]) - submitted[row[0]] for row in rows]
        during = [
            float(row[2]) - submitted[row[0]] for row in rows if began <= submitted[row[0]] <= ended
        ]
        twice = [t for t, c in runs.items() if c > 1]
        verdict = (
            done.returncode == 0
            and len(runs) == n
            and not twice
            and succeeded == n
            and watch.fewest == GROUPS
            and by_release["running"] > 0
            and by_release["next"] > 0
        )
        if not verdict:
            print(done.stdout, done.stderr, (folder / "daemon.out").read_text()[-4000:])
        row_text = [
            backend,
            f"{n:,}",
            f"{len(runs) - len(twice):,}",
            str(len(twice)),
            str(n - len(runs)),
            f"{by_release['running']:,} / {by_release['next']:,}",
            " ".join(f"{g} {k}/{GROUPS[g]}" for g, k in watch.fewest.items()),
            f"{ended - began:.2f}",
            f"{percentile(waits, 50) * 1000:.1f} / {percentile(waits, 99) * 1000:.1f} / "
            f"{max(waits) * 1000:.0f}",
            f"{max(during, default=0.0) * 1000:.0f}",
            "EXACTLY ONCE" if verdict else "FAILED",
        ]
        return verdict, row_text


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    ok, rows = True, list[list[str]]()
    for backend in args.backend or ["sqlite", "postgres"]:
        for _ in range(args.repeats):
            verdict, row = await probe(backend, args.tasks, args.rate)
            ok, rows = ok and verdict, [*rows, row]
    print_table(
        "cairnqd upgrade under load",
        [
            "backend", "tasks", "executed once", "more than once", "never",
            "running / next executions", "fewest ready", "upgrade s",
            "wait p50 / p99 / max ms", "max wait while upgrading ms", "verdict",
        ],
        rows,
    )  # fmt: skip
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main_entry(main)
