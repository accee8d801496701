"""The daemon: `cairnqd -c cairnq.yaml`, a supervisor parent and its worker children.

Nothing in the SDK imports from here; `docs/architecture.md` maps the modules.
"""
