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


@pytest.mark.parametrize("batch", [1, 4])
async def test_the_raw_sql_limit_loop_settles_what_it_claims(
    dialect: str, db_target: str, batch: int
) -> None:
    """bench/raw_proc.py borrows the stores' bind helpers and statements; run it on 10
    tasks and read the rows back: every one must end succeeded (a parameter the
    statement does not read once left them all running, on Postgres, unnoticed)."""
    import subprocess
    import sys

    from tests.support.databases import make_store

    store = make_store(dialect, db_target)
    async with store:
        await store.submit_many([{"name": "bench.noop"}] * 10)
        done = subprocess.run(
            [sys.executable, str(BENCH / "raw_proc.py"), "--backend", dialect,
             "--target", db_target, "--batch", str(batch)],
            input="GO\n", capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert "DONE handled=10 " in done.stdout, done.stdout + done.stderr
        counts = await store.stats()
    assert counts["default"]["succeeded"] == 10, counts
