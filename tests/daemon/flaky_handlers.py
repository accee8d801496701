"""Handlers that refuse to load while `handlers-broken` exists in the daemon's working
directory: a test breaks and mends a group's code without a reload."""

from __future__ import annotations

import os
from typing import Any

from cairnqd.registry import TaskRegistry

if os.path.exists("handlers-broken"):
    raise ImportError("handlers-broken exists: this module refuses to load")

registry = TaskRegistry()


@registry.task("f.echo")
async def echo(ctx: Any, payload: Any) -> Any:
    return payload
