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
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar, overload
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool
from typing_extensions import Unpack

from . import maintenance, schema, sql
from .acts import Act, acts_call
from .db.calls import Call, by_name, run_async
from .db.connector import Connected, Connector
from .errors import AxaQueueError, DrainError, NotOpenError, OptionsError, ScheduleError
from .handlers.handler import HandlerFunction, JobHandler
from .handlers.policies import PolicyOptions, policy_of
from .handlers.registry import Registry, RunObserver
from .handlers.retries import describe, first_line, kind
from .health import HEALTH_TIMEOUT, Health
from .jobs import modes
from .jobs.model import (
    Counts,
    JobInfo,
    JobOptions,
    JobState,
    NewJob,
    as_new_job,
    check_name,
    counts_by_name_call,
    counts_call,
    enqueue_call,
    enqueue_many_call,
    enqueue_unique_on,
    enqueue_unique_one_on,
    job_call,
    job_id_of,
    jobs_call,
    result_call,
)
from .jobs.waits import Waiters
from .lifespan import Hosted
from .maintenance import Recovered
from .middleware import Middleware
from .middleware import check as check_middleware
from .options import (
    DSN_VARIABLES,
    Duration,
    Mode,
    QueueOptions,
    to_seconds,
)
from .schedules.schedule import Schedule, ScheduleInfo, Ticker, schedule_info
from .sync import SyncQueue
from .worker import STUCK_AFTER, Phase, Worker
from .worker.drain import DrainResult, drain, drain_blocking

__all__ = ["DSN_VARIABLES", "Queue"]

log = logging.getLogger("axa_queue")

A = TypeVar("A")
T = TypeVar("T")


TRANSIENT_REFUSALS = (
    "starting up",
    "shutting down",
    "in recovery",
    "too many clients",
    "connection slots are reserved",
)
"""What a server that is there but not ready says when it refuses a connection."""


def refused(error: psycopg.OperationalError) -> bool:
    """Whether the server answered and refused this login for good (a wrong role,
    password or database name), so waiting for it would not help. psycopg gives no
    SQLSTATE for a failed connection: the server's answer is a `FATAL:` in its text."""
    text = str(error)
    return "FATAL:" in text and not any(word in text for word in TRANSIENT_REFUSALS)


