"""What every test gets: the shared fixtures of tests/support/, and Hypothesis settings.

The fixtures live beside the helpers they build on, in the plugin modules listed below:
the test databases (`dialect`, `db_target`, `store`, `pg_dsn`, ...), the daemon
(`daemon_factory`) and the `cairnqd` command line (`run`).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# In dependency order: a plugin registered after a module that imports it could not have
# its asserts rewritten (daemon imports cli).
pytest_plugins = [
    "tests.support.databases",
    "tests.support.cli",
    "tests.support.daemon",
]

# No per-example deadline: the suite shares two cores with other work, and a slow
# example under load is not a bug. Under CI (CI=true) Hypothesis loads its own "ci"
# profile, which has no deadline either and also derandomizes the examples.
if "CI" not in os.environ:
    settings.register_profile("cairnqd", deadline=None)
    settings.load_profile("cairnqd")

#: Modules that take most of a minute or more, besides those with `slow` tests: the
#: Hypothesis models and the command line's round trips.
_LONG_MODULES = frozenset(
    {
        "tests/worker/test_inflight_model.py",
        "tests/worker/test_lease_guard_model.py",
        "tests/store/test_dependencies_model.py",
        "tests/cli/test_cli.py",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long modules first. pytest-xdist's `--dist loadfile` hands out whole modules in
    this order as processes free up: a long module handed out last kept one process
    busy minutes after the others had finished."""
    long = {item.path for item in items if item.get_closest_marker("slow") is not None}
    long.update(item.path for item in items if _relative(item) in _LONG_MODULES)
    items.sort(key=lambda item: item.path not in long)  # stable: each module stays whole


def _relative(item: pytest.Item) -> str:
    return item.path.relative_to(item.config.rootpath).as_posix()
