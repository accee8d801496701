"""The dashboard's pieces on their own: escaping, request parsing, login cookies, config."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairnqd.config import ConfigError, load_config
from cairnqd.dashboard.actions import audit
from cairnqd.dashboard.auth import SESSION_S, Auth, Flash
from cairnqd.dashboard.markup import Markup, esc, join, render
from cairnqd.dashboard.params import (
    BadRequest,
    back_path,
    bulk_filter,
    decode_cursor,
    encode_cursor,
    local_path,
    parse_form,
    parse_query,
    parse_time,
    task_query,
)


@given(st.text())
def test_render_escapes_any_text(value: str) -> None:
    out = render('<p title="{v}">{v}</p>', v=value)
    attribute, text = out.removeprefix('<p title="').removesuffix("</p>").split('">', 1)
    for part in (attribute, text):
        assert not set(part) & set("<>\"'")
        assert html.unescape(part) == value


def test_markup_passes_and_text_is_escaped() -> None:
    assert render("<b>{x}</b>", x="<i>") == "<b>&lt;i&gt;</b>"
    assert render("<b>{x}</b>", x=Markup("<i>")) == "<b><i></b>"
    assert render("{x!r}", x=Markup("<i>")) == "&#x27;&lt;i&gt;&#x27;"
    assert render("{x:>5}", x="<") == "    &lt;"
    assert esc(None) == "" and esc(3) == "3"
    assert join(["<a>", Markup("<b>")], "<br>") == "&lt;a&gt;<br><b>"


@given(
    st.sampled_from(["created", "run_at", "finished"]),
    st.integers(-(2**63), 2**63 - 1),
    st.from_regex(r"task_[0-9A-Z]{26}", fullmatch=True),
)
def test_cursor_round_trip(sort: str, ms: int, task_id: str) -> None:
    assert decode_cursor(encode_cursor(sort, ms, task_id), sort) == (ms, task_id)


@given(st.text(max_size=80))
def test_any_cursor_text_is_a_cursor_or_a_bad_request(value: str) -> None:
    try:
        decode_cursor(value, "created")
    except BadRequest as exc:
        assert str(exc).startswith("cursor: ")


@given(st.dictionaries(st.sampled_from(sorted(["status", "sort", "from", "to", "limit"])),
                       st.text(max_size=30)))  # fmt: skip
def test_any_filter_value_parses_or_is_a_bad_request(values: dict[str, str]) -> None:
    try:
        task_query(values)
    except BadRequest as exc:
        assert str(exc)


def test_times() -> None:
    assert parse_time("1700000000000", "from") == 1_700_000_000_000
    assert parse_time("2026-12-01T08:30", "from") == parse_time("2026-12-01T08:30Z", "from")
    assert parse_time("2026-12-01T09:30+01:00", "to") == parse_time("2026-12-01T08:30Z", "to")
    with pytest.raises(BadRequest, match="to: 'soon' is not a time"):
        parse_time("soon", "to")


def test_query_parsing() -> None:
    allowed = frozenset({"a"})
    assert parse_query("a=1", allowed) == {"a": "1"}
    with pytest.raises(BadRequest, match="unknown query parameter 'b'"):
        parse_query("b=1", allowed)
    with pytest.raises(BadRequest, match="given 2 times"):
        parse_query("a=1&a=2", allowed)


def test_redirects_stay_on_the_dashboard() -> None:
    assert local_path("/tasks?x=1") == "/tasks?x=1"
    for page in ("/", "/tasks?status=failed&queue=a+b", "/task/task_01ABC", "/failed"):
        assert back_path(page) == page
    outside = (
        "//evil.example/",
        "https://evil.example/",
        "/\\evil",
        "/\t/evil.example",  # a browser drops the tab: //evil.example
        "/\n/evil.example",
        " //evil.example",
        "/%0a",  # not a page of ours
        "/nowhere",
        "javascript:alert(1)",
        "",
        None,
    )
    for value in outside:
        assert local_path(value) == "/", value
        assert back_path(value) is None, value


def test_forms_with_many_ids() -> None:
    form = parse_form("id=a&id=b&op=cancel", frozenset({"id", "op"}), multi="id")
    assert form == {"id": "a,b", "op": "cancel"}
    with pytest.raises(BadRequest, match="given 2 times"):
        parse_form("id=a&op=x&op=y", frozenset({"id", "op"}), multi="id")


def test_bulk_filters() -> None:
    op, where, said = bulk_filter({"op": "cancel", "queue": "work"})
    assert op == "cancel" and where.statuses == ("queued", "running") and where.queue == "work"
    assert said == "status queued/running, queue work"
    _, where, _ = bulk_filter({"op": "retry", "status": "failed", "from": "2026-01-01"})
    assert where.statuses == ("failed",) and where.created_after_ms == 1767225600000
    with pytest.raises(BadRequest, match="retry changes only failed and canceled tasks"):
        bulk_filter({"op": "retry", "status": "queued"})
    with pytest.raises(BadRequest, match="filter the list first"):
        bulk_filter({"op": "cancel"})
    with pytest.raises(BadRequest, match="op: must be cancel or retry"):
        bulk_filter({"op": "discard", "queue": "a"})


def test_sessions_and_csrf() -> None:
    auth = Auth("t" * 20)
    cookie = auth.new_cookie("alice", now=1000.0)
    session = auth.session(f"other=1; cairnqd_dashboard={cookie}", now=1001.0)
    assert session is not None and session.who == "alice"
    assert auth.csrf_ok(session, session.csrf) and not auth.csrf_ok(session, "")
    assert auth.session(f"cairnqd_dashboard={cookie}", now=1000.0 + SESSION_S + 1) is None
    assert Auth("u" * 20).session(f"cairnqd_dashboard={cookie}", now=1001.0) is None
    nonce, issued, _alice, role, mac = cookie.split(".")
    assert role == "operator" and session.may_act
    forged = f"{nonce}.{issued}.{'Ym9i'}.{role}.{mac}"  # "bob" in place of alice
    assert auth.session(f"cairnqd_dashboard={forged}", now=1001.0) is None
    promoted = f"{nonce}.{issued}.{_alice}.viewer.{mac}"
    assert auth.session(f"cairnqd_dashboard={promoted}", now=1001.0) is None
    assert not Auth(None).required and Auth(None).session(f"cairnqd_dashboard={cookie}") is None
    assert auth.token_ok("t" * 20) and not auth.token_ok("t" * 19)


def test_viewer_sessions() -> None:
    auth = Auth("t" * 20, "v" * 20)
    assert auth.role_of("t" * 20) == "operator" and auth.role_of("v" * 20) == "viewer"
    assert auth.role_of("x" * 20) is None
    cookie = auth.new_cookie("vera", now=1000.0, role="viewer")
    session = auth.session(f"cairnqd_dashboard={cookie}", now=1001.0)
    assert session is not None and session.role == "viewer" and not session.may_act
    # The role is signed: a viewer's cookie cannot claim to be an operator's.
    nonce, issued, name, _role, mac = cookie.split(".")
    claimed = f"{nonce}.{issued}.{name}.operator.{mac}"
    assert auth.session(f"cairnqd_dashboard={claimed}", now=1001.0) is None
    # Without a viewer token (taken out of the config), viewer sessions end.
    assert Auth("t" * 20).session(f"cairnqd_dashboard={cookie}", now=1001.0) is None
    assert Auth("t" * 20).role_of("v" * 20) is None


def test_flash_cookies_are_signed() -> None:
    auth = Auth("t" * 20)
    value = auth.flash_cookie(Flash("Canceled task <b>x</b>"))
    assert auth.flash(f"a=1; cairnqd_flash={value}") == Flash("Canceled task <b>x</b>")
    error = auth.flash(f"cairnqd_flash={auth.flash_cookie(Flash('no', ok=False))}")
    assert error == Flash("no", ok=False)
    kind, text, mac = value.split(".")
    assert auth.flash(f"cairnqd_flash=error.{text}.{mac}") is None
    assert auth.flash(f"cairnqd_flash={kind}.{text}x.{mac}") is None
    assert Auth("u" * 20).flash(f"cairnqd_flash={value}") is None
    assert auth.flash(None) is None and Auth(None).flash(f"cairnqd_flash={value}") is None


def _config(tmp_path: Path, dashboard: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: 1\n"
        f"database: {{path: {tmp_path / 't.db'}}}\n"
        "handlers: ['cairnqd.demo:registry']\n"
        "groups: {g: {queues: [a]}}\n"
        f"dashboard: {dashboard}\n"
    )
    return path


def test_config_defaults_off(tmp_path: Path) -> None:
    config = load_config(str(_config(tmp_path, "{}")))
    assert config.dashboard.listen is None and not config.dashboard.actions
    assert config.dashboard.token is None


def test_config_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-20ch\n")
    token.chmod(0o600)
    config = load_config(
        str(_config(tmp_path, f"{{listen: '0.0.0.0:0', token_file: {token}, actions: true}}"))
    )
    assert config.dashboard.token == "s3cret-token-of-20ch"
    assert "s3cret" not in repr(config.dashboard)
    assert "s3cret" not in str(config.redacted())
    token.write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_config(str(_config(tmp_path, f"{{token_file: {token}}}")))
    with pytest.raises(ConfigError, match=r"c.yaml:5:\d+: dashboard.token_file: cannot read"):
        load_config(str(_config(tmp_path, f"{{token_file: {tmp_path / 'none'}}}")))


def test_config_viewer_token_file(tmp_path: Path) -> None:
    token, viewer = tmp_path / "token", tmp_path / "viewer"
    token.write_text("s3cret-token-of-20ch\n")
    viewer.write_text("viewer-token-of-20ch\n")
    for path in (token, viewer):
        path.chmod(0o600)
    config = load_config(
        str(_config(tmp_path, f"{{token_file: {token}, viewer_token_file: {viewer}}}"))
    )
    assert config.dashboard.viewer_token == "viewer-token-of-20ch"
    assert "viewer-token" not in repr(config.dashboard)
    with pytest.raises(ConfigError, match=r"c.yaml:5:\d+: dashboard.viewer_token_file: needs"):
        load_config(str(_config(tmp_path, f"{{viewer_token_file: {viewer}}}")))
    with pytest.raises(ConfigError, match="holds the same token as token_file"):
        load_config(str(_config(tmp_path, f"{{token_file: {token}, viewer_token_file: {token}}}")))
    viewer.write_text("short\n")
    with pytest.raises(ConfigError, match=r"viewer_token_file: .* at least 16 characters"):
        load_config(str(_config(tmp_path, f"{{token_file: {token}, viewer_token_file: {viewer}}}")))


def test_config_refuses_exposure_without_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"beyond this host on 0\.0\.0\.0:8470 without a login"):
        load_config(str(_config(tmp_path, "{listen: '0.0.0.0:8470'}")))
    with pytest.raises(ConfigError, match=r"dashboard\.actions: needs dashboard\.token_file"):
        load_config(str(_config(tmp_path, "{listen: '127.0.0.1:8470', actions: true}")))


def test_a_huge_value_is_shown_in_part() -> None:
    from cairnqd.dashboard.pages import SHOWN_MAX, pretty

    text = pretty({"blob": "a" * (SHOWN_MAX * 2)})
    assert len(text) < SHOWN_MAX + 100
    assert text.endswith("characters; the rest is not shown)")
    assert pretty({"x": 1}) == '{\n  "x": 1\n}'


def test_next_fires_are_shown_in_utc(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from cairnqd.dashboard.pages import _next_fires

    path = _config(tmp_path, "{}")
    path.write_text(
        path.read_text()
        + "schedules:\n  nightly: {name: t, queue: a, cron: '0 3 * * *', "
        + "timezone: Europe/Berlin}\n"
    )
    config = load_config(str(path))
    fires = _next_fires(config.schedules["nightly"], None, datetime.now(UTC))
    assert len(fires) == 3
    assert {f[11:] for f in fires} <= {"01:00:00", "02:00:00"}  # 03:00 in Berlin


def test_login_throttle() -> None:
    from cairnqd.dashboard.auth import LoginThrottle

    throttle = LoginThrottle(failures=3, window_s=60)
    for i in range(3):
        assert not throttle.blocked("10.0.0.1", now=100 + i)
        throttle.failed("10.0.0.1", now=100 + i)
    assert throttle.blocked("10.0.0.1", now=103)
    assert not throttle.blocked("10.0.0.2", now=103)
    assert not throttle.blocked("10.0.0.1", now=161)


def test_an_overview_read_done_before_its_callback_is_added_does_not_deadlock(
    tmp_path: Path,
) -> None:
    """Seen in CI under load: the snapshot read finished before the page's thread added
    its done callback, so the callback ran at once in that thread, which still held the
    lock the callback takes; that page and every later one hung."""
    import threading

    from cairnqd.dashboard.data import DashboardData

    data = DashboardData(load_config(str(_config(tmp_path, "{}"))))
    data.start()
    try:
        submit = data._thread.submit

        def finished_first(coro: Any) -> Any:  # the race, made certain
            future = submit(coro)
            future.result(10)
            return future

        data._thread.submit = finished_first  # type: ignore[method-assign]
        results: list[Any] = []

        def page_answers() -> bool:
            """One page's overview, on a thread of its own (a deadlock would hang it)."""
            page = threading.Thread(target=lambda: results.append(data.overview()), daemon=True)
            page.start()
            page.join(10)
            return not page.is_alive()

        assert page_answers(), "the overview deadlocked on its own lock"
        assert results[0].problem is None and data.refreshes == 1
        data.invalidate()  # the next page waits for a fresh read: the same path again
        assert page_answers() and data.refreshes == 2
    finally:
        data.stop()


