"""Queue: the handle a service holds. Handlers, limits and schedules are registered on
it at import time, with no I/O; `open()` connects (and sets the tables up); `run()`
works the jobs; the rest queues and inspects.

The DSN may be given to `Queue(...)`, to `open(dsn)`, or by `AXA_QUEUE_DSN` (then
`DATABASE_URL`), so a module can define its queue before any database is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar, overload
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool
from psycopg_pool.base import AttemptWithBackoff
from typing_extensions import Unpack

from . import maintenance, pooler, schedules, sql
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
    check_name,
    counts_by_name_call,
    counts_call,
    enqueue_call,
    enqueue_many_call,
    job_call,
    job_id_of,
    jobs_call,
)
from .maintenance import Recovered
from .options import DSN_VARIABLES, Duration, QueueOptions, dsn_from_environment, to_seconds
from .retries import describe, first_line
from .schedules import Schedule, ScheduleInfo, schedule_info
from .statements import Call, by_name, run_async
from .sync import SyncQueue
from .worker import RunObserver, Worker

__all__ = ["DSN_VARIABLES", "Queue"]

log = logging.getLogger("axa_queue")

A = TypeVar("A")
T = TypeVar("T")


ACTS_TRIGGERS = ("axa_job_acts_refuse", "axa_job_acts_refuse_truncate", "axa_job_acts_role")
"""The refusing triggers and the one recording each act's role, which `check` requires,
each set to fire always."""

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
    def handler(
        self, name: str, *, replace: bool = False
    ) -> Callable[[HandlerFunction[A]], JobHandler[A]]: ...
    @overload
    def handler(self, name: HandlerFunction[A], *, replace: bool = False) -> JobHandler[A]: ...
    def handler(
        self, name: str | HandlerFunction[A], *, replace: bool = False
    ) -> Callable[[HandlerFunction[A]], JobHandler[A]] | JobHandler[A]:
        """Register the decorated function for jobs named `name` (or, used bare, for
        jobs named after the function). Returns a `JobHandler`, callable as before.
        A name already registered is refused unless `replace=True`."""
        if callable(name):
            return self.handle(getattr(name, "__name__", repr(name)), name, replace=replace)

        def register(fn: HandlerFunction[A]) -> JobHandler[A]:
            return self.handle(name, fn, replace=replace)

        return register

    def handle(self, name: str, fn: HandlerFunction[A], *, replace: bool = False) -> JobHandler[A]:
        """Run `fn` for jobs named `name` (1 to `MAX_NAME_CHARS` characters, no NUL or
        lone surrogate). A name already registered raises `OptionsError`, so two modules
        cannot take the same name by mistake; pass `replace=True` to replace its handler."""
        check_name(name)
        if not callable(fn):
            raise OptionsError(f"expected the handler of job {name!r} to be callable, got: {fn!r}")
        if name in self.handlers and not replace:
            raise OptionsError(
                f"a handler for job {name!r} is already registered "
                f"({self.handlers[name].fn!r}): pass replace=True to replace it"
            )
        registered = JobHandler(self, name, fn)
        self.handlers[name] = registered
        return registered

    def limit(self, name: str, jobs: int) -> None:
        """Run at most `jobs` (at least one) jobs named `name` at once in this process.
        Other names keep the remaining loops busy. Not a limit across processes."""
        check_name(name)
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
        """Connection settings the queue uses (see `pooler`)."""
        return pooler.connect_kwargs(self.options)

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
        self.dsn = dsn or self.dsn or dsn_from_environment()
        if not self.dsn:
            raise OptionsError(
                "no database given: pass a DSN to Queue(...) or open(...), or set AXA_QUEUE_DSN"
            )
        async with await self._first_connection(self.dsn) as conn:
            if setup:
                await _allowed_setup(conn, self.options.seconds("setup_lock_timeout"))
            await _check(conn)
            row = await (await conn.execute(sql.CURRENT_SCHEMA)).fetchone()
            self.schema = self.options.resolved_schema() or (row[0] if row and row[0] else "public")
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
            configure=_configure if pooler.keeps_session_state(self.options) else None,
            open=False,
            name="axa-queue",
        )
        await pool.open(wait=True, timeout=30)
        self._pool = pool
        return self

    async def _first_connection(self, dsn: str) -> psycopg.AsyncConnection[Any]:
        """Connect, trying again with backoff while the database cannot be reached, for
        up to `wait_for_database` (a worker started during an outage or a restart)."""
        waited = time.monotonic()
        deadline = waited + self.options.seconds("wait_for_database")
        pause = 0.25
        while True:
            try:
                return await psycopg.AsyncConnection.connect(
                    dsn, autocommit=True, **self.connect_kwargs()
                )
            except psycopg.OperationalError as error:
                left = deadline - time.monotonic()
                refused = (error.sqlstate or "")[:2] in ("28", "3D")  # login, database name
                if left <= 0 or refused:
                    raise
                log.warning(
                    "cannot reach the database; trying again",
                    extra={
                        "error": first_line(error),
                        "retry_in": round(min(pause, left), 2),
                        "waited": round(time.monotonic() - waited, 1),
                    },
                )
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 5.0)

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
        """Bring the tables up to date: nothing (and no lock) when they are, else
        `SETUP_STATEMENTS` in one transaction under the setup lock, bounded by
        `setup_lock_timeout`."""
        async with self.pool.connection() as conn:
            await _allowed_setup(conn, self.options.seconds("setup_lock_timeout"))

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
                log.error("background job failed", extra={"job": name, "error": describe(error)})

        task = asyncio.get_running_loop().create_task(guarded(), name=f"axa-queue-bg-{name}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- inspection --------------------------------------------------------------------

    async def job(self, job_id: UUID | str) -> JobInfo | None:
        """What the queue knows of one job (never its arguments), or `None`."""
        return await self._run(job_call(job_id_of(job_id)))

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
        say which."""
        async with self.pool.connection() as conn:
            return await maintenance.recover_stale(
                conn,
                self.options.seconds("stale_after"),
                self.options.max_attempts,
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
            self.options.seconds("retention")
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
                self.options.seconds("stale_after"),
                now=now,
            )

    async def tick_schedules(self, *, now: datetime | None = None) -> int:
        """Queue a job for each due schedule; returns how many were queued. `run()` calls
        this every poll; any number of processes may call it at once. A schedule that
        fails does not keep the others from queuing their jobs: its error is raised
        once they all have had their turn. `now` is the time to tick at (default: the
        database's clock; tests pass a later one to let intervals pass)."""
        queued, failures = await self.tick_each(now=now)
        for error in failures.values():
            raise error
        return queued

    async def tick_each(self, *, now: datetime | None = None) -> tuple[int, dict[str, Exception]]:
        """Queue a job for each due schedule, each on its own; returns how many were
        queued and what each schedule that failed raised, by name."""
        if not self.schedule_list:
            return 0, {}
        loop = asyncio.get_running_loop()
        failures: dict[str, Exception] = {}
        async with self.pool.connection() as conn:
            every = min(SEEN_EVERY, self.options.seconds("stale_after") / 4)
            if loop.time() - self._seen_at >= every or self._seen_at == 0.0:
                await schedules.mark_seen(conn, self.schedule_list, now)
                self._seen_at = loop.time()
            due = set(await schedules.due(conn, self.schedule_list, now))
            queued = 0
            for schedule in self.schedule_list:
                if schedule.name not in due:
                    continue
                try:
                    if await schedules.tick_one(conn, schedule, now) is not None:
                        queued += 1
                except psycopg.OperationalError:
                    raise  # the connection, not the schedule: the next tick tries again
                except Exception as error:
                    failures[schedule.name] = error
            return queued, failures

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


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(sql.SESSION_SETTINGS)


