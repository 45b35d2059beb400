"""Queue: the handle a service holds. Handlers, limits and schedules are registered on
it at import time, with no I/O; `open()` connects (and sets the tables up); `run()`
works the jobs; the rest queues and inspects.

The DSN may be given to `Queue(...)`, to `open(dsn)`, or by `AXA_QUEUE_DSN` (then
`DATABASE_URL`), so a module can define its queue before any database is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from types import TracebackType
from typing import Any, TypeVar, overload
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff
from typing_extensions import Unpack

from . import maintenance, schedules, sql
from .acts import Act, acts_call
from .errors import NotOpenError, OptionsError, ScheduleError, SchemaError
from .handlers import HandlerFunction, JobHandler
from .jobs import (
    Counts,
    JobInfo,
    JobOptions,
    JobState,
    NewJob,
    as_new_job,
    counts_by_name_call,
    counts_call,
    enqueue_call,
    enqueue_many_call,
    job_call,
    jobs_call,
)
from .maintenance import Recovered
from .options import DSN_VARIABLES, Duration, QueueOptions, dsn_from_environment, to_seconds
from .schedules import Schedule, ScheduleInfo, schedule_info
from .statements import Call, run_async
from .sync import SyncQueue
from .worker import RunObserver, Worker

__all__ = ["DSN_VARIABLES", "Queue"]

log = logging.getLogger("axa_queue")

A = TypeVar("A")
T = TypeVar("T")


ACTS_TRIGGERS = ("axa_job_acts_refuse", "axa_job_acts_refuse_truncate")
"""The refusing triggers `check` requires, each set to fire always."""

SEEN_EVERY = 30.0
"""Seconds between notes that this process still has its schedules in code."""


class Queue:
    """A PostgreSQL job queue: register handlers, open, then enqueue, inspect and run.

    Making one does no I/O. Use `async with queue:` or `await queue.open()` /
    `await queue.close()` around database work.
    """

    def __init__(self, dsn: str | None = None, options: QueueOptions | None = None) -> None:
        self.dsn = dsn
        self.options = options if options is not None else QueueOptions()
        self.handlers: dict[str, JobHandler[Any]] = {}
        self.limits: dict[str, int] = {}
        self.schedule_list: list[Schedule] = []
        self.schema = "public"
        self.notifies = False
        self._pool: AsyncConnectionPool | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._seen_at = 0.0
        self.worker: Worker | None = None
        self.observers: list[RunObserver] = []

    def __repr__(self) -> str:
        state = "open" if self._pool is not None else "closed"
        return (
            f"<Queue {state} handlers={len(self.handlers)} limits={len(self.limits)} "
            f"schedules={len(self.schedule_list)} workers={self.options.workers}>"
        )

    # --- registration (no I/O) ---------------------------------------------------------

    @overload
    def handler(self, name: str) -> Callable[[HandlerFunction[A]], JobHandler[A]]: ...
    @overload
    def handler(self, name: HandlerFunction[A]) -> JobHandler[A]: ...
    def handler(
        self, name: str | HandlerFunction[A]
    ) -> Callable[[HandlerFunction[A]], JobHandler[A]] | JobHandler[A]:
        """Register the decorated function for jobs named `name` (or, used bare, for
        jobs named after the function). Returns a `JobHandler`, callable as before."""
        if callable(name):
            return self.handle(getattr(name, "__name__", repr(name)), name)

        def register(fn: HandlerFunction[A]) -> JobHandler[A]:
            return self.handle(name, fn)

        return register

    def handle(self, name: str, fn: HandlerFunction[A]) -> JobHandler[A]:
        """Run `fn` for jobs named `name`; registering a name again replaces its handler."""
        if not isinstance(name, str) or not name.strip():
            raise OptionsError(f"expected a job name to be a non-empty string, got: {name!r}")
        if not callable(fn):
            raise OptionsError(f"expected the handler of job {name!r} to be callable, got: {fn!r}")
        registered = JobHandler(self, name, fn)
        self.handlers[name] = registered
        return registered

    def limit(self, name: str, jobs: int) -> None:
        """Run at most `jobs` (at least one) jobs named `name` at once in this process.
        Other names keep the remaining loops busy. Not a limit across processes."""
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
            raise OptionsError(
                f"expected the limit of job {name!r} to be a positive integer, got: {jobs!r}"
            )
        self.limits[name] = jobs

    def schedule(self, schedule: Schedule) -> Schedule:
        """Queue `schedule.job` on every due time of `schedule`. Refuses a name twice."""
        if any(s.name == schedule.name for s in self.schedule_list):
            raise ScheduleError(f"the schedule {schedule.name!r} was added twice")
        self.schedule_list.append(schedule)
        return schedule

    def observe(self, observer: RunObserver) -> RunObserver:
        """Call `observer(job name, outcome, seconds)` as each run in this process ends:
        `outcome` is `completed`, `retried`, `failed` or `lost`, told once the ending is
        recorded, and `seconds` is how long the handler ran. It runs on the event loop,
        so it must be quick; what it raises is logged. It is never given the arguments.
        Returns `observer`, so it can be used as a decorator. For metrics."""
        self.observers.append(observer)
        return observer

    def handled(self) -> set[str]:
        """The job names this queue has handlers for."""
        return set(self.handlers)

    # --- connection --------------------------------------------------------------------

    @property
    def pool(self) -> AsyncConnectionPool:
        """The queue's connection pool (autocommit connections)."""
        if self._pool is None:
            raise NotOpenError()
        return self._pool

    @property
    def is_open(self) -> bool:
        """Whether `open()` has connected."""
        return self._pool is not None

    def connect_kwargs(self) -> dict[str, Any]:
        """Connection settings the queue uses."""
        return {"prepare_threshold": 5 if self.options.prepare else None}

    async def open(self, dsn: str | None = None, *, setup: bool = True) -> Queue:
        """Connect, then set the tables up under the advisory lock (`setup=True`) or only
        check them (`setup=False`, for a role that may not run DDL).

        Raises psycopg's `OperationalError` when the database cannot be reached and
        `SchemaError` when the check fails, so a service finds out at boot.
        """
        if self._pool is not None:
            return self
        self.dsn = dsn or self.dsn or dsn_from_environment()
        if not self.dsn:
            raise OptionsError(
                "no database given: pass a DSN to Queue(...) or open(...), or set AXA_QUEUE_DSN"
            )
        async with await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, **self.connect_kwargs()
        ) as conn:
            if setup:
                await _setup(conn)
            await _check(conn)
            row = await (await conn.execute(sql.CURRENT_SCHEMA)).fetchone()
            self.schema = row[0] if row and row[0] else "public"
            row = await (await conn.execute(sql.HAS_NOTIFY_TRIGGER)).fetchone()
            self.notifies = bool(row and row[0])
        if self.options.listen and not self.notifies:
            log.warning(
                "inserts do not notify (run setup to add the axa_queue_notify trigger); "
                "workers find new jobs by polling only"
            )
        pool = QuickPool(
            self.dsn,
            min_size=1,
            max_size=self.options.connections,
            kwargs={"autocommit": True, **self.connect_kwargs()},
            configure=_configure,
            open=False,
            name="axa-queue",
        )
        await pool.open(wait=True, timeout=30)
        self._pool = pool
        return self

    async def close(self) -> None:
        """Wait for background tasks started by `perform_later`, then close the pool."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    async def __aenter__(self) -> Queue:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection from the queue's pool, in a transaction that commits when the
        block ends (and rolls back on an error): for acts and the caller's own writes."""
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def _run(self, call: Call[T]) -> T:
        async with self.pool.connection() as conn:
            return await run_async(conn, call)

    async def setup(self) -> None:
        """Run `SETUP_STATEMENTS` in one transaction under the setup lock."""
        async with self.pool.connection() as conn:
            await _setup(conn)

    async def check(self) -> None:
        """Raise `SchemaError` unless every table, column and refusing trigger is there."""
        async with self.pool.connection() as conn:
            await _check(conn)

    async def ping(self) -> None:
        """Raise unless the database answers."""
        async with self.pool.connection() as conn:
            await conn.execute(sql.PING)

    # --- queuing -----------------------------------------------------------------------

    async def enqueue(
        self,
        job: str | NewJob,
        args: Any = None,
        **options: Unpack[JobOptions],
    ) -> UUID:
        """Queue a job (a `NewJob`, or a name with its arguments and options) on the
        queue's own connection, in one round trip, and return its id. It outlives any
        rollback of the caller's: use `enqueue_on` to queue in a transaction."""
        job = as_new_job(job, args, **options)
        return await self._run(enqueue_call(job))

    async def enqueue_all(self, jobs: Iterable[NewJob]) -> list[UUID]:
        """Queue every job in one statement: all are queued or none. Ids in order."""
        return await self._run(enqueue_many_call(list(jobs)))

    def sync(self) -> SyncQueue:
        """A `SyncQueue` on the same database and options, for synchronous code."""
        return SyncQueue(self.dsn, self.options)

    def start_background(self, name: str, work: Coroutine[Any, Any, Any]) -> None:
        """Run `work` as a task of this process (the `background` mode); `close()` waits."""

        async def guarded() -> None:
            try:
                await work
            except Exception as error:
                log.error("background job failed", extra={"job": name, "error": str(error)})

        task = asyncio.get_running_loop().create_task(guarded(), name=f"axa-queue-bg-{name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- inspection --------------------------------------------------------------------

    async def job(self, job_id: UUID | str) -> JobInfo | None:
        """What the queue knows of one job (never its arguments), or `None`."""
        return await self._run(job_call(_uuid(job_id)))

    async def jobs(
        self, state: JobState | str | None = None, name: str | None = None, limit: int = 50
    ) -> list[JobInfo]:
        """The newest jobs, optionally of one state and name, without arguments."""
        return await self._run(jobs_call(state, name, limit))

    async def counts(self) -> Counts:
        """How many jobs are in each state."""
        return await self._run(counts_call())

    async def counts_by_name(self) -> dict[str, Counts]:
        """How many jobs of each name are in each state."""
        return await self._run(counts_by_name_call())

    async def acts(self, job_id: UUID | str) -> list[Act]:
        """Every act a person did to the job, oldest first; kept after its row is purged."""
        return await self._run(acts_call(_uuid(job_id)))

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule in the table, archived or not, with its last job's state."""
        async with self.pool.connection() as conn:
            cursor = await conn.execute(sql.SCHEDULES)
            return [schedule_info(row) for row in await cursor.fetchall()]

    # --- housekeeping ------------------------------------------------------------------

    async def recover_stale(self, *, dry_run: bool = False) -> list[Recovered]:
        """Queue again (or fail, when out of attempts) runs not heard from for
        `stale_after`; with `dry_run`, only say which."""
        async with self.pool.connection() as conn:
            return await maintenance.recover_stale(
                conn,
                self.options.seconds("stale_after"),
                self.options.max_attempts,
                dry_run=dry_run,
            )

    async def purge(self, older_than: Duration | None = None, *, dry_run: bool = False) -> int:
        """Delete finished rows older than `older_than` (default: the retention period);
        returns how many went (or would go, with `dry_run`)."""
        seconds = (
            self.options.seconds("retention")
            if older_than is None
            else to_seconds(older_than, "older_than")
        )
        async with self.pool.connection() as conn:
            return await maintenance.purge(conn, seconds, dry_run=dry_run)

    async def archive_schedules(self) -> int:
        """Archive schedules no live process has in code; returns how many."""
        async with self.pool.connection() as conn:
            return await maintenance.archive_schedules(
                conn, [s.name for s in self.schedule_list], self.options.seconds("stale_after")
            )

    async def tick_schedules(self) -> int:
        """Queue a job for each due schedule; returns how many were queued. `run()` calls
        this every poll; any number of processes may call it at once."""
        if not self.schedule_list:
            return 0
        loop = asyncio.get_running_loop()
        async with self.pool.connection() as conn:
            every = min(SEEN_EVERY, self.options.seconds("stale_after") / 4)
            if loop.time() - self._seen_at >= every or self._seen_at == 0.0:
                await schedules.mark_seen(conn, self.schedule_list)
                self._seen_at = loop.time()
            due = set(await schedules.due(conn, self.schedule_list))
            queued = 0
            for schedule in self.schedule_list:
                if schedule.name in due and await schedules.tick_one(conn, schedule) is not None:
                    queued += 1
            return queued

    # --- running -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run jobs, schedules and housekeeping until `stop` is set; jobs in progress then
        finish (see `QueueOptions.shutdown_grace`) before this returns. Cancelling it
        aborts jobs in progress and leaves them for stale recovery."""
        if not self.handlers and not self.schedule_list:
            log.warning("run() has no handlers and no schedules: it only does housekeeping")
        self.worker = Worker(self)
        await self.worker.run(stop if stop is not None else asyncio.Event())


RECONNECT_DELAYS = (0.05, 0.5)
"""The pool's first wait between tries to connect again, and the longest: psycopg_pool's
own (1, 2, 4, 8 s ...) would leave handlers and housekeeping waiting for seconds after
the database is back."""


class _QuickAttempt(AttemptWithBackoff):
    """psycopg_pool's reconnect backoff, capped at `RECONNECT_DELAYS[1]`."""

    INITIAL_DELAY = RECONNECT_DELAYS[0]

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_DELAYS[1])


