"""Print the tables again from saved results.

    python -m bench.report [--quiet BUSY] [bench/out/X.json ...]

With no files it reads every bench/out/{submit,drain,latency,memory}.json present.
`--quiet 0.25` takes medians only over runs that started with the machine at most
25% busy from other jobs (each run records that reading), for a shared
machine. Useful for refreshing RESULTS.md after a run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench import drain, latency, memory, submit
from bench.common import OUT_DIR, Point, Run


def load(path: Path) -> tuple[str, dict[str, Any], dict[str, Any], list[Point]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    points = []
    for raw in data["points"]:
        labels = {k: v for k, v in raw.items() if k not in ("median", "runs")}
        runs = [Run(r["metrics"], r.get("detail", {})) for r in raw["runs"]]
        points.append(Point(labels, runs))
    return data["bench"], data["machine"], data["config"], points


def quiet_only(points: list[Point], limit: float) -> list[Point]:
    kept = []
    for p in points:
        runs = [r for r in p.runs if r.detail.get("machine_busy_before", 1.0) <= limit]
        kept.append(Point({**p.labels}, runs))
    return kept


def show(path: Path, quiet: float | None) -> None:
    bench, machine, config, points = load(path)
    if quiet is not None:
        points = quiet_only(points, quiet)
        counts = ", ".join(
            f"{'/'.join(map(str, p.labels.values()))}: {len(p.runs)}" for p in points
        )
        print(f"\n(quiet runs only, machine <= {quiet:.0%} busy; runs kept: {counts})")
    busy = [
        r.detail["machine_busy_before"]
        for p in points
        for r in p.runs
        if "machine_busy_before" in r.detail
    ]
    print(f"\n## {path.name}: {machine['date']}, commit {machine['cairnqd_commit']}", end="")
    print(f" (tree {machine.get('cairnqd_tree_sha256', '?')}, dirty={machine['cairnqd_dirty']})")
    if busy:
        print(f"machine busy before runs (others' load): max {max(busy):.0%}")
    if bench == "submit":
        submit.report(points)
    elif bench == "drain":
        drain.report(points)
    elif bench == "latency":
        latency.report(points)
    elif bench == "memory":
        milestones = [int(m) for m in str(config["milestones"]).split(",")]
        memory.report(points, milestones)
    else:
        print(f"(no table for bench {bench!r})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet", type=float, default=None, metavar="BUSY")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    paths = args.files or [
        OUT_DIR / f"{name}.json"
        for name in ("submit", "drain", "latency", "memory")
        if (OUT_DIR / f"{name}.json").exists()
    ]
    for path in paths:
        show(path, args.quiet)


if __name__ == "__main__":
    main()
