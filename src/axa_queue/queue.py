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
from collections.abc import AsyncIterator, Coroutine, Iterable
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar, overload
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool
from typing_extensions import Unpack

from . import schema, sql
from .acts import (
    Act,
    ActResult,
    Pause,
    acts_call,
    name_acts_call,
    pause_call,
    paused_call,
    resume_call,
)
from .db.calls import Work, run_async
from .db.connector import Connected, Connector
from .errors import DrainError, NotOpenError, OptionsError
from .handlers.registry import Registrations, Registry
from .jobs import modes
from .jobs.attempts import attempts_call
from .jobs.enqueue import enqueue_all_work, enqueue_work
from .jobs.keys import BUSIEST, KeyCounts, key_counts_call
from .jobs.linked import Composition, Workflow, batch_of, workflow_refused
from .jobs.model import (
    Attempt,
    Counts,
    JobInfo,
    JobOptions,
    JobState,
    NewJob,
    as_new_job,
    check_name,
    job_id_of,
)
from .jobs.reads import counts_by_name_call, counts_call, job_call, jobs_call, result_call
from .jobs.waits import Waiters
from .lifespan import Hosted, Hosting
from .maintenance import Maintenance
from .options import (
    DSN_VARIABLES,
    Duration,
    Mode,
    QueueOptions,
)
from .schedules.schedule import ScheduleInfo, Ticker, schedules_call
from .sync import SyncQueue
from .worker import Phase, Worker
from .worker.drain import DrainResult, drain, drain_blocking

__all__ = ["DSN_VARIABLES", "Queue"]

log = logging.getLogger("axa_queue")

T = TypeVar("T")


