"""The fault fixtures, made visible to the tests here (`daemon_factory` reaches every
test from tests/support/daemon.py).

A test package elsewhere gets them the same way: import them into its conftest.py.
"""

from tests.faults.netns import netns_hosts
from tests.faults.proxy import pg_proxy

__all__ = ["netns_hosts", "pg_proxy"]
