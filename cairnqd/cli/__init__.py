"""The `cairnqd` command line; `main` is the console entry point."""

from cairnqd.cli.main import main

__all__ = ["main"]
