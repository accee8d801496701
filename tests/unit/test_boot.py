"""The boot message: built from the config, decoded strictly by the child."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cairnqd.config import Config, load_config
from cairnqd.daemon.boot import Boot, BootVersionMismatch, WorkerSettings, boot_for, decode_boot
from cairnqd.daemon.wire.messages import PROTOCOL_VERSION, MessageError, encode


def config(tmp_path: Path, group: str = "{queues: [q]}") -> Config:
    path = tmp_path / "cairnq.yaml"
    path.write_text(
        "version: 1\n"
        f"database: {{path: {tmp_path / 'db.sqlite'}}}\n"
        "handlers: ['cairnqd.demo:registry']\n"
        f"groups: {{g: {group}}}\n"
    )
    return load_config(path)


def test_boot_carries_the_config_and_round_trips(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        "{queues: [q, r], processes: 3, lease: 1m, max_run: 10s, prefetch: 2,"
        " max_tasks_per_child: 100, max_memory: 1MiB, resources: {gpu: 1}, cancel_grace: 2s}",
    )
    boot = boot_for(cfg, cfg.groups["g"], 2, 7, "host:g.2:01")
    assert (boot.group, boot.slot, boot.nslots, boot.gen) == ("g", 2, 3, 7)
    assert 100 <= (boot.max_tasks or 0) <= 110  # jittered so a pool does not recycle at once
    assert boot.max_memory == 1 << 20
    assert boot.shutdown_timeout_s == 30.0 and boot.hb_interval_s == 5.0
    assert boot.group_config == WorkerSettings(
        queues=("q", "r"),
        handlers=("cairnqd.demo:registry",),
        concurrency=4,
        prefetch=2,
        lease_ms=60_000,
        max_run_ms=10_000,
        poll_interval_ms=1000,
        retry_backoff_ms=1000,
        retry_backoff_max_ms=30_000,
        resources={"gpu": 1},
        cancel_grace_ms=2000,
    )
    assert boot.database.path is not None and boot.database.dsn is None
    assert boot.database.auto_migrate is True
    assert decode_boot(encode(boot).rstrip(b"\n")) == boot


def test_defaults_come_from_the_config_schema(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    boot = boot_for(cfg, cfg.groups["g"], 0, 1, "w")
    assert boot.max_tasks is None and boot.max_memory is None
    assert boot.group_config.prefetch == "auto" and boot.group_config.max_run_ms is None
    assert boot.group_config.cancel_grace_ms == 10_000
    assert decode_boot(encode(boot)) == boot


def _wire(tmp_path: Path) -> dict[str, Any]:
    cfg = config(tmp_path)
    data: dict[str, Any] = json.loads(encode(boot_for(cfg, cfg.groups["g"], 0, 1, "w")))
    return data


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda d: d.pop("hb_interval_s"), "boot message without 'hb_interval_s'"),
        (lambda d: d["group_config"].pop("lease_ms"), "WorkerSettings message without 'lease_ms'"),
        (lambda d: d.update(slot="0"), "boot.slot: expected integer, got str"),
        (lambda d: d["group_config"].update(prefetch="lots"), "expected one of 'auto'"),
        (lambda d: d["group_config"].update(queues="q"), "expected list, got str"),
        (lambda d: d.update(t="hb"), "expected a boot message, got kind 'hb'"),
    ],
)
def test_a_missing_or_mistyped_field_is_a_protocol_error(
    tmp_path: Path, change: Any, error: str
) -> None:
    data = _wire(tmp_path)
    change(data)
    with pytest.raises(MessageError, match=error):
        decode_boot(json.dumps(data).encode())


def test_another_protocol_version_is_a_mismatch(tmp_path: Path) -> None:
    data = _wire(tmp_path)
    data["v"] = PROTOCOL_VERSION + 1
    with pytest.raises(BootVersionMismatch, match=f"pipe protocol {PROTOCOL_VERSION + 1}"):
        decode_boot(json.dumps(data).encode())


def test_fields_an_older_parent_sent_are_ignored(tmp_path: Path) -> None:
    data = {**_wire(tmp_path), "log_level": "INFO"}
    assert isinstance(decode_boot(json.dumps(data).encode()), Boot)