@dataclass(frozen=True)
class Expectations:
    """What the tables must have once `SETUP_STATEMENTS` ran, read from those statements
    (and the `CHECK_*` column lists), so a column, index or trigger added to setup is
    checked with nothing more to write. `sql.SETUP_MISSING` takes them as parameters."""

    tables: tuple[str, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    indexes: tuple[str, ...] = ()
    constraints: tuple[tuple[str, str], ...] = ()
    functions: tuple[tuple[str, str], ...] = ()
    """(name, body) of each function taking no argument."""
    triggers: tuple[tuple[str, str, bool], ...] = ()
    """(table, name, whether it must fire always)."""
    storage: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(table, its `reloptions` that must be set)."""

    def __add__(self, other: Expectations) -> Expectations:
        return Expectations(
            *(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self))
        )

    def params(self) -> dict[str, Any]:
        """The parameters of `sql.SETUP_MISSING`."""
        return {
            "tables": list(self.tables),
            "column_tables": [t for t, _ in self.columns],
            "columns": [c for _, c in self.columns],
            "indexes": list(self.indexes),
            "constraint_tables": [t for t, _ in self.constraints],
            "constraints": [c for _, c in self.constraints],
            "functions": [f for f, _ in self.functions],
            "bodies": [b for _, b in self.functions],
            "trigger_tables": [t for t, _, _ in self.triggers],
            "triggers": [g for _, g, _ in self.triggers],
            "trigger_always": [a for _, _, a in self.triggers],
            "storage_tables": [t for t, settings in self.storage for _ in settings],
            "storage": [s for _, settings in self.storage for s in settings],
        }


def expectations_of(statement: str) -> Expectations:
    """What one setup (or `CHECK_*`) statement makes sure of, read from its text."""
    always = set(re.findall(r"ENABLE ALWAYS TRIGGER (\w+)", statement))
    storage = re.search(r"'(\w+)'::regclass\)\s+@> ARRAY\[([^\]]*)\]", statement)
    checked = re.fullmatch(r"SELECT (.+) FROM (\w+) LIMIT 0", statement.strip(), re.S)
    return Expectations(
        tables=tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", statement)),
        columns=tuple(
            (table, column)
            for table, column in re.findall(
                r"ALTER TABLE (\w+) ADD COLUMN IF NOT EXISTS (\w+)", statement
            )
        )
        + (tuple((checked[2], c.strip()) for c in checked[1].split(",")) if checked else ()),
        indexes=tuple(re.findall(r"CREATE INDEX IF NOT EXISTS (\w+)", statement)),
        constraints=tuple(re.findall(r"ALTER TABLE (\w+) ADD CONSTRAINT (\w+)", statement)),
        functions=tuple(
            re.findall(r"CREATE OR REPLACE FUNCTION (\w+)\(\).*?AS \$\$(.*?)\$\$", statement, re.S)
        ),
        triggers=tuple(
            (table, name, name in always)
            for name, table in re.findall(
                r"CREATE OR REPLACE TRIGGER (\w+)\s.*?\bON (\w+)", statement, re.S
            )
        )
        + tuple(
            (table, name, True)
            for table in re.findall(r"ALTER TABLE (\w+)\s+ENABLE ALWAYS", statement)
            for name in sorted(always)
        ),
        storage=(((storage[1], tuple(re.findall(r"'([^']*)'", storage[2]))),) if storage else ()),
    )


@functools.cache
def setup_expectations() -> Expectations:
    """Everything `SETUP_STATEMENTS` make sure of (see `Expectations`)."""
    found = Expectations()
    for statement in (*sql.SETUP_STATEMENTS, sql.CHECK_QUEUE, sql.CHECK_SCHEDULE, sql.CHECK_ACTS):
        found += expectations_of(statement)
    always = {name for _, name, a in found.triggers if a}
    return dataclasses.replace(
        found,
        columns=tuple(dict.fromkeys(found.columns)),
        triggers=tuple(dict.fromkeys((t, n, n in always) for t, n, _ in found.triggers)),
    )


async def setup_missing(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    """What setup would still change in the schema `conn` reaches, one line each ("column
    axa_queue.priority"); empty when the tables are up to date. Reads only the catalogs."""
    cursor = await conn.execute(sql.SETUP_MISSING, setup_expectations().params())
    return [row[0] for row in await cursor.fetchall()]


async def _setup(conn: psycopg.AsyncConnection[Any], lock_timeout: float = 5.0) -> None:
    """Bring the tables up to date, taking no lock at all when they are (the usual start
    of a worker); else run `SETUP_STATEMENTS` under the setup lock, each waiting for a
    table lock no longer than `lock_timeout` seconds (0: as long as it takes)."""
    if not await setup_missing(conn):
        return
    current = "the setup lock"
    try:
        async with conn.transaction():
            await conn.execute(sql.SETUP_LOCK_TIMEOUT, (f"{round(lock_timeout * 1000)}ms",))
            await conn.execute(sql.TAKE_SETUP_LOCK, (sql.SETUP_LOCK,))
            if not await setup_missing(conn):
                return  # another process set the tables up while this one waited
            for statement in sql.SETUP_STATEMENTS:
                found = re.search(r"\b(?:ON|TABLE(?: IF NOT EXISTS)?)\s+(axa_\w+)", statement)
                current = found[1] if found else current
                await conn.execute(statement)
    except psycopg.errors.LockNotAvailable:
        raise SchemaError(
            f"could not set up the tables within {lock_timeout:g} s: another transaction "
            f"holds a lock on {current}; retry, or run `axa-queue setup` when the database "
            "is quiet (workers can then start with --no-setup)"
        ) from None


async def _allowed_setup(conn: psycopg.AsyncConnection[Any], lock_timeout: float) -> None:
    """`_setup`, or a `SchemaError` saying what to do when this role may not run it (the
    least-privilege role of docs/production.md may not)."""
    try:
        await _setup(conn, lock_timeout)
    except psycopg.errors.InsufficientPrivilege as error:
        raise SchemaError(
            f"this database role may not set the job queue's tables up "
            f"({error.diag.message_primary}): open the queue with setup=False (a worker: "
            "`axa-queue worker --no-setup`), which only checks the tables, and run "
            "`axa-queue setup` (or the statements `axa-queue sql` prints, in a migration) "
            "as the role that owns them"
        ) from error


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
            "on axa_job_acts, so acts could be changed or not record their role: run the setup "
            "statements (`axa-queue setup`, or `axa-queue sql` in a migration)"
        )
