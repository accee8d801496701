"""One benchmark worker process: serves `bench.noop` with the chosen implementation.

    python bench/worker_proc.py --impl ours|cairnq|procrastinate|pgqueuer|huey \
        --backend sqlite|postgres --target PATH_OR_DSN --concurrency 8

Connects (running migrations if needed), prints `READY <worker-id>`, waits for a `GO`
line on stdin, then works until SIGTERM (or `--max-seconds`), and prints
`DONE handled=<n>` on the way out. The handler is an async no-op; with `--stamp` it
returns `{"t": time.time()}` taken as the handler starts, for pickup latency. The peers
(procrastinate, pgqueuer) keep no result, so with `--stamp-file PATH` their handler
appends `<i> <time.time()>` to PATH instead, `i` being the job's payload.

`--tracing` (ours only) sets what OpenTelemetry the process holds: `off`, none imported
(checked again on the way out); `api`, the API imported and no provider set (the `otel`
extra installed, the application not tracing); `provider`, the SDK's `TracerProvider`
with a `BatchSpanProcessor` feeding an exporter that drops every span, so the spans are
built, batched and handed over without any I/O. `DONE` then also says `otel=0|1`,
whether any `opentelemetry` module was loaded.

Self-contained on purpose (imports nothing from `bench`), so it starts as a plain
script.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

NOOP = "bench.noop"
QUEUE = "default"


class Stats:
    handled = 0
    lock: Any = None  # huey's worker threads count under it


def stamper(path: str | None) -> Callable[[Any], None]:
    """Record a handler start for job number `i` (a no-op without `--stamp-file`)."""
    if path is None:
        return lambda i: None
    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life

    def stamp(i: Any) -> None:
        out.write(f"{i} {time.time()!r}\n")

    return stamp


def announce(ident: str) -> None:
    print(f"READY {ident}", flush=True)


async def wait_for_go() -> bool:
    """Block until the driver writes GO; False if stdin closed (the driver is gone)."""
    line: str = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return line.strip() == "GO"


async def run_until_stopped(
    start: Callable[[], Awaitable[None]], stop: Callable[[], object], max_seconds: float
) -> None:
    """Run `start()` until it returns; SIGTERM/SIGINT or the deadline call `stop()`."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    watchdog = loop.call_later(max_seconds, stop)
    try:
        await start()
    finally:
        watchdog.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


# -- tracing (ours) ----------------------------------------------------------------------


def set_tracing(mode: str) -> None:
    """Load (or not) OpenTelemetry as `--tracing` says, before the worker starts: ours
    decides when `run()` starts whether a provider is set."""
    if mode == "off":
        return
    import opentelemetry.trace

    if mode == "api":
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        """Takes every batch and keeps nothing: the spans' cost without an exporter's."""

        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    opentelemetry.trace.set_tracer_provider(provider)


def otel_loaded() -> int:
    return int(any(name.split(".")[0] == "opentelemetry" for name in sys.modules))


# -- cairnq protocol SDKs (ours and the public one) -------------------------------------


async def serve_sdk(args: argparse.Namespace) -> None:
    lib: Any
    if args.impl == "ours":
        import cairnqd as lib
    else:
        import cairnq as lib
    worker_cls: Any = lib.Worker

    store: Any = (
        lib.SQLiteStore(args.target) if args.backend == "sqlite" else lib.PostgresStore(args.target)
    )
    options: dict[str, Any] = {"concurrency": args.concurrency}
    if args.poll_interval_ms is not None:
        options["poll_interval_ms"] = args.poll_interval_ms
    if args.prefetch is not None:
        if "prefetch" not in inspect.signature(worker_cls.__init__).parameters:
            sys.exit(f"{args.impl} Worker takes no prefetch= argument")
        options["prefetch"] = args.prefetch if args.prefetch == "auto" else int(args.prefetch)
    if args.limits is not None:
        options["limits"] = json.loads(args.limits)
    worker = worker_cls(store, [QUEUE], **options)
    set_tracing(args.tracing)
    pause = args.sleep_ms / 1000

    if args.stamp:

        async def handler(ctx: Any) -> Any:
            started = time.time()
            Stats.handled += 1
            if pause:
                await asyncio.sleep(pause)
            # When the claim was made, by the database's clock: the lease it set, less
            # the lease's length (ours only: the public SDK's context has no task).
            task = getattr(ctx, "task", None)
            lease = getattr(task, "lease_until_ms", None)
            claimed = None if lease is None else (lease - worker.lease_ms) / 1000
            return {"t": started, "claimed": claimed}
    else:

        async def handler(ctx: Any) -> Any:
            Stats.handled += 1
            if pause:
                await asyncio.sleep(pause)
            return None

    worker.task(NOOP)(handler)
    await store.connect()
    try:
        announce(worker.worker_id)
        if not await wait_for_go():
            return
        # run() starts before the signal handlers go in: early cairnqd versions reset
        # the stop event on entry to run(), losing a stop() that came first.
        runner = asyncio.create_task(worker.run())
        await asyncio.sleep(0)
        await run_until_stopped(lambda: runner, worker.stop, args.max_seconds)
    finally:
        await store.close()


# -- procrastinate ----------------------------------------------------------------------


