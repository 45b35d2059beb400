"""Deadlocks of a worker with itself at full speed: one process, many loops, thousands of
short no-op jobs kept queued, for a number of seconds.

    python bench/deadlocks.py --dsn postgresql://root@127.0.0.1:5432/test
    python bench/deadlocks.py --dsn ... --heartbeat 1 --seconds 30
    python bench/deadlocks.py --dsn ... --prefetch 0

A producer keeps about `--queued` jobs queued (it tops the queue up with `enqueue_all`
whenever fewer are left); the worker runs with the library's defaults unless told
otherwise. Prints one JSON line: jobs run, jobs per second, the deadlocks the server
counted in this database meanwhile (`pg_stat_database.deadlocks`: every session of the
database counts, so run it on a quiet server), and the worker's log records that name
one (`DeadlockDetected`, SQLSTATE 40P01: each cost the server's `deadlock_timeout`).
Works in a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
import uuid
from datetime import timedelta
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from axa_queue import NewJob, Queue, QueueOptions


class Deadlocks(logging.Handler):
    """Counts the log records that name a deadlock (the exchange's or the heartbeat's)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        said = f"{record.getMessage()} {getattr(record, 'error', '')}".lower()
        if "deadlock" in said:
            self.count += 1


def server_deadlocks(conn: psycopg.Connection[Any]) -> int:
    """The server's count of deadlocks in the current database."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


async def measure(
    dsn: str, seconds: float, workers: int, heartbeat: float | None, prefetch: str, queued: int
) -> dict[str, Any]:
    options: dict[str, Any] = {"workers": workers}
    if heartbeat is not None:
        options["heartbeat_interval"] = timedelta(seconds=heartbeat)
    ahead: int | Literal["auto"] = "auto" if prefetch == "auto" else int(prefetch)
    queue = Queue(dsn, QueueOptions(prefetch=ahead, **options))
    await queue.open(setup=True)
    done = 0
    enqueued = 0

    @queue.handler("Noop")
    async def noop(args: dict[str, Any]) -> None:
        nonlocal done
        done += 1

    async def produce(stop: asyncio.Event) -> None:
        nonlocal enqueued
        while not stop.is_set():
            if enqueued - done < queued:
                batch = queued - (enqueued - done)
                await queue.enqueue_all(NewJob("Noop", {}) for _ in range(batch))
                enqueued += batch
            else:
                await asyncio.sleep(0.01)

    await queue.enqueue_all(NewJob("Noop", {}) for _ in range(queued))
    enqueued = queued
    counted = Deadlocks()
    logging.getLogger("axa_queue").addHandler(counted)
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = server_deadlocks(conn)
        stop = asyncio.Event()
        worker = asyncio.create_task(queue.run(stop))
        producer = asyncio.create_task(produce(stop))
        started, first = time.monotonic(), done
        await asyncio.sleep(seconds)
        ran, took = done - first, time.monotonic() - started
        stop.set()
        await producer
        await worker
        await queue.close()  # its sessions end, and report their statistics
        await asyncio.sleep(0.5)
        after = server_deadlocks(conn)
    logging.getLogger("axa_queue").removeHandler(counted)
    return {
        "seconds": round(took, 1),
        "workers": workers,
        "heartbeat": heartbeat,
        "prefetch": prefetch,
        "jobs": ran,
        "jobs_per_second": round(ran / took),
        "server_deadlocks": after - before,
        "logged_deadlocks": counted.count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://root@127.0.0.1:5432/test")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument(
        "--heartbeat", type=float, default=None, help="seconds (default: the library's)"
    )
    parser.add_argument("--prefetch", default="auto", help='"auto" (default) or a number')
    parser.add_argument("--queued", type=int, default=4000, help="jobs kept queued")
    args = parser.parse_args()
    schema = f"bench_deadlocks_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        dsn = make_conninfo(args.dsn, options=f"-c search_path={schema}")
        figures = asyncio.run(
            measure(dsn, args.seconds, args.workers, args.heartbeat, args.prefetch, args.queued)
        )
        print(json.dumps(figures))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
