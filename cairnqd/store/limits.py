"""The limited claim: starting only tasks whose limits have room (docs/limits.md).

A store given limits (`TaskStore.use_limits`) claims through `LimitedClaims.draw`
instead of the protocol's claim statement. In the claim's transaction it reads the
next claimable tasks in claim order, and for each task a limit covers takes a slot of
every budget the task needs (`cairnqd_limit_slots`: one row per slot, per partition
and kind); a task that got them all is claimed by id, one that did not is stepped
over, and its budget is left out of the rest of the draw, so a full limit never holds
up the work behind it.

The count is airtight because a slot is a row: taking one locks it, and a slot is
free or taken by its own columns alone (never by what a snapshot of another table
says), so two claims racing for the last slot cannot both win. A concurrency slot is
given back by whichever claim next finds its budget full: it frees the slots whose
task no longer runs under the claim that took them, however that claim ended (settled
by us, recovered by any worker, handed back, purged). A rate slot frees itself when
its start leaves the window.

SQLite keeps no concurrency slots (`LimitedClaims.counts_running`): a claim there
holds the database's one write lock from its first read to its commit, so a budget's
use is simply counted, the covered tasks that run now (limit_running.sql), and nothing
can start between the count and the claim. That spares a slot write on every claim and
every settlement, and room comes back the moment a task stops running, whoever ran it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cairnqd._protocol import Dialect, Statement, composed
from cairnqd.limits import NO_PARTITION, Limit, Override, like_pattern, may_cover, overridden
from cairnqd.store.arguments import Params
from cairnqd.store.executor import Row, Session
from cairnqd.store.statement_params import claim_variant

log = logging.getLogger("cairnqd.limits")

#: How often a worker reads the operator's overrides (within a claim's transaction).
OVERRIDES_EVERY_S = 0.5
#: How often a claim frees a budget's stale concurrency slots, at most.
RECLAIM_EVERY_S = 0.25
#: A taken concurrency slot's until_ms: later than any clock.
HELD = 1 << 62
#: How many candidates a draw reads per pass, at least and at most.
_PASS_MIN, _PASS_MAX = 32, 512
#: Passes a draw makes over the queue before it settles for what it found.
_PASSES = 4
#: How long a worker that found a concurrency budget full waits at most before it
#: looks again (room freed by another process is not announced).
ROOM_POLL_MS = 250
#: Budgets whose slots this process made already (ensure once, not per claim).
_ENSURED_MAX = 10_000
#: How often a worker renews its note that it counts a limit (SQLite: the
#: cairnqd_limit_workers row that tells its claims from those that pass the limit by).
WORKER_NOTE_EVERY_S = 600.0


@dataclasses.dataclass(frozen=True)
class RoomFlight:
    """A limited draw sent in one flight with the rest of its claim's transaction
    (`LimitedClaims.flight`): its statement, up to `want` tasks, and its budget (limit
    name, partition)."""

    statement: Statement
    params: Params
    want: int
    budget: tuple[str, str]


class LimitedClaims:
    """The limits one store enforces and the state of its claims' draws."""

    def __init__(self, dialect: Dialect, limits: Sequence[Limit]) -> None:
        self.dialect = dialect
        #: The limits as configured, and as kept: with the operator's overrides.
        self.configured = tuple(limits)
        self.limits = self.configured
        self._overrides: dict[str, Override] = {}
        self._overrides_read_at = -math.inf
        # Each distinct partition field, in order: its column in the draw's rows.
        paths = dict.fromkeys(limit.partition_by for limit in self.limits if limit.partition_by)
        self._columns = {path: f"part_{i}" for i, path in enumerate(paths)}
        self._ensured: set[tuple[str, str, str, int]] = set()
        #: When each budget's stale slots were last freed (monotonic seconds).
        self._reclaimed: dict[tuple[str, str], float] = {}
        self._statements: dict[tuple[object, ...], Statement] = {}
        #: When the last draw that came up short could find room again (monotonic
        #: seconds); None when nothing it stepped over waits on a limit.
        self.room_at: float | None = None
        #: Whether the last draw came up short for a full concurrency budget, which
        #: any task's settling may free (a Postgres store then listens for those).
        self.waiting_for_room = False
        #: Whether concurrency is counted from the tasks that run, inside the claim's
        #: write lock (SQLite), rather than kept in slot rows a claim takes and a
        #: settlement gives back (Postgres, where claims run side by side).
        self.counts_running = dialect == "sqlite"
        #: Within one draw (`counts_running`): per budget (limit, partition), the
        #: covered tasks running and those the draw took room for; and the limits
        #: whose running tasks it has counted.
        self._running: dict[tuple[str, str], int] = {}
        self._counted: set[str] = set()
        #: When this process last noted each (limit, worker) in cairnqd_limit_workers,
        #: and the notes the draw under way wrote, kept once its transaction commits
        #: (`committed`): a rolled-back note is written again by the next draw.
        self._noted: dict[tuple[str, str], float] = {}
        self._noting: set[tuple[str, str]] = set()
        self._worker_id = ""

    # -- the draw ------------------------------------------------------------------------

    async def draw(
        self,
        session: Session,
        queues: Sequence[str],
        names: Sequence[str] | None,
        limit: int,
        base: Params,
        ready: int | None = None,
    ) -> list[Row]:
        """Claim up to `limit` tasks that have room, in claim order; their rows. Of the
        tasks a rate covers, at most `ready` (None: `limit`): the worker's free slots.
        Such a task is never claimed ahead to wait in the worker (prefetch): it would
        start later than its start was counted, and starts bunched up that way could
        pass the rate. A task under concurrency limits alone may be claimed ahead,
        holding its room while it waits (auto prefetch claims only what starts within
        about 50 ms)."""
        worker_id = self._worker_id = str(base["worker_id"])
        await self._read_overrides(session)
        self.room_at = None
        self.waiting_for_room = False
        self._running.clear()
        self._counted.clear()
        self._noting.clear()
        one = self._one_budget(queues)
        if one is not None and self.dialect == "postgres":
            return await self._draw_one_budget(session, one, queues, names, limit, base, ready)
        if one is not None and one[1] == "concurrency" and self.counts_running:
            return await self._draw_counted(session, one[0], one[2], queues, names, limit, base)
        claimed: list[Row] = []
        blocked: dict[tuple[str, str], Limit] = {}
        opens: list[float] = []
        room_for = limit if ready is None else ready
        # Whether rate-limited tasks were passed over for want of free slots: later
        # passes then look past every one of them, for the work behind.
        held_back = False
        for _ in range(_PASSES):
            want = limit - len(claimed)
            open_queues = self._open_queues(queues, blocked, held_back)
            if want <= 0 or not open_queues:
                break
            # Before limited tasks are passed over, the rows past the free slots' worth
            # are mostly limited ones this claim will not take: read fewer.
            expected = want if held_back else min(want, room_for + _PASS_MIN)
            size = min(max(2 * expected, _PASS_MIN), _PASS_MAX)
            was_held_back = held_back
            stmt, params = self._candidates(blocked, held_back, open_queues, names, size)
            rows = await session.fetch_statement(stmt, params)
            chosen: list[str] = []
            # (task, attempt) of each claim this transaction makes (`chosen`).
            making: list[dict[str, Any]] = []
            at = 0
            retry: list[tuple[Row, list[tuple[Limit, str]]]] = []
            while len(chosen) < want and (at < len(rows) or retry):
                # The tasks a budget's room went to in vain first (they come earlier in
                # claim order), then the next ones up to what is still wanted, each
                # stepping over the budgets found full and, past the free slots, over
                # every limited task.
                batch: list[tuple[Row, list[tuple[Limit, str]]]] = []
                asked = 0
                for row, needs in retry:
                    if any(k in blocked for k in _keys(needs)):
                        continue
                    if _paced(needs):
                        if asked >= room_for:
                            continue
                        asked += 1
                    batch.append((row, needs))
                while at < len(rows) and len(batch) < want - len(chosen):
                    row, at = rows[at], at + 1
                    needs = self._needs(row)
                    if any(key in blocked for key in _keys(needs)):
                        continue
                    if _paced(needs):
                        if asked >= room_for:
                            # No free slot left for a rate-limited task: the next pass
                            # leaves them all out in its statement, cheaper than
                            # stepping over them here.
                            held_back = True
                            at = len(rows)
                            break
                        asked += 1
                    batch.append((row, needs))
                if not batch:
                    break
                got, full, retry = await self._grant(session, batch, worker_id, making)
                chosen += got
                won = [(row, needs) for row, needs in batch if str(row["id"]) in got]
                making += [_claim_of(row) for row, _ in won]
                room_for -= sum(1 for _, needs in won if _paced(needs))
                for (name, part), (lim, opening) in full.items():
                    blocked[(name, part)] = lim
                    if opening is not None:
                        opens.append(opening)
            if chosen:
                # The lease from the clock the slots were taken by (`now_ms`).
                now_ms = rows[0]["now_ms"]
                claimed += await session.fetch(
                    "extensions/limit_claim_ids", {**base, "ids": chosen, "now_ms": now_ms}
                )
            if len(rows) < size and held_back == was_held_back:
                break  # nothing more behind these
        if blocked and len(claimed) < limit:
            now = time.monotonic()
            self.waiting_for_room = len(opens) < len(blocked)
            waits = [*opens] if not self.waiting_for_room else [*opens, ROOM_POLL_MS]
            self.room_at = now + max(1.0, min(waits)) / 1000
        return claimed

    def _one_budget(self, queues: Sequence[str]) -> tuple[Limit, str, int] | None:
        """The one budget every task of `queues` needs, when that is so: one limit
        covers them all, whole (no names, no partitions), with one kind of room, and no
        other limit covers any of them. Such a claim takes its room in one statement."""
        covering = [lim for lim in self.limits if not lim.queues or set(queues) & set(lim.queues)]
        if len(covering) != 1:
            return None
        limit = covering[0]
        if not _whole_queues(limit) or len(limit.budgets) != 1:
            return None
        if not set(queues) <= set(limit.queues):
            return None
        kind, capacity = limit.budgets[0]
        return limit, kind, capacity

    def cover(self, queues: Sequence[str]) -> bool:
        """Whether a limit may cover a task of `queues` (`may_cover`). A claim of queues
        that none covers is an unlimited claim: the protocol's statement, as without
        limits."""
        return may_cover(self.limits, queues)

    def flight(
        self,
        queues: Sequence[str],
        names: Sequence[str] | None,
        limit: int,
        base: Params,
    ) -> RoomFlight | None:
        """The draw as one statement to send with the rest of its transaction, when
        nothing in it has to be read first: Postgres, one budget of concurrency
        (`_one_budget`) whose rows this process made, the operator's overrides read
        lately. None otherwise: `draw` then runs as usual."""
        if self.dialect != "postgres" or limit <= 0:
            return None
        if time.monotonic() - self._overrides_read_at >= OVERRIDES_EVERY_S:
            return None
        one = self._one_budget(queues)
        if one is None or one[1] != "concurrency":
            return None
        slot = _budget_slot(one, base)
        if _ensured_key(slot) not in self._ensured:
            return None
        stmt, params = self._room_statement(slot, one[0], queues, names, limit, base)
        return RoomFlight(stmt, params, limit, (one[0].name, NO_PARTITION))

    def landed(self, flight: RoomFlight, rows: Sequence[Row]) -> tuple[list[Row], bool]:
        """What a flight's draw claimed, and whether to draw again in a transaction of
        its own: the budget was full and its stale room is due to be looked for (as
        `_draw_one_budget` would have, in its transaction). Full and not due, it says
        when to look again (`room_at`)."""
        self.room_at = None
        self.waiting_for_room = False
        claimed, room, _ = _room_rows(rows)
        if len(claimed) >= flight.want or room > len(claimed):
            return claimed, False
        if self._reclaim_due(flight.budget):
            return claimed, True
        self.waiting_for_room = True
        self.room_at = time.monotonic() + ROOM_POLL_MS / 1000
        return claimed, False

    async def _draw_one_budget(
        self,
        session: Session,
        budget: tuple[Limit, str, int],
        queues: Sequence[str],
        names: Sequence[str] | None,
        limit: int,
        base: Params,
        ready: int | None,
    ) -> list[Row]:
        """`draw` where one budget decides (`_one_budget`): slots and tasks taken
        together by protocol/extensions/sql/postgres/limit_claim_room.sql. Short of
        room, it frees the budget's stale slots as the general draw does and tries
        once more; still short, it says when to look again (`room_at`)."""
        lim, kind, _ = budget
        want = limit if kind == "concurrency" or ready is None else min(limit, ready)
        if want <= 0:
            return []
        slot = _budget_slot(budget, base)
        await self._ensure(session, slot)
        claimed, room, now_ms = await self._claim_room(
            session, slot, lim, queues, names, want, base
        )
        if len(claimed) >= want or room > len(claimed):
            return claimed  # all it wanted, or all the work there was
        if await self._reclaim(session, slot, "[]"):
            more, room, now_ms = await self._claim_room(
                session, slot, lim, queues, names, want - len(claimed), base
            )
            claimed += more
            if len(claimed) >= want or room > len(more):
                return claimed
        if kind == "rate":
            opening = await self._opens_in(session, {**slot, "now_ms": now_ms})
        else:
            opening, self.waiting_for_room = ROOM_POLL_MS, True
        self.room_at = time.monotonic() + max(1.0, opening) / 1000
        return claimed

    async def _draw_counted(
        self,
        session: Session,
        limit: Limit,
        capacity: int,
        queues: Sequence[str],
        names: Sequence[str] | None,
        want: int,
        base: Params,
    ) -> list[Row]:
        """`draw` where one counted concurrency budget decides (`_one_budget`, SQLite):
        the room is the capacity less the covered tasks that run, and the protocol's
        own claim statement takes up to that many in claim order. Short of room, it
        says when to look again (`room_at`), as the general draw does."""
        await self._count_once(session, limit)
        room = capacity - self._running.get((limit.name, NO_PARTITION), 0)
        claimed: list[Row] = []
        if room > 0:
            op, params = claim_variant(list(queues), names)
            claimed = await session.fetch(op, {**base, **params, "limit": min(want, room)})
        if len(claimed) < want and room < want:
            self.waiting_for_room = True
            self.room_at = time.monotonic() + ROOM_POLL_MS / 1000
        return claimed

    async def _claim_room(
        self,
        session: Session,
        slot: Params,
        limit: Limit,
        queues: Sequence[str],
        names: Sequence[str] | None,
        want: int,
        base: Params,
    ) -> tuple[list[Row], int, int]:
        """One run of limit_claim_room.sql: the rows claimed, the free slots found and
        the clock (ms) it took them by."""
        stmt, params = self._room_statement(slot, limit, queues, names, want, base)
        return _room_rows(await session.fetch_statement(stmt, params))

    def _room_statement(
        self,
        slot: Params,
        limit: Limit,
        queues: Sequence[str],
        names: Sequence[str] | None,
        want: int,
        base: Params,
    ) -> tuple[Statement, Params]:
        """limit_claim_room.sql, composed for the claim's scope, and its parameters: up
        to `want` tasks of `queues` (and `names`) with `slot`'s budget's room."""
        one_queue, name_count = len(queues) == 1, None if names is None else len(names)
        scope = (one_queue, None if name_count is None else name_count == 1)
        shape = ("room", scope)
        stmt = self._statements.get(shape)
        if stmt is None:
            stmt = self._statements[shape] = composed(
                self.dialect, "extensions/limit_claim_room", {"scope": self._scope_sql(*scope)}
            )
        params: dict[str, Any] = {
            **slot,
            **_scope_params(queues, names),
            "n": want,
            "lease_ms": base["lease_ms"],
            "held_ms": HELD if slot["kind"] == "concurrency" else None,
            "window_ms": 0 if limit.rate is None else limit.rate.window_ms,
        }
        return stmt, params

    def _open_queues(
        self, queues: Sequence[str], blocked: Mapping[tuple[str, str], Limit], held_back: bool
    ) -> list[str]:
        """The claim's queues less those whose every task needs a budget that has no
        room: left out of the draw's statement, they cost its index nothing."""
        if held_back:  # every rate-limited task is passed over, whatever its partition
            covers = [*_whole_rates(self.limits), *blocked.values()]
        else:
            covers = list(blocked.values())
        shut = {queue for limit in covers if _whole_queues(limit) for queue in limit.queues}
        return [q for q in queues if q not in shut]

    def recovered(self) -> None:
        """Expired leases were just recovered: the room their claims held is stale, so
        the next claim that finds a budget short frees it without waiting its turn."""
        self._reclaimed.clear()

    async def _read_overrides(self, session: Session) -> None:
        """Apply the operator's overrides (`cairnqd limits set`), read at most every
        `OVERRIDES_EVERY_S` inside a claim's transaction; each change is logged."""
        now = time.monotonic()
        if now - self._overrides_read_at < OVERRIDES_EVERY_S:
            return
        self._overrides_read_at = now
        ours = {limit.name for limit in self.configured}
        rows = await session.fetch("extensions/limit_overrides", {})
        found = {o.name: o for o in map(Override.from_row, rows) if o.name in ours}
        if found == self._overrides:
            return
        for name in sorted(ours):
            before, after = self._overrides.get(name), found.get(name)
            if before == after:
                continue
            if after is None:
                log.info("limit %s: the operator's override is gone; back to the config", name)
            else:
                log.info(
                    "limit %s: overridden by %s%s: concurrency %s, rate %s",
                    name,
                    after.set_by,
                    f" ({after.reason})" if after.reason else "",
                    after.concurrency if after.concurrency is not None else "as configured",
                    after.rate if after.rate is not None else "as configured",
                )
        self._overrides = found
        self.limits = overridden(self.configured, found.values())

    def _needs(self, row: Row) -> list[tuple[Limit, str]]:
        """(limit, partition) of every limit that covers the task in `row`."""
        queue, name = str(row["queue"]), str(row["name"])
        needs = []
        for limit in self.limits:
            if limit.covers(queue, name):
                part = NO_PARTITION
                if limit.partition_by is not None:
                    part = str(row[self._columns[limit.partition_by]])
                needs.append((limit, part))
        return needs

    async def _grant(
        self,
        session: Session,
        batch: Sequence[tuple[Row, list[tuple[Limit, str]]]],
        worker_id: str,
        making: Sequence[dict[str, Any]],
    ) -> tuple[
        list[str],
        dict[tuple[str, str], tuple[Limit, float | None]],
        list[tuple[Row, list[tuple[Limit, str]]]],
    ]:
        """Take room for `batch`, one statement per budget it needs: the ids (in claim
        order) that got a slot of every budget they need, and the budgets found full,
        each with how long (ms) until a full rate window opens (None: concurrency). A
        task that got some of its slots but not all gives them back; a budget that got
        slots back that way is not full, and the tasks it turned away are returned to
        be asked again (the third value)."""
        if not batch:
            return [], {}, []
        now_ms = int(batch[0][0]["now_ms"])
        # Each budget the batch needs, in the order first asked: (limit, capacity, rows).
        asks: dict[tuple[str, str, str], tuple[Limit, int, list[Row]]] = {}
        for row, needs in batch:
            for lim, part in needs:
                for kind, capacity in lim.budgets:
                    asks.setdefault((lim.name, part, kind), (lim, capacity, []))[2].append(row)
        # Claims not made yet, so their slots would look stale to a reclaim: spare them.
        unclaimed = json.dumps([*making, *(_claim_of(row) for row, _ in batch)])
        granted: dict[str, set[tuple[str, str, str]]] = {}
        short: dict[tuple[str, str, str], tuple[Limit, Params]] = {}
        for (name, part, kind), (lim, capacity, asking) in asks.items():
            slot: Params = {
                "limit_name": name,
                "part": part,
                "kind": kind,
                "capacity": capacity,
                "now_ms": now_ms,
                "worker_id": worker_id,
                "until_ms": HELD if kind == "concurrency" else now_ms + _window_ms(lim),
            }
            if kind == "concurrency" and self.counts_running:
                got = await self._take_counted(session, lim, part, capacity, asking)
            else:
                got = await self._take_slots(session, slot, asking, unclaimed)
            for task_id in got:
                granted.setdefault(task_id, set()).add((name, part, kind))
            if len(got) < len(asking):
                short[(name, part, kind)] = (lim, slot)
        chosen, partial, given_back = [], [], set()
        for row, needs in batch:
            task_id = str(row["id"])
            have = granted.get(task_id, set())
            if len(have) == sum(len(lim.budgets) for lim, _ in needs):
                chosen.append(task_id)
            elif have:
                partial.append(_claim_of(row))
                given_back |= have
                for name, part, kind in have:
                    if kind == "concurrency" and self.counts_running:
                        self._running[(name, part)] -= 1
        if partial:
            held = {"worker_id": worker_id, "held": json.dumps(partial)}
            await session.fetch("extensions/limit_slots_untake", held)
        full: dict[tuple[str, str], tuple[Limit, float | None]] = {}
        for (name, part, kind), (lim, slot) in short.items():
            if (name, part, kind) in given_back:
                continue  # it has room again: what it turned away may ask once more
            opening = await self._opens_in(session, slot) if kind == "rate" else None
            full[(name, part)] = (lim, opening)
        retry = [
            (row, needs)
            for row, needs in batch
            if str(row["id"]) not in chosen and not any(k in full for k in _keys(needs))
        ]
        return chosen, full, retry

    async def _take_counted(
        self, session: Session, limit: Limit, part: str, capacity: int, asking: Sequence[Row]
    ) -> list[str]:
        """Room in a counted concurrency budget (`counts_running`) for `asking` (in claim
        order): the ids that got it. The room is the capacity less the covered tasks
        that run (read once per draw and limit) and those this draw took it for; none
        while a lowered limit still has more running than it allows."""
        await self._count_once(session, limit)
        key = (limit.name, part)
        room = max(0, capacity - self._running.get(key, 0))
        got = [str(row["id"]) for row in asking[:room]]
        self._running[key] = self._running.get(key, 0) + len(got)
        return got

    async def _count_once(self, session: Session, limit: Limit) -> None:
        """Within a draw, the first time `limit` needs room: count its running tasks and
        note this worker as one that counts them."""
        if limit.name not in self._counted:
            await self._count_running(session, limit)
            await self._note_worker(session, limit.name)

    async def _note_worker(self, session: Session, limit_name: str) -> None:
        """Note, in the claim's transaction, that this worker counts `limit_name`'s
        running tasks (limit_worker_note.sql): once, then every `WORKER_NOTE_EVERY_S`."""
        key = (limit_name, self._worker_id)
        if time.monotonic() - self._noted.get(key, -math.inf) < WORKER_NOTE_EVERY_S:
            return
        params = {"limit_name": limit_name, "worker_id": self._worker_id}
        await session.fetch("extensions/limit_worker_note", params)
        self._noting.add(key)

    def committed(self) -> None:
        """The claim's transaction committed: the notes its draw wrote stand."""
        if not self._noting:
            return
        if len(self._noted) >= _ENSURED_MAX:
            self._noted.clear()
        now = time.monotonic()
        for key in self._noting:
            self._noted[key] = now
        self._noting.clear()

    async def _count_running(self, session: Session, limit: Limit) -> None:
        """Count the tasks `limit` covers that run now, per partition, into `_running`
        (limit_running.sql, composed for the limit's cover and partition)."""
        shape = ("running", limit.queues, limit.names, limit.partition_by)
        stmt = self._statements.get(shape)
        if stmt is None:
            if limit.partition_by is None:
                part = f"'{NO_PARTITION}'"
            else:
                part = self._partition_sql(limit.partition_by)
            stmt = self._statements[shape] = composed(
                self.dialect,
                "extensions/limit_running",
                {"cover": self._cover_sql(0, limit) or "1", "part": part},
            )
        rows = await session.fetch_statement(stmt, self._cover_params(0, limit))
        for row in rows:
            self._running[(limit.name, str(row["part"]))] = int(row["running"])
        self._counted.add(limit.name)

    async def _take_slots(
        self, session: Session, slot: Params, asking: Sequence[Row], unclaimed: str
    ) -> list[str]:
        """Slots of one budget for `asking` (in claim order): the ids that got one.
        Short of slots, frees the stale ones (concurrency) and makes the budget's rows
        where this process has not yet, then tries once more for the rest."""
        got = await self._take_in_order(session, slot, asking)
        if len(got) == len(asking):
            return got
        again = await self._reclaim(session, slot, unclaimed)
        again = await self._ensure(session, slot) or again
        if not again:
            return got
        taken = set(got)
        rest = [row for row in asking if str(row["id"]) not in taken]
        return got + await self._take_in_order(session, slot, rest)

    async def _reclaim(self, session: Session, slot: Params, pending: str) -> bool:
        """Free the stale concurrency slots of `slot`'s budget, at most every
        `RECLAIM_EVERY_S` (at once after `recovered`); whether any were freed. Claims
        that ended without giving their room back (a lease recovered, a worker that
        died, a failure settled on its own) left them taken. Settlements give theirs
        back at once, so a budget that is short is mostly just full. `pending`: the
        claims this transaction is making (a JSON array, as limit_slots_reclaim.sql
        takes it), whose slots are not stale."""
        if slot["kind"] != "concurrency":
            return False
        budget = (str(slot["limit_name"]), str(slot["part"]))
        if not self._reclaim_due(budget):
            return False
        if len(self._reclaimed) >= _ENSURED_MAX:
            self._reclaimed.clear()
        self._reclaimed[budget] = time.monotonic()
        freed = await session.fetch("extensions/limit_slots_reclaim", {**slot, "pending": pending})
        return bool(freed)

    def _reclaim_due(self, budget: tuple[str, str]) -> bool:
        """Whether `budget` (limit name, partition) may have its stale slots freed now:
        `RECLAIM_EVERY_S` since the last time, or never yet (`recovered` clears them)."""
        return time.monotonic() - self._reclaimed.get(budget, -math.inf) >= RECLAIM_EVERY_S

    async def _ensure(self, session: Session, slot: Params) -> bool:
        """Make `slot`'s budget's rows, once per process and capacity (a new partition,
        a raised limit); whether this call made them."""
        key = _ensured_key(slot)
        if key in self._ensured:
            return False
        if len(self._ensured) >= _ENSURED_MAX:
            self._ensured.clear()
        await session.fetch("extensions/limit_slots_ensure", slot)
        self._ensured.add(key)
        return True

    async def _take_in_order(
        self, session: Session, slot: Params, asking: Sequence[Row]
    ) -> list[str]:
        holders = [{"rn": i, **_claim_of(row)} for i, row in enumerate(asking, start=1)]
        rows = await session.fetch(
            "extensions/limit_slots_take",
            {**slot, "holders": json.dumps(holders), "n": len(holders)},
        )
        return [str(r["task_id"]) for r in rows]

    async def _opens_in(self, session: Session, slot: Params) -> float:
        rows = await session.fetch("extensions/limit_rate_opens", slot)
        opens_at = rows[0]["opens_at_ms"] if rows else None
        if opens_at is None:
            return float(ROOM_POLL_MS)
        return float(max(0, int(opens_at) - int(slot["now_ms"])))

    # -- the draw's statement ----------------------------------------------------------

    def _candidates(
        self,
        blocked: Mapping[tuple[str, str], Limit],
        held_back: bool,
        queues: Sequence[str],
        names: Sequence[str] | None,
        size: int,
    ) -> tuple[Statement, Params]:
        """The draw's statement for this set of full budgets (every limit's tasks when
        `held_back`), and its parameters. A budget that covers whole queues needs no
        condition: its queues are left out of `queues` (`_open_queues`)."""
        excluded = dict(blocked)
        if held_back:
            # Every partition of every rate: one term per limit, on its cover alone.
            excluded.update({(lim.name, ""): lim for lim in _whole_rates(self.limits)})
        ordered = sorted((k, lim) for k, lim in excluded.items() if not _whole_queues(lim))
        one_queue, name_count = len(queues) == 1, None if names is None else len(names)
        params: dict[str, Any] = {"limit": size, **_scope_params(queues, names)}
        scope = (one_queue, None if name_count is None else name_count == 1)
        shape = (scope, tuple((k[0], lim.partition_by is not None) for k, lim in ordered))
        stmt = self._statements.get(shape)
        if stmt is None or len(self._statements) > 256:
            if len(self._statements) > 256:
                self._statements.clear()
            stmt = self._statements[shape] = self._compose(scope, ordered)
        for i, ((_, part), limit) in enumerate(ordered):
            params.update(self._cover_params(i, limit))
            if limit.partition_by is not None:
                params[f"x{i}_part"] = part
        return stmt, params

    def _compose(
        self, scope: tuple[bool, bool | None], ordered: Sequence[tuple[tuple[str, str], Limit]]
    ) -> Statement:
        columns = "".join(
            f", {self._partition_sql(path)} as {column}" for path, column in self._columns.items()
        )
        terms = []
        for i, ((_, _part), limit) in enumerate(ordered):
            term = self._cover_sql(i, limit)
            if limit.partition_by is not None:
                term += f" and {self._partition_sql(limit.partition_by)} = :x{i}_part"
            terms.append(f"({term})")
        excluded = " or ".join(terms) if terms else "false"
        if self.dialect == "sqlite" and not terms:
            excluded = "0"
        return composed(
            self.dialect,
            "extensions/limit_candidates",
            {"scope": self._scope_sql(*scope), "partitions": columns, "excluded": excluded},
        )

    def _scope_sql(self, one_queue: bool, one_name: bool | None) -> str:
        """The claim's queues and names: plain equalities for one of each, so the claim
        index is walked in claim order (as the protocol's claim variants do)."""
        postgres = self.dialect == "postgres"
        if one_queue:
            where = "queue = :queue"
        elif postgres:
            where = "queue = any(:queues::text[])"
        else:
            where = "queue in (select value from json_each(:queues))"
        if one_name:
            where += " and name = :name"
        elif one_name is not None:
            where += (
                " and name = any(:names::text[])"
                if postgres
                else " and name in (select value from json_each(:names))"
            )
        return where

    def _partition_sql(self, path: tuple[str, ...]) -> str:
        # Every key matched _FIELD (letters, digits, _) when the limit was parsed.
        if self.dialect == "postgres":
            return f"coalesce(payload #>> '{{{','.join(path)}}}', '{NO_PARTITION}')"
        json_path = "$." + ".".join(path)
        return (
            f"coalesce(case when json_valid(payload) then "
            f"cast(json_extract(payload, '{json_path}') as text) end, '{NO_PARTITION}')"
        )

    def _cover_sql(self, i: int, limit: Limit) -> str:
        parts = []
        if limit.queues:
            if self.dialect == "postgres":
                parts.append(f"queue = any(:x{i}_queues::text[])")
            else:
                parts.append(f"queue in (select value from json_each(:x{i}_queues))")
        if limit.names:
            op = "like" if self.dialect == "postgres" else "glob"
            globs = " or ".join(f"name {op} :x{i}_name{j}" for j in range(len(limit.names)))
            parts.append(f"({globs})")
        return " and ".join(parts)

    def _cover_params(self, i: int, limit: Limit) -> Params:
        params: dict[str, Any] = {}
        if limit.queues:
            params[f"x{i}_queues"] = list(limit.queues)
        for j, glob in enumerate(limit.names):
            params[f"x{i}_name{j}"] = like_pattern(glob) if self.dialect == "postgres" else glob
        return params


