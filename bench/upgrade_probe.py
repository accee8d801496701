"""A rolling upgrade, probed: a daemon of an older commit and one of this tree on one
database, tasks flowing the whole time, and every task's executions counted.

1. Installs the older commit (`--from`, default the release before this one) into a
   virtualenv of its own, from a `git worktree` of this repository, once per commit
   (kept under `--cache`, default /tmp/cairnqd-upgrade-probe).
2. Migrates a fresh database (SQLite file or Postgres database) with the older code and
   starts the older daemon on it,
   submits `--tasks` tasks at `--rate` per second, each handler appending one line
   (task id, pid) to a file with O_APPEND, so nothing is counted twice or lost by the
   counting itself.
3. A third of the way in, runs this tree's `migrate` while the older daemon works, starts
   this tree's daemon beside it, then stops the older one with SIGTERM: it drains and
   leaves the rest to the new.
4. Waits for every task to finish, then counts: each task must have run exactly once
   and ended `succeeded`. Prints the verdict, the executions by version, and exits 1 on
   any task run twice, never, or not succeeded.

    python -m bench.upgrade_probe --backend sqlite
    python -m bench.upgrade_probe --backend postgres --from 8d77624 --tasks 3000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import fresh_target, logging_handlers, main_entry

REPO = Path(__file__).resolve().parents[1]
#: The commit before the fleet registry and the first release: a daemon that knows
#: nothing of either, as an operator's running fleet would be.
DEFAULT_FROM = "8d77624"

HANDLERS = logging_handlers(
    "UPGRADE_PROBE_LOG", "{ctx.task.id} {os.getpid()} {os.environ['UPGRADE_PROBE_SIDE']}"
)


def _old_python(rev: str, cache: Path) -> Path:
    """The python of a virtualenv holding commit `rev`, built once."""
    home = cache / rev
    python = home / "venv" / "bin" / "python"
    if python.exists():
        return python
    home.mkdir(parents=True, exist_ok=True)
    tree = home / "tree"
    if not tree.exists():
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True
        )
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(tree)], check=True)
    return python


def _config(folder: Path, backend: str, target: str, name: str) -> Path:
    database = {"path": target} if backend == "sqlite" else {"dsn": target}
    document: dict[str, Any] = {
        "version": 1,
        "database": database,
        "handlers": ["probe_handlers:registry"],
        "python_path": [str(folder)],
        "groups": {"default": {"queues": ["default"], "processes": 2, "concurrency": 8}},
        "shutdown_timeout": "30s",
        "metrics": {"listen": "127.0.0.1:0"},  # two daemons on one host: a port each
        "runtime_dir": str(folder / f"run-{name}"),
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    return path


def _migrate(python: Path, config: Path) -> None:
    """`cairnqd migrate` with that side's code, as an operator runs it (step 4 of
    docs/operations.md, "Upgrade")."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(python), "-m", "cairnqd.cli", "-c", str(config), "migrate"],
        env=env,
        cwd=config.parent,
        check=True,
        capture_output=True,
    )


def _start(python: Path, config: Path, side: str, log: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "UPGRADE_PROBE_LOG": str(log), "UPGRADE_PROBE_SIDE": side}
    env.pop("PYTHONPATH", None)  # each side runs its own installed code
    return subprocess.Popen(
        [str(python), "-m", "cairnqd.cli", "-c", str(config), "run"],
        env=env,
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=config.parent,
        start_new_session=True,
    )


async def _submit(backend: str, target: str, n: int, rate: float, at_third: asyncio.Event) -> None:
    import cairnqd

    client = (
        cairnqd.CairnQ.sqlite(target) if backend == "sqlite" else cairnqd.CairnQ.postgres(target)
    )
    async with client:
        began = time.monotonic()
        for i in range(n):
            await client.submit("probe.run", {"i": i})
            if i == n // 3:
                at_third.set()
            lag = began + (i + 1) / rate - time.monotonic()
            if lag > 0:
                await asyncio.sleep(lag)


async def _statuses(backend: str, target: str) -> collections.Counter[str]:
    import cairnqd

    client = (
        cairnqd.CairnQ.sqlite(target) if backend == "sqlite" else cairnqd.CairnQ.postgres(target)
    )
    async with client:
        stats = await client.stats()
    return collections.Counter({s: n for by in stats.values() for s, n in by.items() if n})


async def probe(backend: str, rev: str, n: int, rate: float, cache: Path) -> bool:
    old_python = await asyncio.to_thread(_old_python, rev, cache)
    new_python = Path(sys.executable)
    with tempfile.TemporaryDirectory(prefix="upgrade_probe_") as tmp:
        folder = Path(tmp)
        (folder / "probe_handlers.py").write_text(HANDLERS)
        log = folder / "executions.log"
        async with fresh_target(backend, "upgrade") as target:  # type: ignore[arg-type]
            old_config = _config(folder, backend, target, "old")
            await asyncio.to_thread(_migrate, old_python, old_config)
            old = _start(old_python, old_config, "old", log, folder / "old.out")
            new: subprocess.Popen[bytes] | None = None
            try:
                await asyncio.sleep(3.0)  # the old daemon migrates and starts
                third = asyncio.Event()
                submitting = asyncio.create_task(_submit(backend, target, n, rate, third))
                await third.wait()
                new_config = _config(folder, backend, target, "new")
                await asyncio.to_thread(_migrate, new_python, new_config)  # while old runs
                new = _start(new_python, new_config, "new", log, folder / "new.out")
                await asyncio.sleep(3.0)  # the new one is up beside it
                if new.poll() is not None:
                    raise RuntimeError(f"the new daemon exited {new.returncode} at start")
                old.send_signal(signal.SIGTERM)
                old_exit = await asyncio.to_thread(old.wait, 60)
                await submitting
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    statuses = await _statuses(backend, target)
                    if statuses.get("succeeded", 0) + statuses.get("failed", 0) >= n:
                        break
                    await asyncio.sleep(0.5)
            finally:
                for process in (old, new):
                    if process is not None and process.poll() is None:
                        process.send_signal(signal.SIGTERM)
                        await asyncio.to_thread(process.wait, 60)
            statuses = await _statuses(backend, target)
        runs = collections.Counter(line.split()[0] for line in log.read_text().splitlines())
        by_side = collections.Counter(line.split()[2] for line in log.read_text().splitlines())
        twice = [t for t, c in runs.items() if c > 1]
        verdict = len(runs) == n and not twice and statuses.get("succeeded", 0) == n
        # Both sides must have run tasks, or the probe did not probe an upgrade.
        verdict = verdict and by_side["old"] > 0 and by_side["new"] > 0 and old_exit == 0
        print(
            f"{backend}: {'EXACTLY ONCE' if verdict else 'FAILED'}: {n} tasks, {len(runs)} "
            f"executed, {len(twice)} more than once; statuses {dict(statuses)}; executions "
            f"by side {dict(by_side)}; old daemon exited {old_exit} after SIGTERM"
        )
        if not verdict:
            print(
                (folder / "old.out").read_text()[-3000:], (folder / "new.out").read_text()[-3000:]
            )
        return verdict


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--from", dest="rev", default=DEFAULT_FROM)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/cairnqd-upgrade-probe"))
    args = parser.parse_args()
    ok = True
    for backend in args.backend or ["sqlite", "postgres"]:
        ok = await probe(backend, args.rev, args.tasks, args.rate, args.cache) and ok
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main_entry(main)
