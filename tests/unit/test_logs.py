"""cairnqd.daemon.logs: formats, the file and its reopen after logrotate, per-logger levels."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from cairnqd.config import LoggingConfig
from cairnqd.daemon.logs import (
    LoggingSetupError,
    configure_logging,
    logging_settings,
    reopen_logs,
)


def _ours() -> list[logging.Handler]:
    """The handlers cairnqd.daemon.logs installed (pytest keeps its own on the root too)."""
    return [h for h in logging.getLogger().handlers if type(h).__module__ == "cairnqd.daemon.logs"]


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    yield
    # Reset per-logger levels through the module itself, then drop its handler.
    configure_logging({"level": "WARNING", "loggers": {}}, process_label="test")
    for handler in _ours():
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def settings(**overrides: Any) -> dict[str, Any]:
    return {"level": "INFO", "format": "text", "file": None, "loggers": {}, **overrides}


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines(path)]


def test_json_lines_parse_and_carry_the_fields(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd.log"
    configure_logging(settings(format="json", file=str(path)), process_label="[default] 1/2")
    logger = logging.getLogger("cairnqd.test")
    logger.info("hello %s", "world", extra={"task_id": "task_1", "attempt": 2, "obj": object()})
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logger.exception("it failed")

    hello, failed = records(path)
    assert hello["level"] == "INFO"
    assert hello["logger"] == "cairnqd.test"
    assert hello["pid"] == os.getpid()
    assert hello["process"] == "[default] 1/2"
    assert hello["message"] == "hello world"
    assert (hello["task_id"], hello["attempt"]) == ("task_1", 2)
    assert hello["obj"].startswith("<object object")  # not JSON: written as str()
    assert "exc_info" not in hello
    assert hello["ts"].endswith("Z")
    stamp = datetime.fromisoformat(hello["ts"].replace("Z", "+00:00"))
    assert stamp.tzinfo == UTC
    assert abs((datetime.now(UTC) - stamp).total_seconds()) < 60

    assert failed["level"] == "ERROR"
    assert failed["message"] == "it failed"
    assert failed["exc_info"].startswith("Traceback (most recent call last):")
    assert "ValueError: boom\nsecond line" in failed["exc_info"]


def test_extra_fields_never_replace_the_fixed_ones(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd.log"
    configure_logging(settings(format="json", file=str(path)), process_label="master")
    logging.getLogger("x").warning("m", extra={"pid": "fake", "ts": "fake", "level": "fake"})
    (entry,) = records(path)
    assert (entry["pid"], entry["level"]) == (os.getpid(), "WARNING")
    assert entry["ts"] != "fake"


def test_text_format(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(settings(), process_label="master")
    logging.getLogger("cairnqd.supervisor").warning("spawned %d", 3)
    (line,) = capsys.readouterr().err.splitlines()
    pattern = (
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
        rf"cairnqd\[{os.getpid()}\] master WARNING cairnqd\.supervisor spawned 3"
    )
    assert re.fullmatch(pattern, line), line


def test_percent_in_the_label_is_literal(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(settings(), process_label="[100%] 1/1")
    logging.getLogger("x").warning("ok")
    assert " [100%] 1/1 WARNING x ok" in capsys.readouterr().err


def test_file_replaces_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cairnqd.log"
    configure_logging(settings(file=str(path)), process_label="master")
    logging.getLogger("x").warning("to the file")
    assert capsys.readouterr().err == ""
    assert lines(path)[0].endswith("WARNING x to the file")


def test_file_appends(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd.log"
    path.write_text("kept\n")
    configure_logging(settings(file=str(path)), process_label="master")
    logging.getLogger("x").warning("added")
    assert lines(path)[0] == "kept"
    assert lines(path)[1].endswith("added")


def test_reopen_after_rename_writes_to_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd.log"
    rotated = tmp_path / "cairnqd.log.1"
    configure_logging(settings(file=str(path)), process_label="master")
    logger = logging.getLogger("x")
    logger.warning("before")
    path.rename(rotated)  # logrotate's default: rename, then signal (postrotate)
    logger.warning("between")  # still the open file, now named cairnqd.log.1
    assert not path.exists()
    reopen_logs()
    logger.warning("after")

    old, new = lines(rotated), lines(path)
    assert [line.rsplit(" ", 1)[1] for line in old] == ["before", "between"]
    assert new[0].endswith("INFO cairnqd.logs log file reopened")
    assert new[1].endswith("WARNING x after")
    assert len(new) == 2


def test_reopen_on_stderr_is_a_no_op(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(settings(), process_label="master")
    reopen_logs()
    logging.getLogger("x").warning("still here")
    assert capsys.readouterr().err.splitlines()[-1].endswith("still here")
    assert len(_ours()) == 1


def test_reopen_failure_keeps_the_old_file(tmp_path: Path) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "cairnqd.log"
    configure_logging(settings(file=str(path)), process_label="master")
    moved = tmp_path / "moved"
    directory.rename(moved)  # the directory is gone: nothing to reopen into
    reopen_logs()
    logging.getLogger("x").warning("not lost")
    text = (moved / "cairnqd.log").read_text()
    assert "cannot reopen the log file" in text
    assert text.splitlines()[-1].endswith("not lost")


def test_per_logger_levels(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd.log"
    loggers = {"t.chatty": "debug", "t.noisy": "WARNING"}
    configure_logging(settings(file=str(path), loggers=loggers), process_label="master")
    logging.getLogger("t.chatty").debug("chatty debug")
    logging.getLogger("t.chatty.child").debug("child inherits")
    logging.getLogger("t.noisy").info("noisy info")
    logging.getLogger("t.noisy").warning("noisy warning")
    logging.getLogger("t.other").debug("other debug")
    logging.getLogger("t.other").info("other info")
    assert [line.split(" ", 6)[6] for line in lines(path)] == [
        "chatty debug",
        "child inherits",
        "noisy warning",
        "other info",
    ]

    # Dropped from the settings: back to inheriting the root's level.
    configure_logging(settings(file=str(path)), process_label="master")
    assert logging.getLogger("t.noisy").level == logging.NOTSET
    logging.getLogger("t.noisy").info("noisy info again")
    logging.getLogger("t.chatty").debug("chatty debug again")
    assert lines(path)[-1].endswith("noisy info again")


def test_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd.log"
    for _ in range(3):
        configure_logging(settings(file=str(path)), process_label="master")
    assert len(_ours()) == 1
    logging.getLogger("x").warning("once")
    assert len(lines(path)) == 1

    configure_logging(settings(format="json"), process_label="master")  # back to stderr
    assert len(_ours()) == 1


def test_missing_directory_is_an_error_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "cairnqd.log"
    configure_logging(settings(file=str(path)), process_label="master")
    missing = tmp_path / "no" / "such" / "dir" / "cairnqd.log"
    with pytest.raises(LoggingSetupError, match=r"directory .*/no/such/dir does not exist"):
        configure_logging(settings(file=str(missing), level="DEBUG"), process_label="master")
    assert not missing.parent.exists()  # not created for the operator
    assert logging.getLogger().level == logging.INFO
    logging.getLogger("x").warning("old setup")
    assert lines(path)[-1].endswith("old setup")


def test_bad_level_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LoggingSetupError, match="unknown log level 'LOUD'"):
        configure_logging(settings(loggers={"x": "loud"}), process_label="master")


def test_settings_from_the_config_section(tmp_path: Path) -> None:
    section = LoggingConfig(
        level="debug", format="json", file=str(tmp_path / "a.log"), loggers={"psycopg": "warning"}
    )
    plain = logging_settings(section)
    assert plain == {
        "level": "DEBUG",
        "format": "json",
        "file": str(tmp_path / "a.log"),
        "loggers": {"psycopg": "WARNING"},
    }
    assert json.loads(json.dumps(plain)) == plain  # it travels in the boot message
    configure_logging(section, process_label="master")
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("psycopg").level == logging.WARNING
