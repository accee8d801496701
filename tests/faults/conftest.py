"""The fault fixtures, made visible to the tests here.

A test package elsewhere gets them the same way: import them into its conftest.py.
"""

from tests.daemon.conftest import daemon_factory
from tests.faults.netns import netns_hosts
from tests.faults.proxy import pg_proxy

__all__ = ["daemon_factory", "netns_hosts", "pg_proxy"]
