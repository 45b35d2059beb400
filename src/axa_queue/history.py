"""The history: finished jobs moved out of `axa_queue` to `axa_queue_history`, so the
hot table holds live work (queued, running, in review) and the recently finished.

Housekeeping makes the history's day partitions ahead (`make_days`), moves jobs
finished more than `QueueOptions.keep_recent` ago in bounded batches (`move`), and,
past retention, drops whole days (`drop_days`, through `maintenance.purge`). A worker
moves every `move_interval(options)`; `axa-queue move-history` moves now, which is also
how a database upgraded with millions of finished rows is moved: batch by batch, each
its own short transaction, so it can be stopped and taken up again at any time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from . import sql
from .db.calls import by_name
from .options import QueueOptions

__all__ = [
    "AHEAD_DAYS",
    "DDL_LOCK_TIMEOUT",
    "MOST_DAYS",
    "MOVE_BATCH",
    "STEPS_BATCH",
    "Moved",
    "drop_days",
    "make_days",
    "move",
    "move_interval",
    "purgeable",
]

MOVE_BATCH = 5000
"""Jobs moved per statement: each batch is one short transaction, locking only its rows."""

STEPS_BATCH = 5000
"""Jobs whose durable steps are deleted per statement before their days are dropped."""

AHEAD_DAYS = 2
"""Day partitions made ahead of today, so a move never waits on making one at midnight,
and housekeeping can fail for two days before a move finds no partition."""

MOST_DAYS = 1000
"""The most days back partitions are made for, whatever the retention."""

DDL_LOCK_TIMEOUT = 2.0
"""Seconds making or dropping a partition waits for a lock before giving up until the
next round."""


@dataclass(frozen=True)
class Moved:
    """What one move did: jobs moved (or that would be, in a dry run), partitions made."""

    moved: int
    made: int


def move_interval(options: QueueOptions) -> float:
    """Seconds between a worker's moves: half of `keep_recent` (so a job is moved between
    `keep_recent` and 1.5 times it after it finished), at least `poll_interval`, at most
    `maintenance_interval`."""
    half = options.keep_recent.total_seconds() / 2
    return min(
        max(half, options.poll_interval.total_seconds()),
        options.maintenance_interval.total_seconds(),
    )


async def make_days(
    conn: psycopg.AsyncConnection[Any], retention_seconds: float, *, now: datetime | None = None
) -> tuple[int, datetime]:
    """Make the history's missing day partitions a move needs, from the day the oldest
    finished job inside the retention (`retention_seconds` before `now`) finished, or
    today, to `AHEAD_DAYS` after (`sql.HISTORY_FIRST_DAY`); returns how many were made
    and when the first day began (moves take jobs finished since). The partitions are
    made in a transaction of their own, waiting no longer than `DDL_LOCK_TIMEOUT` for a
    lock; the first day is read before it, with whether any partition is missing (when
    none is, nothing more is sent)."""
    params: dict[str, Any] = {
        "now": now,
        "retention": retention_seconds,
        "most": MOST_DAYS,
        "ahead": AHEAD_DAYS,
    }
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(sql.HISTORY_FIRST_DAY, params)
        first = await cursor.fetchone()
        assert first is not None
        if not first.missing:  # nearly always: no lock, no transaction
            return 0, first.since
        async with conn.transaction():
            await conn.execute(sql.HISTORY_LOCK_TIMEOUT, (f"{round(DDL_LOCK_TIMEOUT * 1000)}ms",))
            await cursor.execute(sql.HISTORY_DAYS, {**params, "first_day": first.first_day})
            row = await cursor.fetchone()
    assert row is not None
    since: datetime = row.since
    return int(row.made), since


async def move(
    conn: psycopg.AsyncConnection[Any],
    keep_seconds: float,
    retention_seconds: float,
    *,
    batch: int = MOVE_BATCH,
    most: int | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
) -> Moved:
    """Move jobs finished more than `keep_seconds` before `now` (default: the database's
    clock) to the history, `batch` at a time, until a batch comes back short (or `most`
    jobs are moved); never a job whose unique key is still held, nor one finished
    before the oldest day kept (`retention_seconds`: `purge` deletes it). Makes the
    partitions first. On an autocommit connection each batch commits on its own."""
    made, since = await make_days(conn, retention_seconds, now=now)
    params: dict[str, Any] = {"keep": keep_seconds, "since": since, "batch": batch, "now": now}
    if dry_run:
        async with conn.cursor(row_factory=by_name) as counting:
            await counting.execute(sql.HISTORY_MOVABLE, params)
            row = await counting.fetchone()
            return Moved(int(row.movable) if row else 0, made)
    total = 0
    async with conn.cursor(row_factory=by_name) as moving:
        while True:
            size = batch if most is None else min(batch, most - total)
            if size <= 0:
                return Moved(total, made)
            await moving.execute(sql.HISTORY_MOVE, {**params, "batch": size})
            row = await moving.fetchone()
            assert row is not None  # an aggregate's one row
            moved = int(row.moved)
            total += moved
            if moved < size:
                return Moved(total, made)
            params["since"] = row.newest  # the next batch starts where this one ended


async def drop_days(
    conn: psycopg.AsyncConnection[Any], older_than_seconds: float, *, now: datetime | None = None
) -> int:
    """Drop the history's days that ended more than `older_than_seconds` before `now`;
    returns how many jobs they held, their attempts (`sql.ATTEMPTS_DROP`), steps
    (`sql.STEPS_DROP`), dependencies
    and workflow places (`sql.WORKFLOWS_DROP`) deleted first.
    Its own transaction, waiting no longer than `DDL_LOCK_TIMEOUT` for a lock; the
    steps go before it, in bounded batches (`sql.STEPS_DROP_BATCH`). Nothing of that is
    sent when the catalog shows no day to drop (`sql.HISTORY_DAYS_PAST`)."""
    params = {"older_than": older_than_seconds, "now": now, "batch": STEPS_BATCH}
    async with conn.cursor(row_factory=by_name) as looking:
        await looking.execute(sql.HISTORY_DAYS_PAST, params)
        past = await looking.fetchone()
    if past is None or not past.past:  # nearly every round: no day to drop
        return 0
    after = "00000000-0000-0000-0000-000000000000"
    while True:
        async with conn.cursor(row_factory=by_name) as batch:
            await batch.execute(sql.STEPS_DROP_BATCH, {**params, "after": after})
            done = await batch.fetchone()
        if done is None or done.jobs < STEPS_BATCH or done.last is None:
            break
        after = done.last
    async with conn.transaction():
        await conn.execute(sql.HISTORY_LOCK_TIMEOUT, (f"{round(DDL_LOCK_TIMEOUT * 1000)}ms",))
        # Their jobs' attempts, steps, dependencies and workflow places first, in the
        # same transaction: a drop given up keeps them all.
        await conn.execute(sql.ATTEMPTS_DROP, {"older_than": older_than_seconds, "now": now})
        await conn.execute(sql.STEPS_DROP, {"older_than": older_than_seconds, "now": now})
        await conn.execute(sql.WORKFLOWS_DROP, {"older_than": older_than_seconds, "now": now})
        async with conn.cursor(row_factory=by_name) as cursor:
            await cursor.execute(sql.HISTORY_DROP, {"older_than": older_than_seconds, "now": now})
            row = await cursor.fetchone()
    return int(row.dropped) if row else 0


async def purgeable(
    conn: psycopg.AsyncConnection[Any], older_than_seconds: float, *, now: datetime | None = None
) -> int:
    """How many moved jobs `drop_days` would drop now."""
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(sql.HISTORY_PURGEABLE, {"older_than": older_than_seconds, "now": now})
        row = await cursor.fetchone()
    return int(row.purgeable) if row else 0
