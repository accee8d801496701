"""A handler module that cannot be imported: its group must go FATAL, not loop."""

raise ImportError("this handler module is broken on purpose")
