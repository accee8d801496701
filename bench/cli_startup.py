"""CLI start-up: wall time of one `cairnqd` command on a small SQLite database.

    python -m bench.cli_startup [--runs 7] [--source DIR]

Every command an operator types pays the interpreter's start, the imports and one
round trip to the database; on a SQLite deployment nothing should load the Postgres
driver. Each row is the median (and min/max) of `--runs` fresh subprocesses, after one
warm-up run that also writes the bytecode cache, as an installed wheel has it. The
last column is the median CPU time (user + system) of the command, which a busy
machine inflates much less than wall time.
`--source DIR` puts another checkout's package first on sys.path, to compare before
and after a change. Rows `python -c pass` and `import psycopg` frame the numbers:
the floor, and what the driver alone would add.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import print_table

CONFIG = """\
version: 1
database:
  path: ./bench.db
handlers: ["cairnqd.demo:registry"]
groups:
  default:
    queues: [default]
"""


def _environment(source: str | None) -> dict[str, str]:
    env = dict(os.environ)
    # An installed package has its bytecode; a checkout run with this set compiles
    # every module on every start, which measures the compiler, not us.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: Sequence[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one run."""
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return elapsed, _children_cpu() - cpu


def _measure(
    argv: Sequence[str], runs: int, env: dict[str, str], cwd: str
) -> list[tuple[float, float]]:
    _timed(argv, env, cwd)  # warm-up: bytecode cache, page cache
    return [_timed(argv, env, cwd) for _ in range(runs)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs per row (>= 5)")
    parser.add_argument("--source", help="a checkout whose cairnqd package to measure")
    args = parser.parse_args(argv)
    if args.runs < 5:
        parser.error("--runs must be at least 5 for a meaningful median")
    env = _environment(args.source)
    cli = [sys.executable, "-m", "cairnqd.cli", "-c", "cairnq.yaml"]
    cases = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("import psycopg", [sys.executable, "-c", "import psycopg, psycopg_pool"]),
        ("cairnqd stats", [*cli, "stats"]),
        ("cairnqd list", [*cli, "list"]),
        ("cairnqd check", [*cli, "check"]),
    ]
    rows = []
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as workdir:
        Path(workdir, "cairnq.yaml").write_text(CONFIG, encoding="utf-8")
        subprocess.run([*cli, "migrate"], env=env, cwd=workdir, check=True, capture_output=True)
        for label, command in cases:
            samples = _measure(command, args.runs, env, workdir)
            times, cpu = [w for w, _ in samples], [c for _, c in samples]
            figures = (statistics.median(times), min(times), max(times), statistics.median(cpu))
            rows.append([label, *(f"{t * 1000:.0f}" for t in figures)])
    source = args.source or "this checkout"
    print_table(
        f"CLI start-up on SQLite ({source}, {args.runs} runs each)",
        ["command", "median ms", "min ms", "max ms", "cpu ms"],
        rows,
    )


if __name__ == "__main__":
    main()
