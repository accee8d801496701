"""The fault fixtures, made visible to the tests here.

A test package elsewhere gets them the same way: import them into its conftest.py.
"""

from tests.faults.proxy import pg_proxy

__all__ = ["pg_proxy"]