def test_an_action_shows_on_the_next_page_even_when_a_read_began_before_it(
    tmp_path: Path,
) -> None:
    """Seen in CI under load: a snapshot read that began before an action (a pause) and
    landed after it was taken as fresh, so the overview went on without the pause for
    up to five times a read's duration."""
    import asyncio
    import threading

    from cairnqd.dashboard.data import DashboardData
    from cairnqd.store.base import TaskStore
    from tests.support.waiting import wait_for

    data = DashboardData(load_config(str(_config(tmp_path, "{}"))))
    data.start()
    try:
        assert data.overview().problem is None  # the first snapshot: nothing paused
        read_done, gate = threading.Event(), threading.Event()
        submit = data._thread.submit

        def gated_once(coro: Any) -> Any:
            """The next read: it reads the database, then waits for `gate`."""
            data._thread.submit = submit  # type: ignore[method-assign]

            async def held() -> Any:
                result = await coro
                read_done.set()
                await asyncio.to_thread(gate.wait, 10)
                return result

            return submit(held())

        data._thread.submit = gated_once  # type: ignore[method-assign]
        data._taken_at = float("-inf")  # the refresh interval has passed
        assert data.overview().queues[0].pause is None  # stale, served while R1 reads
        assert read_done.wait(10)  # R1 has read: no pause yet

        async def pause(store: TaskStore) -> object:
            return await store.pauses.pause(["a"], paused_by="test", reason="deploy")

        data.write(pause, "pause a")  # the action, while R1 is still in flight
        gate.set()
        wait_for("the read begun before the pause to land", lambda: data._inflight is None, 10)
        (queue,) = data.overview().queues
        assert queue.pause is not None and queue.pause.reason == "deploy"
    finally:
        data.stop()


def test_an_audit_line_shortens_long_values(caplog: pytest.LogCaptureFixture) -> None:
    ids = ",".join(f"task_{i:026d}" for i in range(500))
    with caplog.at_level("INFO", logger="cairnqd.dashboard"):
        audit("tasks-selected", "alice", "10.0.0.7", {"id": ids, "op": "cancel", "csrf": "s"}, "ok")
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"({len(ids):,} characters)" in line and len(line) < 500
    assert "op='cancel'" in line and "csrf" not in line
