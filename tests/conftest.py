"""What every test gets: the shared fixtures of tests/support/, and Hypothesis settings.

The fixtures live beside the helpers they build on, in the plugin modules listed below:
the test databases (`dialect`, `db_target`, `store`, `pg_dsn`, ...), the daemon
(`daemon_factory`) and the `cairnqd` command line (`run`).
"""

from __future__ import annotations

import os

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