async def serve_procrastinate(args: argparse.Namespace) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.target))

    stamp = stamper(args.stamp_file)

    @app.task(name=NOOP, queue=QUEUE)
    async def noop(**kwargs: Any) -> None:
        stamp(kwargs.get("i"))
        Stats.handled += 1

    async with app.open_async():
        name = f"procrastinate-{os.getpid()}"
        announce(name)
        if not await wait_for_go():
            return
        runner = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE],
                concurrency=args.concurrency,
                name=name,
                wait=True,
                install_signal_handlers=False,
                listen_notify=True,
            )
        )

        async def until_done() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await runner

        # Cancelling run_worker_async is procrastinate's graceful stop.
        await run_until_stopped(until_done, runner.cancel, args.max_seconds)


# -- pgqueuer ---------------------------------------------------------------------------


async def serve_pgqueuer(args: argparse.Namespace) -> None:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    conn = await asyncpg.connect(args.target)
    try:
        pgq = PgQueuer.from_asyncpg_connection(conn)
        stamp = stamper(args.stamp_file)

        @pgq.entrypoint(NOOP)
        async def noop(job: Job) -> None:
            if args.stamp_file is not None:
                stamp(json.loads(job.payload or b"{}").get("i"))
            Stats.handled += 1

        announce(f"pgqueuer-{os.getpid()}")
        if not await wait_for_go():
            return
        await run_until_stopped(
            lambda: pgq.run(batch_size=args.pgq_batch, max_concurrent_tasks=args.pgq_max_in_flight),
            pgq.shutdown.set,
            args.max_seconds,
        )
    finally:
        await conn.close()


# -- huey (SQLite) ----------------------------------------------------------------------


def huey_app(path: str, *, fsync: bool) -> tuple[Any, Any]:
    """huey on the SQLite file `path`, and its no-op task (named the same in the
    preloading process and the consumer, so the one runs what the other queued)."""
    from huey import SqliteHuey

    huey = SqliteHuey("bench", filename=path, fsync=fsync)  # fsync: synchronous=FULL

    @huey.task(name=NOOP)
    def noop(i: int) -> None:
        with Stats.lock:
            Stats.handled += 1

    return huey, noop


def preload_huey(path: str, n: int) -> None:
    """Queue `n` no-op tasks without an fsync each (the drain, not this, is measured)."""
    _, noop = huey_app(path, fsync=False)
    for i in range(n):
        noop(i)


def serve_huey(args: argparse.Namespace) -> None:
    """huey's own consumer: `concurrency` worker threads polling the file."""
    import threading

    Stats.lock = threading.Lock()
    huey, _ = huey_app(args.target, fsync=True)
    # periodic off (no scheduler work); polling as huey ships it.
    consumer = huey.create_consumer(workers=args.concurrency, worker_type="thread", periodic=False)
    announce(f"huey-{os.getpid()}")
    line = sys.stdin.readline()
    if line.strip() != "GO":
        return
    consumer.run()  # until SIGTERM (huey's own handler stops it)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--impl", required=True, choices=["ours", "cairnq", "procrastinate", "pgqueuer", "huey"]
    )
    parser.add_argument("--backend", required=True, choices=["sqlite", "postgres"])
    parser.add_argument("--target", required=True, help="SQLite file path or Postgres DSN")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll-interval-ms", type=int, default=None)
    parser.add_argument("--prefetch", default=None, help="auto or a count (ours only)")
    parser.add_argument("--stamp", action="store_true", help="return {'t': time.time()}")
    parser.add_argument("--stamp-file", default=None, help="peers: append '<i> <time>' here")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop on its own after")
    parser.add_argument("--huey-preload", type=int, default=None, help="huey: queue N, exit")
    parser.add_argument("--pgq-batch", type=int, default=10, help="pgqueuer dequeue batch")
    parser.add_argument(
        "--pgq-max-in-flight", type=int, default=None, help="pgqueuer max_concurrent_tasks"
    )
    parser.add_argument("--limits", default=None, help="ours: Worker(limits=) as JSON")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="the handler sleeps this")
    parser.add_argument(
        "--tracing",
        choices=["off", "api", "provider"],
        default="off",
        help="ours: no OpenTelemetry, its API without a provider, or an SDK provider",
    )
    args = parser.parse_args(argv)
    if args.limits is not None and args.impl != "ours":
        parser.error("--limits is for ours only")
    if args.tracing != "off" and args.impl != "ours":
        parser.error("--tracing is for ours only")
    if args.impl in ("procrastinate", "pgqueuer") and args.backend != "postgres":
        parser.error(f"{args.impl} runs on Postgres only")
    if args.impl == "huey" and args.backend != "sqlite":
        parser.error("huey runs on SQLite here (SqliteHuey)")
    return args


def main() -> None:
    args = parse_args()
    if args.impl == "huey":
        if args.huey_preload is not None:
            preload_huey(args.target, args.huey_preload)
            return
        serve_huey(args)
        print(f"DONE handled={Stats.handled}", flush=True)
        return
    serve = {
        "ours": serve_sdk,
        "cairnq": serve_sdk,
        "procrastinate": serve_procrastinate,
        "pgqueuer": serve_pgqueuer,
    }[args.impl]
    asyncio.run(serve(args))
    print(f"DONE handled={Stats.handled} otel={otel_loaded()}", flush=True)


if __name__ == "__main__":
    main()
