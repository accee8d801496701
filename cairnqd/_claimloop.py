"""The claim loop: claim what the free call slots (and prefetch) allow, start it.

Each cycle claims up to the free slots plus the prefetch target in one transaction
(`_claims` draws per source), carries the results queued since the last one
(`_settlement`), and starts claimed tasks in claim order as slots free up; a task whose
lease passed while it waited is dropped. Claims hold while results cannot be written
for want of space. Why: docs/architecture.md, "Writing results".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Protocol

from cairnqd._calls import Call, CallRunner
from cairnqd._claims import ClaimPlan, claim_sources
from cairnqd._handlers import RegisteredHandler
from cairnqd._heartbeat import renew
from cairnqd._inflight import InFlight, LoopState
from cairnqd._pauses import PausedQueues
from cairnqd._prefetch import PrefetchSizer
from cairnqd._settlement import Pending, Settlement
from cairnqd.context import TaskContext
from cairnqd.models import Task
from cairnqd.store.base import TaskStore

#: The least time between two claims of a worker that a limit holds back (docs/limits.md).
ROOM_GAP_MS = 20


def claim_order(task: Task) -> tuple[int, int, str]:
    """The order the claim statements pick in: priority first, then due time, then id.
    The rows come back in table order, so a batch is sorted before it starts."""
    return (-task.priority, task.run_at_ms, task.id)


class WakeGate(Protocol):
    """Tells a worker whether to answer the store's wake-ups, for processes that claim
    the same queues side by side and would otherwise all claim on each one
    (daemon/wakerole.py). Without one, a worker answers every wake-up."""

    @property
    def holding(self) -> bool: ...

    async def until_held(self, timeout_s: float) -> None: ...


class ClaimLoop:
    def __init__(
        self,
        store: TaskStore,
        queues: Sequence[str],
        handlers: Mapping[str, RegisteredHandler],
        inflight: InFlight,
        state: LoopState,
        settlement: Settlement,
        runner: CallRunner,
        prefetch: PrefetchSizer,
        *,
        poll_interval_ms: int,
        resources: Mapping[str, int],
    ) -> None:
        self._store = store
        self._queues = list(queues)
        self._handlers = handlers
        self._inflight = inflight
        self._state = state
        self._settlement = settlement
        self._runner = runner
        self._prefetch = prefetch
        self._poll_interval_ms = poll_interval_ms
        self._resources = resources
        self._calls: set[asyncio.Task[None]] = set()
        self._rotation = 0
        self._slots = 1
        self._claim_sent_at = 0.0
        # The last claim came up short because a flow-control limit had no room.
        self._held_back = False
        #: Tasks held when that claim ended: fewer now means some room came back.
        self._held = 0
        # The last claim left the results due for a write of their own after it.
        self._write_after_claim = False
        self._polled = False
        # Hooks for a host process that retires a worker (see `Worker`).
        self.claim_budget: int | None = None
        self.before_claim: Callable[[], bool] | None = None
        #: Set by a worker that honours queue pauses (`Worker(honour_pauses=True)`).
        self.pauses: PausedQueues | None = None
        #: Called with True when a task claimed now would start at once (a free call
        #: slot and no claimed task waiting for one), False when not; only on a flip.
        self.on_room: Callable[[bool], None] | None = None
        self._roomy: bool | None = None
        #: When set, this worker waits for wake-ups only while the gate is held, and
        #: otherwise for the gate (or its poll).
        self.wake_gate: WakeGate | None = None
        #: Wake-ups (from the store, or the poll) whose claim found nothing: another
        #: worker answered the same notification first, or nothing was queued.
        self.empty_wakes = 0
        self._woken = False

    @property
    def calls(self) -> set[asyncio.Task[None]]:
        return self._calls

    async def run(self, slots: int) -> None:
        self._slots = slots
        self._roomy = None
        self._note_room()
        state = self._state
        state.looping = True
        try:
            await self._cycles(slots)
        finally:
            state.looping = False

    async def drain(self, slots: int) -> None:
        """Run what is held, backlog included, until no call is left."""
        backlog = self._inflight.backlog
        while self._calls or backlog:
            if backlog and len(self._calls) < slots:
                self.start_backlog(slots - len(self._calls))
                continue
            await asyncio.wait(set(self._calls), return_when=asyncio.FIRST_COMPLETED)

    def prefetch_target(self) -> int:
        """Tasks to hold claimed beyond the free slots right now."""
        if not self._prefetch.adaptive:
            return self._prefetch.target(self._slots)
        return self._prefetch.target(self._slots, self._runner.longest_plain_call())

    def _may_claim(self) -> bool:
        if self.claim_budget is not None and self.claim_budget <= 0:
            return False
        return self.before_claim is None or self.before_claim()

    async def _cycles(self, limit: int) -> None:
        state, backlog = self._state, self._inflight.backlog
        while not state.stop.is_set():
            # Cleared first, before this pass reads anything or awaits: whatever it
            # reads (free slots, the backlog, due results) is now seen, and whatever
            # happens from here on (a call ends, a resource or slot frees, a result
            # falls due, stop()) sets `freed` again and cuts the next wait short.
            # Cleared any later, a wake-up that came during an await below (the pause
            # read, the claim) was lost: a worker with free slots and tasks in hand
            # waited a whole poll interval, and stop() waited too. Never cleared (a
            # quiet worker, which never claims), every wait returned at once: it spun.
            state.freed.clear()
            free = limit - len(self._calls)
            if backlog and free > 0:
                self.start_backlog(free)
                free = limit - len(self._calls)
            # With prefetch, claim again once the backlog is half spent, even with
            # every slot busy: the claim carries the finished results with it.
            ahead = state.ahead = self.prefetch_target()
            refill = ahead > 0 and len(backlog) <= ahead // 2
            # A cycle only because results are due writes them and claims nothing:
            # topping the backlog up here would claim what the last few milliseconds
            # consumed (5-10 tasks a cycle on a loaded machine, where the server's cost
            # per task is 3x a 256-task claim's); the refill at half the backlog claims
            # in large batches instead.
            settle_only = free <= 0 and not refill
            if settle_only and not self._settlement.due():
                await state.freed.wait()
                continue
            if not self._handlers or not state.claiming:
                await self._idle()
                continue
            hold = self._settlement.space_hold()
            if hold:
                await self._hold_for_space(hold)
                continue
            if hold is not None:  # short of space: one task tries the disk
                free, ahead, settle_only = min(free, 1), 0, free <= 0
            queues = self._queues if self.pauses is None else await self.pauses.active()
            if not queues:
                await self._idle()  # every queue of ours is paused
                continue
            if self._held_back:
                if self._settlement.pending or len(self._inflight) < self._held:
                    self._held_back = False  # ours settled since: its room is back
                else:
                    # The last claim found a limit full, and nothing of ours settled
                    # since: a claim now would find it full again. Wait for room: a
                    # call of ours ending, a task settling elsewhere, the rate window.
                    if await self._idle():
                        self._held_back = False
                    continue
            if not self._may_claim():
                state.stop.set()
                break
            if self.claim_budget is not None:
                # Never claim past the budget, prefetch included: a retiring worker
                # would otherwise carry a backlog it must still run.
                free = min(free, self.claim_budget)
                ahead = min(ahead, self.claim_budget - free + len(backlog))
            if not settle_only and not self._polled and self._defers_to_sibling():
                self._woken = await self._idle()
                continue
            self._polled = False
            woken, self._woken = self._woken, False
            try:
                claimed = await self._claim(queues, free, len(backlog) if settle_only else ahead)
            except Exception as exc:
                self._inflight.report(exc, {"phase": "claim"})
                await self._write_results_after_claim()
                await self._sleep_unless_stopped(0.25)
                continue
            if self.claim_budget is not None:
                self.claim_budget -= len(claimed)
            if claimed:
                claimed = await self._confirm_if_late(claimed)
            self._held_back = self._store.room_wait_ms(time.monotonic()) is not None
            if not claimed:
                await self._write_results_after_claim()
                if self._held_back:
                    self._held = len(self._inflight)
                    continue  # waits for room above
                if not settle_only and (free > 0 or len(backlog) < ahead):
                    self.empty_wakes += woken
                    self._woken = await self._idle()  # asked for tasks and found none
                # else: a cycle only to write due results; nothing was asked for
                continue
            self._dispatch(claimed, free)
            self._held = len(self._inflight)
            # Let the new calls start before the next claim (or the results' write).
            await asyncio.sleep(0)
            await self._write_results_after_claim()

    async def _idle(self) -> bool:
        """Wait for a wake-up from the store, a freed resource, stop, or the poll.
        True when the store's wake-up or the poll ended it."""
        state = self._state
        room_ms = self._store.room_wait_ms(time.monotonic())
        # Waiting for a limit's room, the claim that ends the wait comes as soon as one
        # of our calls ends, and the result it carries gives its room back in the same
        # transaction; written apart, the claim could run before that commit, find the
        # limit still full and wait for another wake-up (docs/limits.md, "How it is
        # kept"). Otherwise nothing will claim soon: write any results now.
        state.idling = room_ms is None
        if state.idling:
            self._settlement.put_back([])
        queues, wait_ms = self._queues, self._poll_interval_ms
        if self.pauses is not None:
            queues = [q for q in queues if q not in self.pauses.paused]
            wait_ms = self.pauses.wait_cap_ms(wait_ms)
        gap_ms = 0
        if room_ms is not None:
            self._store.wake_from_now()
            # A limit held work back: look again when it may have room. Wake-ups
            # (a commit, a task settling anywhere) come no sooner than ROOM_GAP_MS
            # apart, or a busy database would have every held-back worker claim at
            # its pace; this worker's own task settling still ends the wait at once.
            wait_ms = min(wait_ms, room_ms)
            gap_ms = min(ROOM_GAP_MS, wait_ms)
        gate = self.wake_gate
        deferring = False
        if gate is not None and room_ms is None and not gate.holding:
            # A sibling answers the wake-ups while it has room: wait to take over from
            # it, or for the poll. Held back by a limit, every worker waits for its room.
            deferring = True
            wake = asyncio.ensure_future(gate.until_held(wait_ms / 1000))
        else:
            wake = asyncio.ensure_future(self._wake(queues, wait_ms, gap_ms))
        if deferring and self._defers_to_sibling() and not self._inflight.backlog:
            # A call of ours ending is no reason to claim (`_defers_to_sibling`); with
            # nothing claimed ahead to start, only stop cuts this wait short.
            freed = asyncio.ensure_future(state.stop.wait())
        else:
            freed = asyncio.ensure_future(state.freed.wait())
        try:
            await asyncio.wait({wake, freed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            state.idling = False
            for fut in (wake, freed):
                fut.cancel()
        woken = wake.done() and not wake.cancelled()
        # The poll fell due without the role: the next cycle claims all the same.
        self._polled = deferring and woken and self._defers_to_sibling()
        return woken

    def _defers_to_sibling(self) -> bool:
        """Whether a sibling answers for this worker: it holds the group's wake role
        (`wake_gate`) and claims what comes while it has room, and the database has one
        writer at a time (SQLite). This worker then claims nothing of its own accord,
        not when a call of its ends nor again after a claim of its own, until it takes
        the role or its poll falls due: such claims mostly came up empty, and each took
        a turn at the write lock that the sibling's claims wait for (docs/architecture.md,
        "cairnqd/daemon/wakerole.py"). On Postgres they run beside the sibling's and
        catch what it is too busy to take. Not with resources: a task may need one
        that only this worker has free. Nor while a limit held this worker's last
        claim back: it waits for that room itself (`_idle`), and the claim its call
        ending makes carries the result that gives the room back; deferred, the
        result stayed unwritten and the room taken, for the sibling too."""
        gate = self.wake_gate
        return (
            gate is not None
            and not gate.holding
            and self._store.one_writer
            and not self._resources
            and self._store.room_wait_ms(time.monotonic()) is None
        )

    async def _wake(self, queues: Sequence[str], wait_ms: int, gap_ms: int) -> None:
        if gap_ms:
            await asyncio.sleep(gap_ms / 1000)
        if queues:
            await self._store.claim_wake(queues, wait_ms - gap_ms)
        else:
            await asyncio.sleep((wait_ms - gap_ms) / 1000)

    async def _hold_for_space(self, seconds: float) -> None:
        """Claim nothing for up to `seconds`: results cannot be written for want of
        space. A flusher writes them meanwhile, as when idle; the first that goes
        through wakes us (`Settlement.written`)."""
        state = self._state
        state.idling = True
        self._settlement.put_back([])
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.freed.wait(), seconds)
        finally:
            state.idling = False

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._state.stop.wait(), seconds)

    async def _claim(self, queues: Sequence[str], free: int, ahead_target: int) -> list[Task]:
        sources = claim_sources(self._handlers)
        if not sources:
            return []
        start = self._rotation % len(sources)
        self._rotation += 1
        ordered = sources[start:] + sources[:start]
        names = [n for s in sources for n in s.names]
        ahead = max(0, ahead_target - len(self._inflight.backlog))

        plan = ClaimPlan(ordered, free, ahead, self._resources, self._inflight.in_use)
        settlement = self._settlement
        limited = self._store.limited_for(queues) is not None
        if settlement.pending and ahead > 0 and not self._store.brief_transactions and not limited:
            # Claiming ahead takes a bigger batch, so the claim transaction stays open
            # longer (on Postgres, a round trip per statement and the server's work on
            # hundreds of rows); a result riding in it is lost if the process dies
            # meanwhile, and its task runs again. The results go in a short transaction
            # of their own (one more commit per cycle, spread over a large batch), right
            # after the claim's tasks have started (`_cycles`): a task that came while a
            # slot was free does not wait for the results' commit. Where a transaction
            # runs straight through to its commit (SQLite), the claim adds a few
            # milliseconds to results that already waited up to a settle interval in
            # memory, while the second commit, with its lock hand-off and fsync, cost a
            # sixth of the drain (bench/RESULTS.md, "The claim cycle, change by change").
            # Under flow-control limits the results ride in the claim all the same: they
            # give back the room it then takes.
            self._write_after_claim = True
            settle = []
        else:
            settle = settlement.take()
        # The lease deadline of what this claim takes counts from before it is sent.
        self._claim_sent_at = self._inflight.clock()
        with self._writing(settle):
            result = await self._store.claim_session(
                queues=queues,
                worker_id=self._inflight.worker_id,
                lease_ms=self._inflight.lease_ms,
                names=names,
                plan=plan,
                settle=[(ctx.task_id, encoded, ctx.attempt) for ctx, encoded in settle],
                on_settled=lambda statuses: settlement.finish(settle, statuses),
            )
        return result or []

    async def _confirm_if_late(self, claimed: list[Task]) -> list[Task]:
        """The claimed tasks to dispatch: all of them, unless the claim came back too
        late for them to start (past their stop point, counted from when it was sent).

        The claim waited on the database (another client's lock, a stalled network):
        its tasks' lease in the database runs from when the claim ran, but the local
        one from when it was sent, and they would be let go as never started. Before,
        they then stayed `running` until that lease ended and recovery counted the
        attempt the claim had spent: a task of one attempt failed `lease_expired`
        without its handler ever being called. Renewed at once instead, their local
        lease runs from the renewal; a task the renewal does not confirm (its lease
        already gone) is let go, and one a failed renewal leaves unconfirmed is
        dispatched as before, to be dropped as stale."""
        inflight = self._inflight
        if inflight.clock() < self._claim_sent_at + inflight.lease_s - inflight.margin_s:
            return claimed
        renewal = await renew(self._store, inflight, [(task.id, task.attempt) for task in claimed])
        if renewal is None:
            return claimed
        sent_at, reply = renewal
        self._claim_sent_at = sent_at
        confirmed: list[Task] = []
        for task in claimed:
            if reply.get(task.id, (None, False))[0] == task.attempt:
                confirmed.append(task)
                continue
            ctx = self._hold(task)
            ctx._mark_lost()
            inflight.release(ctx, "lease_lost", "lease lost before the late claim's answer")
        return confirmed

    async def _write_results_after_claim(self) -> None:
        """Start writing the results a claim left for after its tasks started
        (`_claim`), by the settlement's writer (its retries and one-by-one fallback
        included), beside the next claim rather than before it: on a pool with a
        connection to spare the two run at once, and a task that lands meanwhile does
        not wait for the results' statement (a few milliseconds for a few dozen rows,
        with their triggers). On a pool of one they take turns for the connection."""
        if self._write_after_claim:
            self._write_after_claim = False
            # Not before they are due: a worker keeping up with a stream claims every
            # few milliseconds, and a write per claim would hold each next claim back.
            # Due, the settlement's timer wakes the loop, and the next claim writes them.
            if self._settlement.due():
                self._settlement.write_due()

    @contextlib.contextmanager
    def _writing(self, settle: list[Pending]) -> Iterator[None]:
        """Around one claim or results write carrying `settle`: counts toward the
        worker's progress (health), and on failure puts the results back for the next
        write, holding claims if the database refused them for want of space."""
        settlement, progress = self._settlement, self._inflight.progress
        progress.begin()
        try:
            with settlement.carried(settle):
                yield
        except BaseException as exc:
            progress.failed()
            if settle:
                settlement.refused(exc)
            settlement.put_back(settle)
            raise
        progress.succeeded()

    def _dispatch(self, claimed: list[Task], free: int) -> None:
        """Start calls for what was claimed; plain tasks beyond the `free` call slots
        (prefetched) wait in the backlog."""
        claimed.sort(key=claim_order)
        by_name: dict[str, list[Task]] = {}
        plain: list[Task] = []
        for task in claimed:
            handler = self._handlers.get(task.name)
            if handler is not None and handler.batch is None and handler.resource is None:
                plain.append(task)
            else:
                by_name.setdefault(task.name, []).append(task)
        for name, tasks in by_name.items():
            handler = self._handlers.get(name)
            if handler is None:
                # Unregistered between claim and dispatch: fail permanently, never run.
                for task in tasks:
                    self._spawn(self._runner.fail_no_handler(self._hold(task)))
                continue
            size = handler.batch or 1
            for i in range(0, len(tasks), size):
                contexts = [self._hold(t) for t in tasks[i : i + size]]
                if handler.resource is not None:
                    self._inflight.in_use[handler.resource] += 1
                self._spawn(self._runner.execute(Call(handler, contexts)))
                free -= 1
        waiting = [TaskContext(self._settlement, task) for task in plain]
        self._inflight.hold(waiting, self._claim_sent_at)
        self._inflight.backlog.extend(waiting)
        self.start_backlog(free)

    def start_backlog(self, free: int) -> None:
        backlog, runner = self._inflight.backlog, self._runner
        while backlog and free > 0:
            ctx = backlog.popleft()
            if self._inflight.stale(ctx):
                continue  # its lease passed while it waited: never started
            handler = self._handlers.get(ctx.name)
            if handler is None:
                self._spawn(runner.fail_no_handler(ctx))  # unregistered while it waited
            else:
                self._spawn(runner.execute(Call(handler, [ctx])))
            free -= 1
        self._note_room()

    def _note_room(self) -> None:
        """Tell `on_room` when a task claimed now would start at once, or no longer
        would: a call slot free and no claimed task waiting for one. Checked where calls
        start and end, a comparison each; the hook runs only on a flip. Without a hook
        (a bare worker), nothing: `run()` looks afresh once one is set."""
        if self.on_room is None:
            return
        roomy = len(self._calls) + len(self._inflight.backlog) < self._slots
        if roomy is not self._roomy:
            self._roomy = roomy
            if self.on_room is not None:
                self.on_room(roomy)

    def _hold(self, task: Task) -> TaskContext:
        ctx = TaskContext(self._settlement, task)
        self._inflight.hold((ctx,), self._claim_sent_at)
        return ctx

    def _spawn(self, coro: Awaitable[None]) -> None:
        call = asyncio.ensure_future(coro)
        self._calls.add(call)
        call.add_done_callback(self._call_done)

    def _call_done(self, call: asyncio.Task[None]) -> None:
        self._calls.discard(call)
        self._state.freed.set()
        self._note_room()
