"""A/B of two versions of cairnqd: drain and submit, interleaved in one run.

    python -m bench.ab --before REV [--backend sqlite|postgres]... [--repeats 3]
                       [--tasks 20000] [--single 2000] [--batches 20]

`REV` (a commit) is checked out into a detached worktree in the temp directory. Each round
runs `bench.drain --impl ours --procs 2` and `bench.submit --no-peers` once for each
side, alternating which side goes first, so a machine that slows down during the run
slows both. Both sides run today's bench code (a copy of `bench/` in a neutral
directory), and only `PYTHONPATH` differs: the old tree's `cairnqd` for "before", this
checkout's for "after". The public API the bench uses (`CairnQ`, `Worker`) is the same
in both. Prints the medians and after ÷ before; `raw256` (the bare SQL loop) is
measured in the "after" rounds as the machine's limit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, REPO, print_table


def worktree(rev: str) -> Path:
    """A detached checkout of `rev`, made once and reused."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()
    # Outside the repository, so that no linter or test run of this tree walks into it.
    path = Path(tempfile.gettempdir()) / f"cairnqd-ab-{sha}"
    if not (path / "cairnqd").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, check=True)
    return path


def bench_copy(into: Path) -> Path:
    """Today's bench package alone in a directory, so that `python -m bench.X` there
    finds this bench and whichever `cairnqd` PYTHONPATH names."""
    shutil.copytree(BENCH_DIR, into / "bench", ignore=shutil.ignore_patterns("out", "__pycache__"))
    return into


def check_tree(home: Path, tree: Path) -> None:
    """Fail loudly unless a process started the way the bench starts them imports
    `cairnqd` from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    probe = [sys.executable, "-c", "import cairnqd; print(cairnqd.__file__)"]
    found = subprocess.run(probe, cwd=home, env=env, check=True, capture_output=True, text=True)
    if not Path(found.stdout.strip()).is_relative_to(tree):
        raise SystemExit(f"cairnqd came from {found.stdout.strip()}, not from {tree}")


def run_bench(home: Path, tree: Path, module: str, args: Sequence[str], out: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", f"bench.{module}", *args, "--repeats", "1", "--out", out]
    subprocess.run(command, cwd=home, env=env, check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads((home / "bench" / "out" / f"{out}.json").read_text())
    return result


def medians(result: dict[str, Any], key: str) -> dict[tuple[str, ...], float]:
    found = {}
    for point in result["points"]:
        labels = tuple(str(point[k]) for k in ("backend", "impl", "mode") if k in point)
        if key in point["median"]:  # a point whose runs all failed has no median
            found[labels] = float(point["median"][key])
    return found


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare against")
    parser.add_argument("--backend", action="append", choices=("sqlite", "postgres"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    backends = args.backend or ["sqlite", "postgres"]
    trees = {"before": worktree(args.before), "after": REPO}
    samples: dict[tuple[str, ...], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="cairnqd-ab-") as tmp:
        home = bench_copy(Path(tmp))
        for tree in trees.values():
            check_tree(home, tree)
        for round_ in range(args.repeats):
            order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
            for backend in backends:
                for side in order:
                    impls = ["--impl", "ours"] + (["--impl", "raw256"] if side == "after" else [])
                    drain = run_bench(
                        home, trees[side], "drain",
                        ["--backend", backend, *impls, "--procs", "2", "--tasks", str(args.tasks)],
                        f"ab-drain-{side}",
                    )  # fmt: skip
                    for (b, impl), rate in medians(drain, "tasks_per_s").items():
                        name = "raw256 (limit)" if impl == "raw256" else f"drain {side}"
                        samples.setdefault((b, name), []).append(rate)
                    submit = run_bench(
                        home, trees[side], "submit",
                        ["--backend", backend, "--no-peers", "--single", str(args.single),
                         "--batches", str(args.batches)],
                        f"ab-submit-{side}",
                    )  # fmt: skip
                    for (b, impl, mode), rate in medians(submit, "tasks_per_s").items():
                        if impl == "ours":
                            samples.setdefault((b, f"submit {mode} {side}"), []).append(rate)
                print(f"round {round_ + 1}/{args.repeats} done", flush=True)
    report(samples, backends)


def report(samples: dict[tuple[str, ...], list[float]], backends: Sequence[str]) -> None:
    rows = []
    for backend in backends:
        for what in ("drain", "submit single", "submit batch"):
            before = samples.get((backend, f"{what} before"), [])
            after = samples.get((backend, f"{what} after"), [])
            if before and after:
                b, a = statistics.median(before), statistics.median(after)
                # Every run's ratio to the median before: the spread a reader needs to
                # tell a change from noise.
                spread = " ".join(f"{x / b:.2f}" for x in after)
                rows.append([backend, what, f"{b:,.0f}", f"{a:,.0f}", f"{a / b:.2f}", spread])
        limit = samples.get((backend, "raw256 (limit)"), [])
        if limit:
            rows.append([backend, "raw256 drain", "", f"{statistics.median(limit):,.0f}", "", ""])
    columns = ["backend", "tasks/s (median)", "before", "after", "after ÷ before", "each run"]
    print_table("A/B: before vs after, interleaved", columns, rows)


if __name__ == "__main__":
    main()