class QuickPool(AsyncConnectionPool):
    """The queue's pool: reconnects within half a second of the database coming back."""

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        await super()._add_connection(
            attempt or _QuickAttempt(timeout=self.reconnect_timeout), growing
        )


def _uuid(value: UUID | str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise OptionsError(f"expected a job id (a UUID), got: {value!r}") from None


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(sql.SESSION_SETTINGS)


async def _setup(conn: psycopg.AsyncConnection[Any]) -> None:
    async with conn.transaction():
        await conn.execute(sql.TAKE_SETUP_LOCK, (sql.SETUP_LOCK,))
        for statement in sql.SETUP_STATEMENTS:
            await conn.execute(statement)


async def _check(conn: psycopg.AsyncConnection[Any]) -> None:
    for statement, table in (
        (sql.CHECK_QUEUE, "axa_queue"),
        (sql.CHECK_SCHEDULE, "axa_schedule"),
        (sql.CHECK_ACTS, "axa_job_acts"),
    ):
        try:
            async with conn.transaction():
                await conn.execute(statement)
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as error:
            raise SchemaError(
                f"the job queue's table {table} is missing or out of date ({error.diag.message_primary}): "
                "run the setup statements (`axa-queue setup`, or `axa-queue sql` in a migration)"
            ) from None
    cursor = await conn.execute(sql.MISSING_TRIGGERS, (list(ACTS_TRIGGERS),))
    missing = [row[0] for row in await cursor.fetchall()]
    if missing:
        raise SchemaError(
            f"the job queue is missing, or has turned off, the trigger(s) {', '.join(missing)} "
            "on axa_job_acts, so acts could be changed: run the setup statements "
            "(`axa-queue setup`, or `axa-queue sql` in a migration)"
        )
