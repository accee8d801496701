"""`unserved_task`: why no group of a config would run a task, read in process (the CLI
tests run it through `cairnqd submit`, tests/cli/test_cli.py)."""

from __future__ import annotations

from pathlib import Path

from cairnqd.cli.admin import unserved_task
from cairnqd.config import load_config

CONFIG = """\
version: 1
database: {path: tasks.db}
handlers: [cairnqd.demo:registry]
metrics: {listen: off}
groups:
  web: {queues: [default, mail]}
  batch: {queues: [reports], handlers: ["tests.daemon.handlers:registry"]}
"""


def test_a_task_is_judged_by_the_groups_that_claim_its_queue(tmp_path: Path) -> None:
    path = tmp_path / "cairnq.yaml"
    path.write_text(CONFIG)
    config = load_config(path, {})
    assert unserved_task(config, "demo.echo", "mail") is None
    assert unserved_task(config, "t.echo", "reports") is None
    wrong_queue = unserved_task(config, "t.echo", "mail")
    assert wrong_queue is not None
    assert "no handler for task 't.echo' in the groups claiming queue 'mail' (web)" in wrong_queue
    typo = unserved_task(config, "demo.ehco", "default")
    assert typo is not None and "(did you mean 'demo.echo'?)" in typo
    nowhere = unserved_task(config, "demo.echo", "nightly")
    assert nowhere is not None
    assert "claims queue 'nightly' (they claim default, mail, reports)" in nowhere
