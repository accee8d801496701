"""plan_reload: what a reload does, computed from the old and new config alone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cairnqd.config import Config, load_config
from cairnqd.daemon.parent.reload import ReloadPlan, Resize, plan_reload

Loader = Callable[[str], Config]

BASE = """\
version: 1
database: {path: ./t.db}
handlers: [cairnqd.demo:registry]
groups:
  mail:
    queues: [mail]
    processes: 2
  bulk:
    queues: [bulk]
"""


@pytest.fixture
def load(tmp_path: Path) -> Loader:
    def load(text: str) -> Config:
        path = tmp_path / "cairnq.yaml"
        path.write_text(text)
        return load_config(path)

    return load


def test_the_same_file_changes_nothing(load: Loader) -> None:
    old = load(BASE)
    plan = plan_reload(old, load(BASE), fatal=(), roll_all=False)
    assert plan == ReloadPlan(config=plan.config)
    assert not plan.new_generation and plan.describe() == []


def test_each_kind_of_change(load: Loader) -> None:
    old = load(BASE)
    new = load(
        BASE.replace("processes: 2", "processes: 3\n    lease: 1m").replace(
            "  bulk:\n    queues: [bulk]\n", "  fast:\n    queues: [fast]\n"
        )
        + "logging: {level: debug}\nretention: {interval: 1h}\n"
    )
    plan = plan_reload(old, new, fatal=(), roll_all=False)
    assert plan.added == ("fast",) and plan.removed == ("bulk",)
    assert plan.resized == (Resize("mail", 2, 3),)
    assert plan.rolled == ("mail",)
    assert plan.hot == ("retention.interval", "logging.level")
    assert plan.new_generation
    assert plan.describe() == [
        "group fast added",
        "group bulk removed: draining its children",
        "group mail resized: 2 -> 3",
        "group mail rolls: its config changed",
        "settings applied in place: retention.interval, logging.level",
    ]


def test_size_only_does_not_roll_and_hot_only_rolls_nothing(load: Loader) -> None:
    old = load(BASE)
    bigger_file = load(BASE.replace("processes: 2", "processes: 5"))
    bigger = plan_reload(old, bigger_file, fatal=(), roll_all=False)
    assert bigger.rolled == () and bigger.resized == (Resize("mail", 2, 5),)
    hot = plan_reload(old, load(BASE + "shutdown_timeout: 1m\n"), fatal=(), roll_all=False)
    assert hot.rolled == () and hot.hot == ("shutdown_timeout",) and hot.new_generation


def test_sigusr2_rolls_every_group_and_fatal_groups_are_revived(load: Loader) -> None:
    old = load(BASE)
    plan = plan_reload(old, load(BASE), fatal=("bulk",), roll_all=True)
    assert plan.rolled == ("mail", "bulk")
    assert plan.revived == ("bulk",)
    assert plan.new_generation
    assert "group bulk was FATAL: starting it again" in plan.describe()
