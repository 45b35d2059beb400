"""The workers of `bench/soak.py`, and the one job they all run.

- axa-queue's: `queue`, run by the command line as an operator runs it,
  `python -m axa_queue.cli worker soak_worker:queue --workers N --no-setup` (which is
  `axa-queue worker`), with the library's default options;
- the raw-SQL floor's: `floor_process`, a process of connections each claiming with
  `bench/floor.py`'s batch claim; one more connection LISTENs, and each notification
  wakes one idle connection (waking them all would send one claim per connection per
  job), which also claims again every second (axa-queue's `poll_interval`).

The job notes when its run started (`time.monotonic()`, CLOCK_MONOTONIC: one clock
for every process of the machine, never stepped) and writes one row to `bench_done`:
its key (the primary key: a second run of a job fails), that start, and the time since
the producer noted it queued the job (the job's `t` argument, on the same clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from axa_queue import Queue

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import floor  # noqa: E402  (bench/floor.py, beside this file)

JOB = "soak"
DONE_TABLE = [
    "CREATE TABLE bench_done (job_id UUID PRIMARY KEY, started FLOAT8 NOT NULL, "
    "waited_ms FLOAT8 NOT NULL)",
    "CREATE INDEX bench_done_started ON bench_done (started)",
]
"""The side table: one row per job run. The index on `started` lets each sample read
only its own seconds' rows (the table holds every job of the run: millions)."""
DONE = "INSERT INTO bench_done (job_id, started, waited_ms) VALUES (%s, %s, %s)"
POLL = 1.0
"""Seconds an idle floor connection waits to be woken before it claims again."""


def started_row(key: Any, queued_at: float) -> tuple[Any, float, float]:
    """The row of a job whose run starts now: key, start, milliseconds since queued."""
    now = time.monotonic()
    return key, now, (now - queued_at) * 1000


queue = Queue()
"""axa-queue's side; the command line gives it its DSN and its loops."""


@queue.handler(JOB)
async def soak(args: dict[str, Any]) -> None:
    row = started_row(args["k"], args["t"])
    async with queue.pool.connection() as conn:
        await conn.execute(DONE, row)


async def _floor_loop(
    conn: psycopg.AsyncConnection[Any], batch: int, wakes: asyncio.Semaphore, stop: Any
) -> None:
    cur = conn.cursor()
    while not stop.is_set():
        await cur.execute(floor.CLAIM_BATCH_ARGS, {"batch": batch}, prepare=True)
        claimed = await cur.fetchall()
        if not claimed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakes.acquire(), POLL)
            continue
        for job_id, args in claimed:  # each job writes its own row, as a handler would
            await cur.execute(DONE, started_row(job_id, args["t"]), prepare=True)
        await cur.execute(floor.COMPLETE_MANY, {"ids": [row[0] for row in claimed]}, prepare=True)


async def _listen(conn: psycopg.AsyncConnection[Any], wakes: asyncio.Semaphore) -> None:
    async for _ in conn.notifies():
        wakes.release()


async def _floor_main(
    dsn: str, channel: str, loops: int, batch: int, ready: Any, stop: Any
) -> None:
    listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    conns = [await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(loops)]
    try:
        for conn in conns:
            await conn.execute("SET jit = off")  # as the floor's and the library's connections
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        wakes = asyncio.Semaphore(0)
        listening = asyncio.ensure_future(_listen(listener, wakes))
        ready.release()
        try:
            await asyncio.gather(*(_floor_loop(conn, batch, wakes, stop) for conn in conns))
        finally:
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening
    finally:
        for conn in [listener, *conns]:
            await conn.close()


def floor_process(dsn: str, channel: str, loops: int, batch: int, ready: Any, stop: Any) -> None:
    """One floor worker process: `loops` connections claiming up to `batch` jobs each,
    woken by `channel`; releases `ready` once it listens, returns once `stop` is set.
    Exits 1 with the traceback on stderr if anything fails."""
    try:
        asyncio.run(_floor_main(dsn, channel, loops, batch, ready, stop))
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
