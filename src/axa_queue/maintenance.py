"""Housekeeping: stale recovery, retention, and archiving schedules no longer in code.

A worker does a round at once and then every `maintenance_interval`; its stale
recovery waits until the worker has been connected for `stale_after` (see
`worker.housekeeping`). Any number of processes may do it at once: each statement
decides its rows in the database. A failed round is logged; the next one tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import sql
from .db.calls import by_name
from .handlers.retries import first_line, kind
from .jobs.model import JobState
from .limits import AttemptLimits
from .options import QueueOptions
from .presence import FORGET_AFTER
from .schedules.schedule import Schedule

__all__ = [
    "PURGE_BATCH",
    "Recovered",
    "archive_schedules",
    "forget_workers",
    "log_recovered",
    "purge",
    "recover_stale",
    "run_once",
]

log = logging.getLogger("axa_queue.maintenance")

PURGE_BATCH = 5000
"""Rows deleted per statement, so retention never holds long locks or bloats WAL at once."""


@dataclass(frozen=True)
class Recovered:
    """A stale run that recovery queued again or failed."""

    id: UUID
    name: str
    attempts: int
    state: JobState
    """`QUEUED` when it had attempts left, `FAILED` ("abandoned by its worker") if not."""


async def recover_stale(
    conn: psycopg.AsyncConnection[Any],
    stale_seconds: float,
    attempts: AttemptLimits,
    *,
    dry_run: bool = False,
    held: tuple[str, str] = ("{}", "{}"),
    now: datetime | None = None,
) -> list[Recovered]:
    """Recover runs not heard from for `stale_seconds`: queued again with attempts left
    (by the job's own limit, else its handler's, else the queue's: `attempts`, the
    recovering process's `limits.AttemptLimits`), else failed; a run claimed ahead whose
    handler never started is queued with its attempt given back (see
    `sql.RECOVER_STALE`). Nothing is recovered
    within `stale_seconds` of the server's start, nor a run in `held` (array literals
    of ids and attempts: the runs the caller holds; see `sql.RECOVER_STALE`). With
    `dry_run`, only say what would be done. `now` is the time to judge by (default: the
    database's clock; tests pass a later one to let the stale period pass)."""
    params = {
        "stale": stale_seconds,
        **attempts.params(),
        "give_back": sql.GIVE_BACK_LIMIT,
        "held": held[0],
        "held_attempts": held[1],
        "now": now,
    }
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(sql.STALE if dry_run else sql.RECOVER_STALE, params)
        return [
            Recovered(r.id, r.name, r.attempts, JobState(r.status)) for r in await cursor.fetchall()
        ]


async def purge(
    conn: psycopg.AsyncConnection[Any],
    older_than_seconds: float,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
) -> int:
    """Delete completed, failed and cancelled rows last changed more than
    `older_than_seconds` before `now` (default: the database's clock), in bounded
    batches; never a job waiting for review. Returns how many went (or, with `dry_run`,
    would go)."""
    params = {"older_than": older_than_seconds, "batch": PURGE_BATCH, "now": now}
    if dry_run:
        async with conn.cursor(row_factory=by_name) as counting:
            await counting.execute(sql.PURGEABLE, params)
            row = await counting.fetchone()
            return int(row.purgeable) if row else 0
    total = 0
    while True:
        cursor = await conn.execute(sql.PURGE, params)
        total += cursor.rowcount
        if cursor.rowcount < PURGE_BATCH:
            return total


async def archive_schedules(
    conn: psycopg.AsyncConnection[Any],
    in_code: list[str],
    stale_seconds: float,
    *,
    now: datetime | None = None,
) -> int:
    """Archive schedules that no live process has in code (unseen for `stale_seconds`
    before `now`, default the database's clock, and not in `in_code`); returns how many.
    Rows are kept, for audit."""
    cursor = await conn.execute(
        sql.SCHEDULE_ARCHIVE, {"in_code": in_code, "stale": stale_seconds, "now": now}
    )
    return cursor.rowcount


async def forget_workers(
    conn: psycopg.AsyncConnection[Any],
    after_seconds: float = FORGET_AFTER,
    *,
    now: datetime | None = None,
) -> int:
    """Remove the `axa_workers` rows of processes not heard from for `after_seconds`
    before `now` (default: the database's clock); returns how many."""
    cursor = await conn.execute(sql.WORKERS_FORGET, {"after": after_seconds, "now": now})
    return cursor.rowcount


def log_recovered(recovered: list[Recovered]) -> None:
    """Log each run stale recovery queued again or failed."""
    for one in recovered:
        log.warning(
            "recovered a job abandoned by its worker: %s %s (attempt %d), now %s",
            one.name,
            one.id,
            one.attempts,
            one.state.value,
            extra={
                "job_id": str(one.id),
                "job": one.name,
                "attempt": one.attempts,
                "state": one.state.value,
            },
        )


async def run_once(
    pool: AsyncConnectionPool,
    options: QueueOptions,
    schedules: Sequence[Schedule],
    *,
    recover: AttemptLimits | None = None,
) -> psycopg.Error | None:
    """One round of housekeeping on `pool` (the `schedules` in code are kept); failures
    are logged, not raised: returns the first, if any (for the worker's health check).
    With `recover` (the attempt limits to judge by), it recovers stale runs too; a
    worker does not, and recovers them itself (`worker.housekeeping`), on its own
    connection, once connected for `stale_after`, and never the runs it holds."""
    failure: psycopg.Error | None = None
    stale = options.stale_after.total_seconds()
    try:
        async with pool.connection() as conn:
            archived = await archive_schedules(conn, [s.name for s in schedules], stale)
            if archived:
                log.info(
                    "archived schedules no longer in code (%d)",
                    archived,
                    extra={"archived": archived},
                )
    except psycopg.Error as error:
        log.error(
            "could not archive schedules (%s)", kind(error), extra={"error": first_line(error)}
        )
        failure = failure or error
    if recover is not None:
        try:
            async with pool.connection() as conn:
                log_recovered(await recover_stale(conn, stale, recover))
        except psycopg.Error as error:
            log.error(
                "could not recover stale jobs (%s)", kind(error), extra={"error": first_line(error)}
            )
            failure = failure or error
    try:
        async with pool.connection() as conn:
            await forget_workers(conn)
    except psycopg.Error as error:
        log.error(
            "could not remove dead worker processes (%s)",
            kind(error),
            extra={"error": first_line(error)},
        )
        failure = failure or error
    try:
        async with pool.connection() as conn:
            purged = await purge(conn, options.retention.total_seconds())
            if purged:
                log.info(
                    "purged finished jobs past retention (%d)", purged, extra={"purged": purged}
                )
    except psycopg.Error as error:
        log.error("could not purge old jobs (%s)", kind(error), extra={"error": first_line(error)})
        failure = failure or error
    return failure
