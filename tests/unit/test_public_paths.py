"""Every module path of the public cairnq SDK resolves in cairnqd with the names code
written against the SDK imports from it (`import cairnqd as cairnq`, then
`from cairnq.worker import Worker`-style imports)."""

from __future__ import annotations

import importlib

import pytest

import cairnqd

PUBLIC = {
    "cairnqd.client": ["CairnQ"],
    "cairnqd.worker": ["Worker"],
    "cairnqd.context": ["TaskContext"],
    "cairnqd.errors": ["CairnQError", "TaskError", "LostLease", "AlreadyExists"],
    "cairnqd.models": ["Task", "TaskRef", "TaskDef"],
    "cairnqd.retention": ["Retention"],
    "cairnqd.backpressure": [],
    "cairnqd.store": ["TaskStore"],
}


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_public_module_path_imports_with_its_names(path: str) -> None:
    module = importlib.import_module(path)
    missing = [name for name in PUBLIC[path] if not hasattr(module, name)]
    assert missing == [], f"{path} lacks {missing}"


def test_the_package_re_exports_the_api_handle_and_worker() -> None:
    assert cairnqd.CairnQ is importlib.import_module("cairnqd.client").CairnQ
    assert cairnqd.Worker is importlib.import_module("cairnqd.worker").Worker
