"""The config-file fixtures (`write`, `load`, `errors`) for the tests here."""

from tests.support.configfiles import errors, load, write

__all__ = ["errors", "load", "write"]