class Queue(Registrations, Maintenance, Hosting, Connected):
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
    def limits(self) -> dict[str, int]:
        """The per-name limits of this process (see `limits.Limits`)."""
        return self.registry.limits.process

    def __repr__(self) -> str:
        state = "open" if self._pool is not None else "closed"
        return (
            f"<Queue {state} handlers={len(self.handlers)} limits={len(self.limits)} "
            f"schedules={len(self.schedule_list)} workers={self.options.workers}>"
        )

    # --- registration (no I/O) ---------------------------------------------------------

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

    def limit_per_key(self, name: str, jobs: int) -> None:
        """Run at most `jobs` (from one to `limits.MAX_LIMIT`) jobs named `name` at once
        for each key (`NewJob.key`), across every process and host, and take the name's
        jobs from its keys in turn (as `fair_by_key`). Enforced by the claim statement
        under the name's lock, as a global limit is; jobs claimed ahead count. Every
        process that handles the name should register the same limit (docs/handlers.md)."""
        check_name(name)
        self.registry.limits.limit_per_key(name, jobs)

    def fair_by_key(self, name: str) -> None:
        """Claim jobs named `name` from their keys (`NewJob.key`) in turn, rather than
        oldest first: a key with 100,000 jobs waiting and a key with 10 both get jobs
        from the first claim; priority still comes first. Jobs of the name without a
        key are claimed in their place in the name's order (docs/handlers.md)."""
        check_name(name)
        self.registry.limits.keyed.add(name)

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
        pool = self.connector.pool()
        conn = await self.connector.first_connection(pool)
        try:
            if setup:
                # Setup leaves every table, column and trigger `check` looks for (its
                # catalog read covers them all: `schema.missing`) as this code needs
                # them, or raises: a check after it would only read them again.
                await schema.allowed_setup(
                    conn,
                    self.options.setup_lock_timeout.total_seconds(),
                    self.options.resolved_schema(),
                )
            else:
                await schema.check(conn)
            current, self.notifies = await run_async(conn, schema.where())
        except BaseException:
            await conn.close()
            raise
        self.schema = self.options.resolved_schema() or current
        if self.options.listen and not self.notifies:
            log.warning(
                "inserts do not notify (run setup to add the axa_queue_notify trigger); "
                "workers find new jobs by polling only"
            )
        await pool.open_with(conn, timeout=30)  # its first connection: one login fewer
        self._pool = pool
        return self

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

    async def _run(self, work: Work[T]) -> T:
        """Do `work` on a pooled connection (autocommit: each statement commits)."""
        async with self.pool.connection() as conn:
            return await run_async(conn, work)

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

    @overload
    async def enqueue(
        self, job: str | NewJob, args: Any = None, **options: Unpack[JobOptions]
    ) -> UUID: ...
    @overload
    async def enqueue(self, job: Composition) -> Workflow: ...
    async def enqueue(
        self,
        job: str | NewJob | Composition,
        args: Any = None,
        **options: Unpack[JobOptions],
    ) -> Any:
        """Queue a job (a `NewJob`, or a name with its arguments and options) on the
        queue's own connection, in one round trip, and return its id. It outlives any
        rollback of the caller's: use `enqueue_on` to queue in a transaction.

        In the `inline` or `background` mode (`QueueOptions.mode`, `AXA_QUEUE_MODE`) the
        job's handler runs in this process instead, now in the caller or as a task, and
        nothing is stored; the id returned is its run's (`JobContext.id`); see `modes`.
        With `QueueOptions(unknown_names="refuse")`, a name this queue has no handler for
        raises `OptionsError`."""
        if isinstance(job, Composition):  # a workflow: queued whole (docs/workflows.md)
            if self.options.resolved_mode() != "queue" or args is not None or options:
                raise OptionsError(workflow_refused(self.options.resolved_mode()))
            flat = job.flatten().filled(
                lambda one: self.registry.filled(one, self.options.unknown_names)
            )
            return await self._run(enqueue_work(flat))
        job = self.registry.filled(as_new_job(job, args, **options), self.options.unknown_names)
        mode = self.options.resolved_mode()
        if mode == "queue":
            return await self._run(enqueue_work(job))
        return await self._perform(job, mode)

    async def enqueue_all(self, jobs: Iterable[NewJob]) -> list[UUID]:
        """Queue every job in one statement: all are queued or none. Ids in order.

        In the `inline` mode each job runs in turn, in the caller, and the first to
        raise stops the rest; in the `background` mode each starts as a task (see
        `enqueue`)."""
        batch = [self.registry.filled(job, self.options.unknown_names) for job in batch_of(jobs)]
        mode = self.options.resolved_mode()
        if mode == "queue":
            return await self._run(enqueue_all_work(batch))
        return [await self._perform(job, mode) for job in batch]

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
        modes.start_task(name, work, job_id, self._background)

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
        """How many jobs are in each state: counted up to 10,000 a state, past that the
        planner's estimate, named in `Counts.estimated`."""
        return await self._run(counts_call())

    async def counts_by_name(self) -> dict[str, Counts]:
        """How many jobs of each name are in each state (estimates as `counts`)."""
        return await self._run(counts_by_name_call())

    async def key_counts(self, name: str, most: int = BUSIEST) -> list[KeyCounts]:
        """The busiest `most` keys (`NewJob.key`) of job `name`, each with its ready,
        waiting and running jobs, the most live jobs first (reads the name's live keyed
        jobs)."""
        return await self._run(key_counts_call(name, most))

    async def acts(self, job_id: UUID | str) -> list[Act]:
        """Every act a person did to the job, oldest first; kept after its row is purged."""
        return await self._run(acts_call(job_id_of(job_id)))

    async def attempts(self, job_id: UUID | str) -> list[Attempt]:
        """Every run of the job, oldest first (see `axa_queue.attempts_on`)."""
        return await self._run(attempts_call(job_id_of(job_id)))

    async def pause(self, name: str, by: str, reason: str) -> ActResult:
        """Pause job name `name` as an act of `by` for `reason`, committed at once: no
        worker of this package claims its jobs until `resume` (see `axa_queue.pause`,
        which takes your connection and transaction)."""
        return await self._run(pause_call(name, by, reason))

    async def resume(self, name: str, by: str, reason: str) -> ActResult:
        """Resume paused job name `name` as an act of `by` for `reason`, committed at once
        (see `axa_queue.resume`)."""
        return await self._run(resume_call(name, by, reason))

    async def paused(self) -> list[Pause]:
        """The job names paused now, in name order."""
        return await self._run(paused_call())

    async def name_acts(self, name: str) -> list[Act]:
        """Every act on job name `name` (each pause and resume), oldest first."""
        return await self._run(name_acts_call(name))

    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule in the table, archived or not, with its last job's state."""
        return await self._run(schedules_call())

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
