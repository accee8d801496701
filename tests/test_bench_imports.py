"""Every module of bench/ imports against today's package.

The benchmarks are not run by CI, so a refactor of a private helper they borrow (a bind
function, a store attribute) would otherwise break them silently until the next
measurement: the raw SQL limit row went missing from an A/B that way.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", MODULES)
def test_bench_module_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")


async def test_the_raw_sql_limit_loop_drains_a_real_file(tmp_path: Path) -> None:
    """bench/raw_proc.py borrows the stores' bind helpers; run it on 10 tasks."""
    import subprocess
    import sys

    from cairnqd.store.sqlite import SQLiteStore

    path = tmp_path / "raw.db"
    async with SQLiteStore(str(path)) as store:
        await store.submit_many([{"name": "bench.noop"}] * 10)
    done = subprocess.run(
        [sys.executable, str(BENCH / "raw_proc.py"), "--backend", "sqlite",
         "--target", str(path), "--batch", "4"],
        input="GO\n", capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "DONE handled=10 " in done.stdout, done.stdout + done.stderr
