"""A handler module whose import ends the process with exit 1: a child that dies
before it is ready without saying why (not the exit 78 of a cannot-boot)."""

raise SystemExit(1)
