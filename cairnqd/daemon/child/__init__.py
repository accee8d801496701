"""The worker child's side of the daemon: a `Worker` run for one group under the
parent's eye. It speaks to the parent only through the pipes of `cairnqd/daemon/wire/`
and never imports `cairnqd/daemon/parent/` (an import contract in pyproject.toml)."""