class Queue(Connected):
    """A PostgreSQL job queue: register handlers, open, then enqueue, inspect and run.

    Making one does no I/O. Use `async with queue:` or `await queue.open()` /
    `await queue.close()` around database work.
    """

    def __init__(self, dsn: str | None = None, options: QueueOptions | None = None) -> None:
        self.connector = Connector(options if options is not None else QueueOptions(), dsn)
        """How this queue connects: every pool and connection is made by it."""
        self.registry = Registry()
        """Its handlers, limits, schedules, observers and middleware."""
        self.schema = "public"
        self.notifies = False
        self._pool: AsyncConnectionPool | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.ticker = Ticker(self.registry.schedules)
        self.worker: Worker | None = None
        self.waiters = Waiters(self.connector, self.job)
        """Every `wait()` in progress, woken through one listening connection."""
        self._hosted: Hosted | None = None

    @property
    def handlers(self) -> dict[str, JobHandler[Any]]:
        """The handlers by job name (see `Registry`)."""
        return self.registry.handlers

    @property
    def limits(self) -> dict[str, int]:
        """The per-name limits of this process (see `limits.Limits`)."""
        return self.registry.limits.process

    @property
    def schedule_list(self) -> list[Schedule]:
        """The schedules in code (see `Registry`)."""
        return self.registry.schedules

    @property
    def observers(self) -> list[RunObserver]:
        """The run observers (see `Registry`)."""
        return self.registry.observers

    def __repr__(self) -> str:
        state = "open" if self._pool is not None else "closed"
        return (
            f"<Queue {state} handlers={len(self.handlers)} limits={len(self.limits)} "
            f"schedules={len(self.schedule_list)} workers={self.options.workers}>"
        )

    # --- registration (no I/O) ---------------------------------------------------------

    @overload
    def handler(
        self, name: str, *, replace: bool = False, **policy: Unpack[PolicyOptions]
    ) -> Callable[[HandlerFunction[A]], JobHandler[A]]: ...
    @overload
    def handler(
        self, name: HandlerFunction[A], *, replace: bool = False, **policy: Unpack[PolicyOptions]
    ) -> JobHandler[A]: ...
    def handler(
        self,
        name: str | HandlerFunction[A],
        *,
        replace: bool = False,
        **policy: Unpack[PolicyOptions],
    ) -> Callable[[HandlerFunction[A]], JobHandler[A]] | JobHandler[A]:
        """Register the decorated function for jobs named `name` (or, used bare, for
        jobs named after the function). Returns a `JobHandler`, callable as before.
        A name already registered is refused unless `replace=True`. The keyword
        arguments are its retry policy and defaults (see `handle`)."""
        if callable(name):
            return self.handle(
                getattr(name, "__name__", repr(name)), name, replace=replace, **policy
            )

        def register(fn: HandlerFunction[A]) -> JobHandler[A]:
            return self.handle(name, fn, replace=replace, **policy)

        return register

    def handle(
        self,
        name: str,
        fn: HandlerFunction[A],
        *,
        replace: bool = False,
        **policy: Unpack[PolicyOptions],
    ) -> JobHandler[A]:
        """Run `fn` for jobs named `name` (1 to `MAX_NAME_CHARS` characters, no NUL or
        lone surrogate). A name already registered raises `OptionsError`, so two modules
        cannot take the same name by mistake; pass `replace=True` to replace its handler.

        Its retry policy (docs/jobs.md): `max_attempts`, `timeout` and `priority` fill
        what a job leaves unset (when this queue queues it, and in the worker for a job
        stored without them); `backoff` (a length, or a function of the attempt such as
        `Exponential()`) replaces `QueueOptions.retry_backoff` for its jobs; `retry_on`
        retries only those exceptions, `discard_on` fails the job at once on those."""
        check_name(name)
        if not callable(fn):
            raise OptionsError(f"expected the handler of job {name!r} to be callable, got: {fn!r}")
        if name in self.handlers and not replace:
            raise OptionsError(
                f"a handler for job {name!r} is already registered "
                f"({self.handlers[name].fn!r}): pass replace=True to replace it"
            )
        registered = JobHandler(self, name, fn, policy_of(name, policy))
        self.handlers[name] = registered
        return registered

    def limit(
        self, name: str, jobs: int, *, scope: Literal["process", "global"] = "process"
    ) -> None:
        """Run at most `jobs` (from one to `limits.MAX_LIMIT`) jobs named `name` at once: in
        this process (`scope="process"`, the default; other names keep the remaining
        loops busy), or across every process and host (`scope="global"`, enforced by
        the claim statement: running jobs of that name are counted under a lock, a
        crashed process's until stale recovery frees them). A name may have both. Every process
        that handles the name must register the same global limit: each claim checks
        the limit its own process registered (docs/handlers.md). Kept and checked by
        `limits.Limits`, as every limit is."""
        check_name(name)
        self.registry.limits.limit(name, jobs, scope)

    def rate_limit(self, name: str, jobs: int, *, per: timedelta) -> None:
        """Start at most `jobs` (from one to `limits.MAX_RATE`) jobs named `name` in any window
        of `per` (a positive `timedelta` of at most `limits.MAX_WINDOW`), counted across every
        process and host: each claim of the name takes one of `jobs` slots kept in the
        database (`axa_rate_slots`), one last taken `per` ago or more, so retries count
        as new starts. Enforced by the claim statement, under the same lock as a global
        limit (`limit(..., scope="global")`), which the name may have as well: both
        apply. Every process that handles the name should register the same rate: each
        claim honours the one its own process registered (docs/handlers.md). Kept and
        checked by `limits.Limits`."""
        check_name(name)
        self.registry.limits.rate_limit(name, jobs, per)

    def schedule(self, schedule: Schedule) -> Schedule:
        """Queue `schedule.job` on every due time of `schedule`. Refuses a name twice."""
        if any(s.name == schedule.name for s in self.schedule_list):
            raise ScheduleError(f"the schedule {schedule.name!r} was added twice")
        self.schedule_list.append(schedule)
        return schedule

    def observe(self, observer: RunObserver) -> RunObserver:
        """Call `observer(job name, outcome, seconds)` as each run in this process ends:
        `outcome` is `completed`, `retried`, `failed`, `lost` or `cancelled` (its job
        cancelled by a person while it ran), told once the ending is recorded, and `seconds` is how long the handler ran. It runs on the event loop,
        so it must be quick; what it raises is logged. It is never given the arguments.
        Returns `observer`, so it can be used as a decorator. For metrics."""
        self.observers.append(observer)
        return observer

    def middleware(self, fn: Middleware) -> Middleware:
        """Wrap every run of this process's worker in `fn`, an `async def fn(job,
        call_next)`: `job` is the run's `JobContext`, and `await call_next()` runs the
        rest (later middleware, then the handler, async or in its thread) and returns
        the handler's value. The first registered is the outermost; what `fn` raises is
        the run's outcome (a failure, retried as the job's attempts allow). The run's
        timeout and fencing apply to the whole chain. Returns `fn`, so it can be used
        as a decorator. Not given the arguments."""
        check_middleware(fn)
        self.registry.middleware.append(fn)
        return fn

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

    async def open(self, dsn: str | None = None, *, setup: bool = True) -> Queue:
        """Connect, then set the tables up (`setup=True`) or only check them
        (`setup=False`, for a role that may not run DDL).

        Setup first reads the catalogs, taking no lock an application's transaction
        could hold: with nothing to change (every start after the first) it changes
        nothing. Else it runs the setup statements under the advisory setup lock, each
        waiting no longer than `setup_lock_timeout` for a table lock.

        Raises psycopg's `OperationalError` when the database cannot be reached (after
        trying for `wait_for_database`) and `SchemaError` when the check fails or setup
        could not get its locks in time, so a service finds out at boot.
        """
        if self._pool is not None:
            return self
        self.dsn = dsn or self.dsn
        async with await self._first_connection(self.connector.resolve()) as conn:
            if setup:
                await schema.allowed_setup(
                    conn,
                    self.options.setup_lock_timeout.total_seconds(),
                    self.options.resolved_schema(),
                )
            await schema.check(conn)
            row = await (await conn.execute(sql.CURRENT_SCHEMA)).fetchone()
            self.schema = self.options.resolved_schema() or (row[0] if row and row[0] else "public")
            row = await (await conn.execute(schema.HAS_NOTIFY_TRIGGER)).fetchone()
            self.notifies = bool(row and row[0])
        if self.options.listen and not self.notifies:
            log.warning(
                "inserts do not notify (run setup to add the axa_queue_notify trigger); "
                "workers find new jobs by polling only"
            )
        pool = self.connector.pool()
        await pool.open(wait=True, timeout=30)
        self._pool = pool
        return self

    async def _first_connection(self, dsn: str) -> psycopg.AsyncConnection[Any]:
        """Connect, trying again with backoff while the database cannot be reached, for
        up to `wait_for_database` (a worker started during an outage or a restart)."""
        waited = time.monotonic()
        deadline = waited + self.options.wait_for_database.total_seconds()
        pause = 0.25
        first = True
        while True:
            try:
                return await self.connector.connect(session=False)
            except psycopg.OperationalError as error:
                left = deadline - time.monotonic()
                if left <= 0 or refused(error):
                    raise
                if first and self.connector.on_wait is not None:
                    self.connector.on_wait(error)
                first = False
                log.warning(
                    "cannot reach the database (%s); trying again in %g s",
                    kind(error),
                    round(min(pause, left), 2),
                    extra={
                        "error": first_line(error),
                        "retry_in": round(min(pause, left), 2),
                        "waited": round(time.monotonic() - waited, 1),
                    },
                )
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 5.0)

    async def close(self) -> None:
        """Wait for background tasks started by `perform_later`, then close the pool;
        `wait()`s still in progress raise `NotOpenError`."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        pool, self._pool = self._pool, None
        await self.waiters.close()  # waits in progress wake, find the queue closed, raise
        if pool is not None:
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
        block ends (and rolls back on an error): for acts and the caller's own writes.
        With `QueueOptions.schema`, the transaction's `search_path` is that schema and the
        caller's statements are sent as written."""
        async with self.pool.connection() as conn, conn.transaction():
            schema = self.options.resolved_schema()
            if schema is None:
                yield conn
                return
            factory = conn.cursor_factory
            conn.cursor_factory = psycopg.AsyncCursor
            try:
                await conn.execute(sql.LOCAL_SEARCH_PATH, (schema,))
                yield conn
            finally:
                conn.cursor_factory = factory

    async def _run(self, call: Call[T]) -> T:
        async with self.pool.connection() as conn:
            return await run_async(conn, call)

    async def setup(self) -> None:
        """Bring the tables up to date: nothing (and no lock) when they are, else the
        migrations the database lacks, in one transaction under the setup lock, bounded
        by `setup_lock_timeout` (see `axa_queue.schema`)."""
        async with self.pool.connection() as conn:
            await schema.allowed_setup(
                conn,
                self.options.setup_lock_timeout.total_seconds(),
                self.options.resolved_schema(),
            )

    async def check(self) -> None:
        """Raise `SchemaError` when the database's schema version is older than this
        code's, or a table, column or refusing trigger is missing; a newer one is fine."""
        async with self.pool.connection() as conn:
            await schema.check(conn)

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
        rollback of the caller's: use `enqueue_on` to queue in a transaction.

        In the `inline` or `background` mode (`QueueOptions.mode`, `AXA_QUEUE_MODE`) the
        job's handler runs in this process instead, now in the caller or as a task, and
        nothing is stored; the id returned is its run's (`JobContext.id`); see `modes`."""
        job = self.registry.filled(as_new_job(job, args, **options))
        mode = self.options.resolved_mode()
        if mode == "queue":
            if job.unique_key is not None:
                async with self.pool.connection() as conn:
                    return await typing.cast("Awaitable[UUID]", enqueue_unique_one_on(conn, job))
            return await self._run(enqueue_call(job))
        return await self._perform(job, mode)

    async def enqueue_all(self, jobs: Iterable[NewJob]) -> list[UUID]:
        """Queue every job in one statement: all are queued or none. Ids in order.

        In the `inline` mode each job runs in turn, in the caller, and the first to
        raise stops the rest; in the `background` mode each starts as a task (see
        `enqueue`)."""
        batch = [self.registry.filled(job) for job in jobs]
        mode = self.options.resolved_mode()
        if mode == "queue":
            if any(job.unique_key is not None for job in batch):
                return await self._unique(batch)
            return await self._run(enqueue_many_call(batch, copy=True))
        return [await self._perform(job, mode) for job in batch]

    async def _unique(self, batch: list[NewJob]) -> list[UUID]:
        """Queue `batch`, some of it with unique keys (`jobs.UniqueEnqueue`)."""
        async with self.pool.connection() as conn:
            return await typing.cast("Awaitable[list[UUID]]", enqueue_unique_on(conn, batch))

    async def _perform(self, job: NewJob, mode: Mode) -> UUID:
        """Run `job` in this process as `mode` says, instead of storing it (`modes`)."""
        handler = modes.handler_for(self.handlers, job, mode)
        context = modes.context_of(job, self.options)
        if mode == "inline":
            await modes.run_here(handler, job, context)
        else:
            self.start_background(job.name, modes.run_here(handler, job, context), context.id)
        return context.id

    def sync(self) -> SyncQueue:
        """A `SyncQueue` on the same database and options, for synchronous code. It
        knows this queue's handlers, for the `inline` and `background` modes and
        `drain()`."""
        return SyncQueue(self.dsn, self.options, registry=self.registry)

    def start_background(
        self, name: str, work: Coroutine[Any, Any, Any], job_id: UUID | None = None
    ) -> None:
        """Run `work` as a task of this process (the `background` mode), the run of job
        `name` (whose id, if given, a failure's log line names); `close()` waits."""

        async def guarded() -> None:
            try:
                await work
            except Exception as error:
                log.error(
                    "background job failed: %s (%s)",
                    name if job_id is None else f"{name} {job_id}",
                    kind(error),
                    extra={
                        "job": name,
                        **({} if job_id is None else {"job_id": str(job_id)}),
                        "error": describe(error),
                    },
                )

        task = asyncio.get_running_loop().create_task(guarded(), name=f"axa-queue-bg-{name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- inspection --------------------------------------------------------------------

    async def job(self, job_id: UUID | str) -> JobInfo | None:
        """What the queue knows of one job (never its arguments), or `None`."""
        return await self._run(job_call(job_id_of(job_id)))

    async def wait(self, job_id: UUID | str, timeout: Duration | None = None) -> JobInfo:
        """Wait until the job has finished and return it: `completed`, `failed`,
        `cancelled`, or `needs_review` (a person must look at it: nothing more happens
        to it by itself). Woken by a notification, from any process, never by reading
        the table in a loop (see `waits`). Raises `WaitTimeoutError` (a `TimeoutError`)
        after `timeout` (seconds or a `timedelta`; `None`: no limit), leaving the job
        as it is, and `JobNotFoundError` for no such job."""
        return await self.waiters.wait(job_id_of(job_id), timeout)

    async def result(self, job_id: UUID | str) -> Any:
        """What the completed job's handler returned, as JSON values (`None` when it
        returned `None`; a dataclass or pydantic model comes back as a dict of its
        fields). Raises
        `JobNotFoundError` for no such job (or one retention deleted) and
        `NoResultError`, saying its state, for a job not completed: `wait()` for it
        first. The result is private like the arguments: never logged or shown."""
        return await self._run(result_call(job_id_of(job_id)))

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
        return await self._run(acts_call(job_id_of(job_id)))

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule in the table, archived or not, with its last job's state."""
        async with self.pool.connection() as conn, conn.cursor(row_factory=by_name) as cur:
            await cur.execute(sql.SCHEDULES)
            return [schedule_info(row) for row in await cur.fetchall()]

    # --- housekeeping ------------------------------------------------------------------

    async def recover_stale(
        self, *, dry_run: bool = False, now: datetime | None = None
    ) -> list[Recovered]:
        """Queue again (or fail, when out of attempts) runs not heard from for
        `stale_after` before `now` (default: the database's clock); with `dry_run`, only
        say which. A job stored without `max_attempts` counts its attempts against its
        handler's here, else `QueueOptions.max_attempts` (`limits.AttemptLimits`)."""
        async with self.pool.connection() as conn:
            return await maintenance.recover_stale(
                conn,
                self.options.stale_after.total_seconds(),
                self.registry.attempt_limits(self.options.max_attempts),
                dry_run=dry_run,
                now=now,
            )

    async def purge(
        self,
        older_than: Duration | None = None,
        *,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> int:
        """Delete finished rows older than `older_than` (default: the retention period)
        at `now` (default: the database's clock); returns how many went (or would go,
        with `dry_run`)."""
        seconds = (
            self.options.retention.total_seconds()
            if older_than is None
            else to_seconds(older_than, "older_than")
        )
        async with self.pool.connection() as conn:
            return await maintenance.purge(conn, seconds, dry_run=dry_run, now=now)

    async def archive_schedules(self, *, now: datetime | None = None) -> int:
        """Archive schedules no live process has in code (as of `now`, default the
        database's clock); returns how many."""
        async with self.pool.connection() as conn:
            return await maintenance.archive_schedules(
                conn,
                [s.name for s in self.schedule_list],
                self.options.stale_after.total_seconds(),
                now=now,
            )

    async def tick_schedules(self, *, now: datetime | None = None) -> int:
        """Queue a job for each due schedule; returns how many were queued. A worker
        ticks every poll (`tick_each`); any number of processes may tick at once. A schedule that
        fails does not keep the others from queuing their jobs: its error is raised
        once they all have had their turn. `now` is the time to tick at (default: the
        database's clock; tests pass a later one to let intervals pass)."""
        queued, failures = await self.tick_each(now=now)
        for error in failures.values():
            raise error
        return queued

    async def tick_each(self, *, now: datetime | None = None) -> tuple[int, dict[str, Exception]]:
        """Queue a job for each due schedule, each on its own; returns how many were
        queued and what each schedule that failed raised, by name (`Ticker`).
        Without `now`, the test clock (`connector.clock`), as the worker's other
        statements take it, else the database's."""
        if not self.schedule_list:
            return 0, {}
        async with self.pool.connection() as conn:
            return await self.ticker.tick(
                conn,
                stale_after=self.options.stale_after.total_seconds(),
                now=self.connector.clock if now is None else now,
            )

    # --- running -----------------------------------------------------------------------

    async def drain(
        self,
        names: Iterable[str] | str | None = None,
        *,
        timeout: Duration = 30,
        include_delayed: bool = False,
    ) -> DrainResult:
        """For tests: run, in this process, the ready jobs this queue handles (or only
        those of `names`) until none is ready, and say how their runs ended.

        It runs a real worker (claims, fencing, timeouts, retries, observers) with no
        housekeeping or schedules, so a job queued by a job runs too. A retry waiting
        for its backoff, or a job queued for later, is left, unless `include_delayed`
        makes every waiting job due (again and again, until none waits). Raises
        `DrainError` after `timeout` with jobs still ready or running (those running
        are aborted and left `running`), or when this queue's `run()` is working in
        this process. The queue need not be open."""
        self._refuse_drain_while_running()
        return await drain(
            self.registry,
            self.connector,
            names,
            timeout=timeout,
            include_delayed=include_delayed,
        )

    def drain_sync(
        self,
        names: Iterable[str] | str | None = None,
        *,
        timeout: Duration = 30,
        include_delayed: bool = False,
    ) -> DrainResult:
        """`drain()` from synchronous code (a Django or Flask test), on an event loop of
        its own; refused where an event loop is running. `queue.sync().drain()` is the
        same."""
        self._refuse_drain_while_running()
        return drain_blocking(
            self.registry,
            self.connector,
            names,
            timeout=timeout,
            include_delayed=include_delayed,
        )

    def _refuse_drain_while_running(self) -> None:
        if self.worker is not None and self.worker.phase < Phase.STOPPED:
            raise DrainError(
                "drain() was called while this queue's run() is working in this process: "
                "its worker already runs these jobs; stop run() first, or drain instead "
                "of running a worker in tests"
            )

    @contextlib.asynccontextmanager
    async def running(self, *, setup: bool = True) -> AsyncIterator[Queue]:
        """Run the worker for the block, in a task of this event loop, for an
        application that has its own (an ASGI app, a service's main):

            async with queue.running():
                await serve_forever()

        Opens the queue first unless it is open (and closes it after), setting the
        tables up (`setup=True`) or only checking them. A crash of the worker is logged
        and reported by `health()` (see `lifespan.Hosted`). Leaving the block stops it
        as `axa-queue worker` stops on SIGTERM: no new jobs, jobs in progress finish
        within `shutdown_grace` (when set). One at a time per queue."""
        if self._hosted is not None:
            raise AxaQueueError(
                "the queue is already running its worker here (queue.running() or "
                "queue.lifespan): enter it once per process"
            )
        opened = not self.is_open
        if opened:
            await self.open(setup=setup)
        grace = self.options.shutdown_grace
        try:
            self._hosted = Hosted(self.run, None if grace is None else to_seconds(grace))
            yield self
        finally:
            try:
                if self._hosted is not None:
                    await self._hosted.close()
            finally:
                self._hosted = None
                if opened:
                    await self.close()

    def lifespan(self, app: object) -> contextlib.AbstractAsyncContextManager[None]:
        """`FastAPI(lifespan=queue.lifespan)` or `Starlette(lifespan=queue.lifespan)`:
        the app's lifespan runs the worker, as `running()` does (with setup). To run
        more at startup, enter it in a lifespan of your own:
        `async with queue.running(): yield`."""
        return self._lifespan()

    @contextlib.asynccontextmanager
    async def _lifespan(self) -> AsyncIterator[None]:
        async with self.running():
            yield

    async def health(
        self, *, stuck_after: float = STUCK_AFTER, timeout: float = HEALTH_TIMEOUT
    ) -> Health:
        """Whether this queue can do its work: `Health(True, "ok")`, or
        `Health(False, why)` when it is not open, the worker of `running()` crashed,
        the database does not answer within `timeout` seconds, or the worker's
        statements (or a background service) have failed for `stuck_after` seconds.
        For an application's health route; `/health` of `axa-queue worker` says the same."""
        if not self.is_open:
            return Health(False, "the worker is not running (the queue is not open)")
        hosted = self._hosted
        if hosted is not None and hosted.crash is not None:
            return Health(False, f"the worker crashed: {hosted.crash}")
        if hosted is not None and hosted.task.done():
            return Health(False, "the worker is not running (it stopped)")
        try:
            await asyncio.wait_for(self.ping(), timeout)
        except asyncio.TimeoutError:
            return Health(False, f"the database did not answer within {timeout:g} s")
        except (psycopg.Error, AxaQueueError) as error:
            return Health(False, f"cannot reach the database: {first_line(error)}")
        worker = self.worker
        why = None if worker is None else worker.trouble(stuck_after)
        if why is not None:
            return Health(False, why)
        return Health(True, "ok")

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run jobs, schedules and housekeeping until `stop` is set; jobs in progress then
        finish (see `QueueOptions.shutdown_grace`) before this returns. Cancelling it
        aborts jobs in progress and leaves them for stale recovery."""
        if not self.handlers and not self.schedule_list:
            log.warning("run() has no handlers and no schedules: it only does housekeeping")
        self.worker = Worker(
            self.registry,
            self.connector,
            self.pool,
            schema=self.schema,
            notifies=self.notifies,
            tick=self.tick_each,
        )
        await self.worker.run(stop if stop is not None else asyncio.Event())
