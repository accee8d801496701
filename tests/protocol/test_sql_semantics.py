"""Statement semantics on real databases: what each protocol operation does to rows.

SQLite spot checks cover claim order and filters, the claimable probe, fail's and
recover_leases' branches, lease ownership, release_worker, complete_many's per-row
ownership and cancel-wins, cancel/retry/purge and the read-only extensions; one Postgres
test walks the same branches on the other dialect.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.protocol.sqldb import PgDatabases, pg_ours
from tests.protocol.sqlrun import HANDLER_ERROR, LEASE_EXPIRED, Lite, Pg, now_ms


@pytest.fixture
def lite(tmp_path: Path) -> Lite:
    return Lite(tmp_path / "semantics.db")


def test_claim_order_and_filters(lite: Lite) -> None:
    t0 = 1_000_000
    # (id, priority, delay): claim order is priority desc, run_at asc, id asc.
    for tid, priority, delay in [
        ("task_e", 0, 5),
        ("task_d", 0, 0),
        ("task_c", 0, 0),
        ("task_b", 5, 10),
        ("task_a", 1, 0),
        ("task_late", 9, 10_000),
    ]:
        lite.submit(tid, now=t0, priority=priority, delay_ms=delay)
    lite.submit("task_other", now=t0, queue="elsewhere")
    lite.submit("task_named", now=t0, name="special", priority=-1)
    order = []
    for op, extra in [
        ("claim", {"queues": ["q"], "names": None}),
        ("claim_one_queue", {"queue": "q", "names": None}),
        ("claim_one_name", {"queues": ["q", "x"], "name": "n"}),
        ("claim_one_queue_one_name", {"queue": "q", "name": "n"}),
        ("claim", {"queues": ["q"], "names": ["n"]}),
    ]:
        got = lite.run(op, now=t0 + 100, worker_id="w", limit=1, **extra)
        assert len(got) == 1
        row = got[0]
        assert (row["status"], row["attempt"], row["worker_id"]) == ("running", 1, "w")
        assert row["lease_until_ms"] == t0 + 100 + 30_000
        order.append(row["id"])
    assert order == ["task_b", "task_a", "task_c", "task_d", "task_e"]
    # Not yet due, other names, other queues and an empty name list are never claimed.
    assert lite.claim_all(now=t0 + 100, names=[]) == []
    assert lite.claim_all(now=t0 + 100, names=["n"]) == []
    assert lite.claim_all(now=t0 + 100) == ["task_named"]
    assert lite.claim_all(now=t0 + 20_000) == ["task_late"]
    assert lite.row("task_other")["status"] == "queued"


def test_claimable_probe(lite: Lite) -> None:
    t0 = 2_000_000
    lite.submit("task_x", now=t0, queue="q", name="a", delay_ms=1000)

    def probe(now: int, **kw: Any) -> int:
        kw.setdefault("queues", ["q"])
        kw.setdefault("names", None)
        return lite.run("claimable_probe", now=now, **kw)[0]["has_work"]

    assert probe(t0) == 0  # not due yet
    assert probe(t0 + 1000) == 1
    assert probe(t0 + 1000, names=["b"]) == 0
    assert probe(t0 + 1000, queues=["other"]) == 0
    lite.run("claim", now=t0 + 1000, queues=["q"], names=None, worker_id="w", limit=1)
    assert probe(t0 + 1000) == 0
    # An expired lease anywhere counts, whatever the queue or name filter.
    assert probe(t0 + 1000 + 30_000, queues=["other"], names=["zzz"]) == 1


def _running(lite: Lite, tid: str, *, now: int, max_attempts: int = 3, attempts: int = 1) -> None:
    """Submit `tid` (named after itself) and claim it `attempts` times as w1."""
    lite.submit(tid, now=now, name=tid, max_attempts=max_attempts)
    for i in range(attempts):
        if i:  # put it back for another attempt
            lite.conn.execute(
                "update cairnq_tasks set status = 'queued', lease_until_ms = null where id = ?",
                (tid,),
            )
        claimed = lite.run(
            "claim_one_queue_one_name", now=now, queue="q", name=tid, worker_id="w1", limit=1
        )
        assert [r["id"] for r in claimed] == [tid]
    lite.run("progress", now=now, id=tid, worker_id="w1", progress=0.4, message="working")


def test_fail_branches(lite: Lite) -> None:
    t0 = 3_000_000
    _running(lite, "task_retry", now=t0)
    _running(lite, "task_final", now=t0, max_attempts=1)
    _running(lite, "task_noretry", now=t0)
    _running(lite, "task_cancel", now=t0)
    lite.run("cancel", now=t0 + 1, id="task_cancel")
    t1 = t0 + 10

    def fail(tid: str, retryable: int) -> dict[str, Any]:
        rows = lite.run(
            "fail",
            now=t1,
            id=tid,
            worker_id="w1",
            error=HANDLER_ERROR,
            retryable=retryable,
            delay_ms=500,
        )
        assert len(rows) == 1, tid
        return rows[0]

    requeued = fail("task_retry", 1)
    assert requeued["status"] == "queued"
    assert requeued["worker_id"] is None and requeued["lease_until_ms"] is None
    assert requeued["run_at_ms"] == t1 + 500 and requeued["completed_at_ms"] is None
    assert requeued["progress"] is None and requeued["message"] is None
    assert json.loads(requeued["error"])["code"] == "handler_error"
    assert requeued["attempt"] == 1

    for tid, retryable in (("task_final", 1), ("task_noretry", 0)):
        failed = fail(tid, retryable)
        assert failed["status"] == "failed", tid
        assert failed["worker_id"] == "w1" and failed["lease_until_ms"] is None
        assert failed["completed_at_ms"] == t1 and failed["error"] is not None
        assert failed["progress"] == 0.4 and failed["message"] == "working"

    canceled = fail("task_cancel", 1)
    assert canceled["status"] == "canceled" and canceled["completed_at_ms"] == t1
    assert canceled["worker_id"] == "w1" and canceled["error"] is not None
    assert canceled["lease_until_ms"] is None

    # A settled task is no longer owned: a second settlement finds nothing.
    assert (
        lite.run(
            "fail",
            now=t1,
            id="task_final",
            worker_id="w1",
            error=HANDLER_ERROR,
            retryable=1,
            delay_ms=0,
        )
        == []
    )


def test_owned_writes_need_a_live_lease(lite: Lite) -> None:
    t0 = 4_000_000
    _running(lite, "task_own", now=t0)
    lease_end = t0 + 30_000
    assert lite.run("heartbeat", now=t0 + 1, id="task_own", worker_id="w2") == []
    assert lite.run("heartbeat", now=lease_end, id="task_own", worker_id="w1") == []
    # Named, the attempt must be the row's (cairnqd's worker names its own).
    for op in ("progress", "complete", "succeed", "fail"):
        other = {"progress": 0.9, "message": None, "result": "1", "error": "{}", "retryable": 1}
        assert lite.run(op, now=t0 + 50, id="task_own", worker_id="w1", attempt=2, **other) == []
    beat = lite.run("heartbeat", now=t0 + 100, id="task_own", worker_id="w1")
    assert beat[0]["lease_until_ms"] == t0 + 100 + 30_000
    both = lite.run("heartbeat_batch", now=t0 + 200, ids=["task_own", "nope"], worker_id="w1")
    assert both == [{"id": "task_own", "attempt": 1, "cancel_requested_at_ms": None}]
    kept = lite.run(
        "progress",
        now=t0 + 300,
        id="task_own",
        worker_id="w1",
        progress=None,
        message="only the label",
    )
    assert (kept[0]["progress"], kept[0]["message"]) == (0.4, "only the label")
    done = lite.run("complete", now=t0 + 400, id="task_own", worker_id="w1", result='"fine"')
    assert (done[0]["status"], done[0]["result"], done[0]["progress"]) == (
        "succeeded",
        '"fine"',
        1.0,
    )
    assert done[0]["lease_until_ms"] is None and done[0]["completed_at_ms"] == t0 + 400


def test_renew_leases_renews_the_attempt_held_and_never_moves_a_lease_earlier(lite: Lite) -> None:
    t0 = 4_500_000
    for tid in ("task_a", "task_other", "task_expired"):
        _running(lite, tid, now=t0)
    _running(lite, "task_b", now=t0, attempts=2)
    lite.conn.execute("update cairnq_tasks set worker_id = 'w2' where id = 'task_other'")
    lite.conn.execute("update cairnq_tasks set lease_until_ms = ? where id = 'task_expired'", (t0,))

    def renew(now: int, *held: tuple[str, int]) -> list[tuple[str, int]]:
        items = json.dumps([{"id": tid, "a": attempt} for tid, attempt in held])
        got = lite.run("renew_leases", extension=True, now=now, worker_id="w1", items=items)
        return sorted((r["id"], r["attempt"]) for r in got)

    held = [("task_a", 1), ("task_b", 1), ("task_other", 1), ("task_expired", 1), ("nope", 1)]
    # task_b is at attempt 2: a renewal sent for attempt 1 leaves it alone.
    assert renew(t0 + 100, *held) == [("task_a", 1)]
    assert lite.row("task_a")["lease_until_ms"] == t0 + 100 + 30_000
    assert lite.row("task_b")["lease_until_ms"] == t0 + 30_000
    assert renew(t0 + 200, ("task_b", 2)) == [("task_b", 2)]
    assert lite.row("task_b")["lease_until_ms"] == t0 + 200 + 30_000
    # A renewal bound earlier, applied after the later one: still renewed, not shortened.
    assert renew(t0 + 50, ("task_a", 1)) == [("task_a", 1)]
    assert lite.row("task_a")["lease_until_ms"] == t0 + 100 + 30_000


def test_recover_leases_branches(lite: Lite) -> None:
    t0 = 5_000_000
    _running(lite, "task_again", now=t0)
    _running(lite, "task_spent", now=t0, max_attempts=2, attempts=2)
    _running(lite, "task_cxl", now=t0, max_attempts=1)
    lite.run("cancel", now=t0 + 5, id="task_cxl")
    _running(lite, "task_fresh", now=t0 + 20_000)
    expire = t0 + 30_000
    got = lite.run("recover_leases", now=expire, error=LEASE_EXPIRED)
    assert sorted((r["id"], r["status"]) for r in got) == [
        ("task_again", "queued"),
        ("task_cxl", "canceled"),
        ("task_spent", "failed"),
    ]
    again, spent, cxl = lite.row("task_again"), lite.row("task_spent"), lite.row("task_cxl")
    assert again["worker_id"] is None and again["run_at_ms"] == expire
    assert again["progress"] is None and again["message"] is None
    assert again["completed_at_ms"] is None and again["error"] is None
    assert again["attempt"] == 1
    assert spent["attempt"] == 2 and json.loads(spent["error"])["code"] == "lease_expired"
    assert spent["completed_at_ms"] == expire and spent["worker_id"] == "w1"
    assert cxl["error"] is None and cxl["completed_at_ms"] == expire
    for row in (again, spent, cxl):
        assert row["lease_until_ms"] is None and row["updated_at_ms"] == expire
    assert lite.row("task_fresh")["status"] == "running"
    assert lite.run("recover_leases", now=expire, error=LEASE_EXPIRED) == []


def test_release_worker(lite: Lite) -> None:
    t0 = 6_000_000
    _running(lite, "task_mine", now=t0)
    lite.submit("task_theirs", now=t0)
    lite.run("claim", now=t0, queues=["q"], names=None, worker_id="w2", limit=1)
    got = lite.run(
        "release_worker", extension=True, now=t0 + 1, worker_id="w1", error=LEASE_EXPIRED
    )
    assert got == [
        {"id": "task_mine", "queue": "q", "name": "task_mine", "status": "queued", "attempt": 1}
    ]
    assert lite.row("task_theirs")["status"] == "running"


def test_complete_many(lite: Lite) -> None:
    t0 = 7_000_000
    values: dict[str, Any] = {
        "task_str": "a string",
        "task_num": 42,
        "task_real": 2.5,
        "task_true": True,
        "task_false": False,
        "task_none": None,
        "task_obj": {"k": [1, "two", None]},
    }
    for tid in [*values, "task_cxl", "task_other", "task_expired"]:
        _running(lite, tid, now=t0)
    lite.run("cancel", now=t0 + 1, id="task_cxl")
    lite.conn.execute("update cairnq_tasks set worker_id = 'w2' where id = 'task_other'")
    lite.conn.execute("update cairnq_tasks set lease_until_ms = ? where id = 'task_expired'", (t0,))
    # The store sends each result already encoded as JSON text ("r"), None for SQL NULL.
    encoded = {tid: None if v is None else json.dumps(v) for tid, v in values.items()}
    items = [{"id": tid, "r": text} for tid, text in encoded.items()]
    items += [{"id": tid, "r": '{"x": 1}'} for tid in ("task_cxl", "task_other", "task_expired")]
    items.append({"id": "task_missing", "r": None})
    got = lite.run(
        "complete_many", extension=True, now=t0 + 10, worker_id="w1", items=json.dumps(items)
    )
    assert sorted((r["id"], r["status"]) for r in got) == sorted(
        [(tid, "succeeded") for tid in values] + [("task_cxl", "canceled")]
    )
    for tid in values:
        row = lite.row(tid)
        assert row["result"] == encoded[tid], tid  # the store's bytes, untouched
        assert (row["progress"], row["lease_until_ms"], row["completed_at_ms"]) == (
            1.0,
            None,
            t0 + 10,
        )
    cxl = lite.row("task_cxl")
    assert (cxl["result"], cxl["progress"], cxl["lease_until_ms"]) == (None, 0.4, None)
    for tid in ("task_other", "task_expired"):
        assert lite.row(tid)["status"] == "running"


def test_cancel_retry_purge(lite: Lite) -> None:
    t0 = 8_000_000
    lite.submit("task_q", now=t0)
    _running(lite, "task_r", now=t0)
    queued = lite.run("cancel", now=t0 + 1, id="task_q")[0]
    assert (queued["status"], queued["completed_at_ms"]) == ("canceled", t0 + 1)
    running = lite.run("cancel", now=t0 + 2, id="task_r")[0]
    assert (running["status"], running["cancel_requested_at_ms"]) == ("running", t0 + 2)
    assert lite.run("cancel", now=t0 + 3, id="task_r")[0]["cancel_requested_at_ms"] == t0 + 3
    assert lite.run("cancel", now=t0 + 4, id="task_q") == []
    lite.run("complete", now=t0 + 5, id="task_r", worker_id="w1", result='{"kept": 1}')
    assert lite.row("task_r")["status"] == "canceled"
    assert lite.run("retry", now=t0 + 6, id="task_r", reset_attempt=1)[0]["attempt"] == 0
    retried = lite.row("task_r")
    assert retried["status"] == "queued" and retried["cancel_requested_at_ms"] is None
    assert retried["run_at_ms"] == t0 + 6 and retried["completed_at_ms"] is None
    assert lite.run("retry", now=t0 + 7, id="task_r", reset_attempt=0) == []
    lite.run("upsert_key", now=t0, key="kq", task_id="task_q")
    # Strict cutoff: finished at t0+1 survives a purge at t0+1 with older_than 0.
    purge = {"queue": None, "status": None, "name": None, "limit": 10}
    assert lite.run("purge", now=t0 + 1, **purge) == []
    assert lite.run("purge", now=t0 + 2, **{**purge, "status": "failed"}) == []
    assert lite.run("purge", now=t0 + 2, **{**purge, "queue": "q"}) == [{"id": "task_q"}]
    assert lite.run("get_key", key="kq") == []  # the key row cascaded


def test_depth_stats_and_extension_reads(lite: Lite) -> None:
    t0 = 9_000_000
    for i in range(4):
        lite.submit(f"task_{i}", now=t0 + i, delay_ms=100 * i)
    lite.submit("task_z", now=t0, queue="z")
    assert lite.run("queue_depth", queue="q", max_depth=10)[0]["headroom"] == 6
    assert lite.run("queue_depth", queue="q", max_depth=3)[0]["headroom"] == 0
    stats = lite.run("stats", queue=None)
    assert sorted((r["queue"], r["status"], r["n"]) for r in stats) == [
        ("q", "queued", 4),
        ("z", "queued", 1),
    ]
    assert lite.run("stats", queue="z") == [{"queue": "z", "status": "queued", "n": 1}]
    oldest = lite.run("oldest_queued", extension=True, now=t0 + 150)
    assert sorted((r["queue"], r["age_ms"]) for r in oldest) == [("q", 150), ("z", 150)]
    _running(lite, "task_lease", now=t0)
    expired = lite.run("leases_expired", extension=True, now=t0 + 30_000)
    assert expired == [{"queue": "q", "n": 1}]
    assert lite.run("leases_expired", extension=True, now=t0 + 29_999) == []


# -- Postgres ------------------------------------------------------------------------


def test_postgres_semantics(pg: PgDatabases) -> None:
    with pg.connect(pg_ours(pg, "semantics"), autocommit=True) as conn:
        db = Pg(conn)
        past = now_ms() - 60_000
        for tid, priority, offset in [
            ("task_e", 0, 5),
            ("task_d", 0, 0),
            ("task_c", 0, 0),
            ("task_b", 5, 10),
            ("task_a", 1, 0),
        ]:
            db.submit(tid, run_at=past + offset, priority=priority)
        db.submit("task_late", run_at=now_ms() + 600_000, priority=9)
        order = []
        for op, extra in [
            ("claim", {"queues": ["q"], "names": None}),
            ("claim_one_queue", {"queue": "q", "names": None}),
            ("claim_one_name", {"queues": ["q", "x"], "name": "n"}),
            ("claim_one_queue_one_name", {"queue": "q", "name": "n"}),
            ("claim", {"queues": ["q"], "names": ["n"]}),
        ]:
            (row,) = db.run(op, worker_id="w", limit=1, lease_ms=30_000, **extra)
            assert (row["status"], row["attempt"], row["worker_id"]) == ("running", 1, "w")
            assert row["lease_until_ms"] - row["updated_at_ms"] == 30_000
            order.append(row["id"])
        assert order == ["task_b", "task_a", "task_c", "task_d", "task_e"]
        assert db.run("claim", queues=["q"], names=[], worker_id="w", limit=9, lease_ms=1) == []
        assert db.run("claim", queues=["q"], names=None, worker_id="w", limit=9, lease_ms=1) == []
        probe = db.run("claimable_probe", queues=["q"], names=None)
        assert probe == [{"has_work": False}]

        # fail: requeue, final failure, cancel wins.
        for tid, attempts in (("task_f1", 3), ("task_f2", 1), ("task_f3", 3)):
            db.submit(tid, run_at=past, name=tid, max_attempts=attempts)
            db.claim(tid)
        db.run("cancel", id="task_f3")
        outcome = {}
        for tid in ("task_f1", "task_f2", "task_f3"):
            (row,) = db.run(
                "fail", id=tid, worker_id="w1", error=HANDLER_ERROR, retryable=True, delay_ms=5_000
            )
            outcome[tid] = row
            assert row["lease_until_ms"] is None and row["error"]["code"] == "handler_error"
        assert outcome["task_f1"]["status"] == "queued" and outcome["task_f1"]["worker_id"] is None
        assert outcome["task_f1"]["run_at_ms"] - outcome["task_f1"]["updated_at_ms"] == 5_000
        assert outcome["task_f2"]["status"] == "failed" and outcome["task_f2"]["worker_id"] == "w1"
        assert outcome["task_f3"]["status"] == "canceled"
        assert db.run("retry", id="task_f2", reset_attempt=True)[0]["attempt"] == 0

        # recover_leases: requeue, lease-expired failure, cancel wins.
        for tid, attempts in (("task_r1", 3), ("task_r2", 1), ("task_r3", 3)):
            db.submit(tid, run_at=past, name=tid, max_attempts=attempts)
            db.claim(tid)
        db.run("cancel", id="task_r3")
        conn.execute(
            "update cairnq_tasks set lease_until_ms = %s where id like 'task_r%%'", (past,)
        )
        got = db.run("recover_leases", error=LEASE_EXPIRED)
        assert sorted((r["id"], r["status"]) for r in got) == [
            ("task_r1", "queued"),
            ("task_r2", "failed"),
            ("task_r3", "canceled"),
        ]
        assert db.row("task_r2")["error"]["code"] == "lease_expired"
        assert db.row("task_r3")["error"] is None
        assert db.row("task_r1")["worker_id"] is None

        # complete_many: per-row ownership, cancel wins, NULL results.
        for tid in ("task_m1", "task_m2", "task_m3", "task_m4"):
            db.submit(tid, run_at=past, name=tid)
            db.claim(tid)
        db.run("cancel", id="task_m3")
        conn.execute("update cairnq_tasks set worker_id = 'w2' where id = 'task_m4'")
        got = db.run(
            "complete_many",
            extension=True,
            worker_id="w1",
            items=json.dumps(
                [
                    {"id": "task_m1", "r": '"text"'},
                    {"id": "task_m2", "r": None},
                    {"id": "task_m3", "r": '{"x": 1}'},
                    {"id": "task_m4", "r": "1"},
                    {"id": "task_nope", "r": None},
                ]
            ),
        )
        assert sorted((r["id"], r["status"]) for r in got) == [
            ("task_m1", "succeeded"),
            ("task_m2", "succeeded"),
            ("task_m3", "canceled"),
        ]
        assert db.row("task_m1")["result"] == "text"
        assert db.row("task_m2")["result"] is None and db.row("task_m3")["result"] is None
        assert db.row("task_m4")["status"] == "running"

        # release_worker frees only that worker's running tasks.
        got = db.run("release_worker", extension=True, worker_id="w2", error=LEASE_EXPIRED)
        assert got == [
            {"id": "task_m4", "queue": "q", "name": "task_m4", "status": "queued", "attempt": 1}
        ]
        beat = db.run("heartbeat_batch", ids=["task_m4"], worker_id="w2", lease_ms=1000)
        assert beat == []