def _budget_slot(budget: tuple[Limit, str, int], base: Params) -> Params:
    """The slot parameters of a whole budget (one limit, no partitions)."""
    limit, kind, capacity = budget
    return {
        "limit_name": limit.name,
        "part": NO_PARTITION,
        "kind": kind,
        "capacity": capacity,
        "worker_id": base["worker_id"],
        "now_ms": None,
    }


def _ensured_key(slot: Params) -> tuple[str, str, str, int]:
    return (str(slot["limit_name"]), str(slot["part"]), str(slot["kind"]), int(slot["capacity"]))


def _room_rows(rows: Sequence[Row]) -> tuple[list[Row], int, int]:
    """limit_claim_room.sql's answer: the rows claimed, the free slots it found and the
    clock (ms) it took them by."""
    room, now_ms = int(rows[0]["room"]), int(rows[0]["room_now_ms"])
    claimed: list[Row] = []
    for row in rows:
        if row["id"] is not None:
            task = dict(row)
            del task["room"], task["room_now_ms"]
            claimed.append(task)
    return claimed, room, now_ms


def _scope_params(queues: Sequence[str], names: Sequence[str] | None) -> dict[str, Any]:
    """The parameters of `LimitedClaims._scope_sql`'s condition."""
    params: dict[str, Any] = {}
    if len(queues) == 1:
        params["queue"] = queues[0]
    else:
        params["queues"] = list(queues)
    if names is not None:
        if len(names) == 1:
            params["name"] = names[0]
        else:
            params["names"] = list(names)
    return params


def _whole_queues(limit: Limit) -> bool:
    """Whether `limit` has one budget for every task of its queues (no name globs, no
    partitions): when that budget is full, so are the queues."""
    return bool(limit.queues) and not limit.names and limit.partition_by is None


def _paced(needs: Sequence[tuple[Limit, str]]) -> bool:
    """Whether a task needs room in a rate (then it is claimed only to start at once)."""
    return any(limit.rate is not None for limit, _ in needs)


def _whole_rates(limits: Sequence[Limit]) -> list[Limit]:
    """The limits with a rate, each as covering all its partitions at once."""
    return [dataclasses.replace(lim, partition_by=None) for lim in limits if lim.rate]


def _keys(needs: Sequence[tuple[Limit, str]]) -> list[tuple[str, str]]:
    """The (limit, partition) budgets a task needs, as `blocked` names them."""
    return [(limit.name, part) for limit, part in needs]


def _claim_of(row: Row) -> dict[str, Any]:
    """The claim a candidate row becomes: its task and the attempt the claim counts."""
    return {"task_id": str(row["id"]), "attempt": int(row["attempt"]) + 1}


def _window_ms(limit: Limit) -> int:
    assert limit.rate is not None
    return limit.rate.window_ms
