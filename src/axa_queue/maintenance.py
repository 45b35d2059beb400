"""Housekeeping: stale recovery, moving finished jobs to the history, retention,
archiving schedules no longer in code, and rebuilding the hot table's bloated indexes.

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
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from . import history, sql
from .db.calls import by_name
from .db.connector import Connector
from .handlers.registry import Registry
from .handlers.retries import first_line, kind
from .jobs.model import JobState
from .limits import AttemptLimits
from .options import Duration, QueueOptions, to_seconds
from .presence import FORGET_AFTER
from .schedules.schedule import Schedule, Ticker
from .schema import indexes

__all__ = [
    "PURGE_BATCH",
    "Maintenance",
    "Recovered",
    "archive_schedules",
    "forget_workers",
    "give_back_gone",
    "log_given_back",
    "log_recovered",
    "move_history",
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


async def give_back_gone(
    conn: psycopg.AsyncConnection[Any],
    beat_seconds: float,
    attempts: AttemptLimits,
    worker: UUID,
    *,
    now: datetime | None = None,
) -> list[Recovered]:
    """Queue again at once the runs a gone worker process claimed ahead and never
    started (its attempt given back: `sql.GIVE_BACK_GONE`), never one of `worker` (the
    process asking, whose heartbeat interval is `beat_seconds`: what a process without a
    row in `axa_workers` is judged by). `attempts` is the limit raised for a job stored
    without one (`limits.AttemptLimits`). `now` is the time to judge by (default: the
    database's clock)."""
    params = {
        **attempts.params(),
        "give_back": sql.GIVE_BACK_LIMIT,
        "beat_ms": max(1, round(beat_seconds * 1000)),
        "worker": worker,
        "now": now,
    }
    async with conn.cursor(row_factory=by_name) as cursor:
        await cursor.execute(sql.GIVE_BACK_GONE, params)
        return [
            Recovered(UUID(r.id), r.name, r.attempts, JobState.QUEUED)
            for r in await cursor.fetchall()
        ]


def log_given_back(given: list[Recovered]) -> None:
    """Log each run of a gone process given back."""
    for one in given:
        log.warning(
            "gave back a job its worker process claimed ahead and never started (the "
            "process is gone): %s %s (attempt %d), queued again, its attempt given back",
            one.name,
            one.id,
            one.attempts,
            extra={"job_id": str(one.id), "job": one.name, "attempt": one.attempts},
        )


async def purge(
    conn: psycopg.AsyncConnection[Any],
    older_than_seconds: float,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
) -> int:
    """Remove finished jobs past `older_than_seconds` before `now` (default: the
    database's clock): the history's days that ended before then are dropped whole
    (`history.drop_days`), and the completed, failed and cancelled rows still in
    `axa_queue` last changed before then are deleted in bounded batches; never a job
    waiting for review. Returns how many went (or, with `dry_run`, would go)."""
    params = {"older_than": older_than_seconds, "batch": PURGE_BATCH, "now": now}
    if dry_run:
        async with conn.cursor(row_factory=by_name) as counting:
            await counting.execute(sql.PURGEABLE, params)
            row = await counting.fetchone()
            hot = int(row.purgeable) if row else 0
        return hot + await history.purgeable(conn, older_than_seconds, now=now)
    total = await history.drop_days(conn, older_than_seconds, now=now)
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
    # Behind a transaction pooler, the rebuild's session lock and lock_timeout would
    # land on whichever server connection each statement gets: `axa-queue reindex`
    # on a direct connection does it there.
    if options.rebuild_indexes and options.resolved_pooler() != "transaction":
        try:
            async with pool.connection() as conn:
                indexes.log_rebuilt(await indexes.rebuild(conn))
        except psycopg.Error as error:
            log.error(
                "could not rebuild bloated indexes (%s)",
                kind(error),
                extra={"error": first_line(error)},
            )
            failure = failure or error
    return failure


async def move_history(pool: AsyncConnectionPool, options: QueueOptions) -> psycopg.Error | None:
    """Move the jobs finished more than `keep_recent` ago to the history
    (`history.move`); a failure is logged, not raised, and returned."""
    try:
        async with pool.connection() as conn:
            done = await history.move(
                conn, options.keep_recent.total_seconds(), options.retention.total_seconds()
            )
    except psycopg.Error as error:
        log.error(
            "could not move finished jobs to the history (%s)",
            kind(error),
            extra={"error": first_line(error)},
        )
        return error
    if done.moved:
        log.info("moved finished jobs to the history (%d)", done.moved, extra={"moved": done.moved})
    return None


class Keeper(Protocol):
    """What `Maintenance` needs of the queue it is part of."""

    connector: Connector
    ticker: Ticker
    registry: Registry

    @property
    def pool(self) -> AsyncConnectionPool: ...
    @property
    def options(self) -> QueueOptions: ...
    @property
    def schedule_list(self) -> list[Schedule]: ...


class Maintenance:
    """The housekeeping methods of `Queue`, each a round of one chore on its pool, for
    the command line and tests (a worker does them on its own: `worker.housekeeping`)."""

    async def recover_stale(
        self: Keeper, *, dry_run: bool = False, now: datetime | None = None
    ) -> list[Recovered]:
        """Queue again (or fail, when out of attempts) runs not heard from for
        `stale_after` before `now` (default: the database's clock); with `dry_run`, only
        say which. A job stored without `max_attempts` counts its attempts against its
        handler's here, else `QueueOptions.max_attempts` (`limits.AttemptLimits`)."""
        async with self.pool.connection() as conn:
            return await recover_stale(
                conn,
                self.options.stale_after.total_seconds(),
                self.registry.attempt_limits(self.options.max_attempts),
                dry_run=dry_run,
                now=now,
            )

    async def purge(
        self: Keeper,
        older_than: Duration | None = None,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> int:
        """Remove finished jobs older than `older_than` (default: the retention period)
        at `now` (default: the database's clock): the history's whole days before then
        dropped, the finished rows still in `axa_queue` deleted; returns how many went
        (or would go, with `dry_run`)."""
        seconds = (
            self.options.retention.total_seconds()
            if older_than is None
            else to_seconds(older_than, "older_than")
        )
        async with self.pool.connection() as conn:
            return await purge(conn, seconds, dry_run=dry_run, now=now)

    async def move_history(
        self: Keeper,
        keep_recent: Duration | None = None,
        *,
        most: int | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> history.Moved:
        """Move finished jobs to the history table now, in bounded batches, each
        committed on its own (stopped, it is taken up where it was): those finished more
        than `keep_recent` (default: `QueueOptions.keep_recent`) before `now` (default:
        the database's clock), at most `most`; never one whose unique key is still held.
        Every read finds a job moved as before. Returns how many were moved (or would
        be, with `dry_run`) and how many day partitions were made."""
        keep = (
            self.options.keep_recent.total_seconds()
            if keep_recent is None
            else to_seconds(keep_recent, "keep_recent")
        )
        async with self.pool.connection() as conn:
            return await history.move(
                conn,
                keep,
                self.options.retention.total_seconds(),
                most=most,
                dry_run=dry_run,
                now=now,
            )

    async def rebuild_indexes(self: Keeper, *, dry_run: bool = False) -> list[indexes.Rebuilt]:
        """Rebuild the indexes of `axa_queue` grown far past what a fresh build would
        take (`schema.indexes.rebuild`, which a worker's housekeeping does every
        `maintenance_interval` unless `QueueOptions.rebuild_indexes` is off); with
        `dry_run`, only say which."""
        async with self.pool.connection() as conn:
            return await indexes.rebuild(conn, dry_run=dry_run)

    async def archive_schedules(self: Keeper, *, now: datetime | None = None) -> int:
        """Archive schedules no live process has in code (as of `now`, default the
        database's clock); returns how many."""
        async with self.pool.connection() as conn:
            return await archive_schedules(
                conn,
                [s.name for s in self.schedule_list],
                self.options.stale_after.total_seconds(),
                now=now,
            )

    async def tick_schedules(self: Keeper, *, now: datetime | None = None) -> int:
        """Queue a job for each due schedule; returns how many were queued. A worker
        ticks every poll (`tick_each`); any number of processes may tick at once. A schedule that
        fails does not keep the others from queuing their jobs: its error is raised
        once they all have had their turn. `now` is the time to tick at (default: the
        database's clock; tests pass a later one to let intervals pass)."""
        queued, failures = await _tick_each(self, now)
        for error in failures.values():
            raise error
        return queued

    async def tick_each(
        self: Keeper, *, now: datetime | None = None
    ) -> tuple[int, dict[str, Exception]]:
        """Queue a job for each due schedule, each on its own; returns how many were
        queued and what each schedule that failed raised, by name (`Ticker`).
        Without `now`, the test clock (`connector.clock`), as the worker's other
        statements take it, else the database's."""
        return await _tick_each(self, now)


async def _tick_each(queue: Keeper, now: datetime | None) -> tuple[int, dict[str, Exception]]:
    if not queue.schedule_list:
        return 0, {}
    async with queue.pool.connection() as conn:
        return await queue.ticker.tick(
            conn,
            stale_after=queue.options.stale_after.total_seconds(),
            now=queue.connector.clock if now is None else now,
        )
