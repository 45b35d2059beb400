"""SyncQueue: queue and inspect jobs from synchronous code (Flask, Django, scripts).

Workers are asynchronous, but a synchronous web request often needs to queue a job
or show one. `SyncQueue` does that on a synchronous psycopg pool, sending the very
same work (`Call`s, and the `Steps` of an operation of several) the async `Queue`
does, run by the sync driver (`calls.run_sync`), so the two cannot drift.
For a job in the caller's own transaction, use `enqueue_on(conn, job)` with the
caller's sync connection instead.

    jobs = SyncQueue("postgresql://...")          # or queue.sync(), sharing its DSN
    job_id = jobs.enqueue("Report", {"id": 7})
    with jobs.connection() as conn:               # one transaction
        cancel(conn, job_id, by="ops:alice", reason="customer_asked")
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar, overload
from uuid import UUID

import psycopg
from psycopg_pool import ConnectionPool
from typing_extensions import Unpack

from . import sql
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
from .db.calls import Work, run_sync
from .db.connector import Connected, Connector
from .errors import OptionsError
from .handlers.registry import Registry
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
    job_id_of,
)
from .jobs.reads import counts_by_name_call, counts_call, job_call, jobs_call, result_call
from .jobs.waits import wait_sync
from .options import Duration, Mode, QueueOptions
from .worker.drain import DrainResult, drain_blocking

__all__ = ["SyncQueue"]

T = TypeVar("T")


class SyncQueue(Connected):
    """Queue and inspect jobs from synchronous code; the pool opens on first use.

    Made by `queue.sync()`, it knows that queue's handlers (`registry`), which the
    `inline` and `background` modes and `drain()` run; made on its own, it has none."""

    def __init__(
        self,
        dsn: str | None = None,
        options: QueueOptions | None = None,
        *,
        registry: Registry | None = None,
    ) -> None:
        self.connector = Connector(options if options is not None else QueueOptions(), dsn)
        """How it connects: the same settings as `Queue`'s."""
        self.registry = registry if registry is not None else Registry()
        """The handlers of the queue it was made from (`Queue.sync()`), else none."""
        self._pool: ConnectionPool | None = None
        self._lock = threading.Lock()
        self._background: set[threading.Thread] = set()

    def __repr__(self) -> str:
        return f"<SyncQueue {'open' if self._pool is not None else 'closed'}>"

    @property
    def pool(self) -> ConnectionPool:
        """The pool of autocommit connections, opened on first use."""
        with self._lock:
            if self._pool is None:
                self.connector.resolve("SyncQueue")
                pool = self.connector.sync_pool()
                pool.open(wait=True, timeout=30)
                self._pool = pool
            return self._pool

    def close(self) -> None:
        """Wait for the threads the `background` mode started, then close the pool (it
        opens again on next use)."""
        for thread in list(self._background):
            thread.join()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> SyncQueue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a transaction that commits when the block ends. With
        `QueueOptions.schema`, the transaction's `search_path` is that schema and the
        caller's statements are sent as written."""
        with self.pool.connection() as conn, conn.transaction():
            schema = self.options.resolved_schema()
            if schema is None:
                yield conn
                return
            factory = conn.cursor_factory
            conn.cursor_factory = psycopg.Cursor
            try:
                conn.execute(sql.LOCAL_SEARCH_PATH, (schema,))
                yield conn
            finally:
                conn.cursor_factory = factory

    def _run(self, work: Work[T]) -> T:
        """Do `work` on a pooled connection (autocommit: each statement commits)."""
        with self.pool.connection() as conn:
            return run_sync(conn, work)

    @overload
    def enqueue(
        self, job: str | NewJob, args: Any = None, **options: Unpack[JobOptions]
    ) -> UUID: ...
    @overload
    def enqueue(self, job: Composition) -> Workflow: ...
    def enqueue(
        self,
        job: str | NewJob | Composition,
        args: Any = None,
        **options: Unpack[JobOptions],
    ) -> Any:
        """Queue a job (a `NewJob`, or a name with arguments and options); returns its id.
        The `inline` and `background` modes run its handler here instead, as `Queue.enqueue`
        says: inline in this very thread (an async handler on an event loop of its own),
        in the background in a thread of its own."""
        if isinstance(job, Composition):  # a workflow: queued whole (docs/workflows.md)
            if self.options.resolved_mode() != "queue" or args is not None or options:
                raise OptionsError(workflow_refused(self.options.resolved_mode()))
            flat = job.flatten().filled(
                lambda one: self.registry.filled(one, self.options.unknown_names)
            )
            return self._run(enqueue_work(flat))
        job = self.registry.filled(as_new_job(job, args, **options), self.options.unknown_names)
        mode = self.options.resolved_mode()
        if mode == "queue":
            return self._run(enqueue_work(job))
        return self._perform(job, mode)

    def enqueue_all(self, jobs: Iterable[NewJob]) -> list[UUID]:
        """Queue every job in one statement: all or none. Ids in order. The `inline` and
        `background` modes run each in turn, as `Queue.enqueue_all` says."""
        batch = [self.registry.filled(job, self.options.unknown_names) for job in batch_of(jobs)]
        mode = self.options.resolved_mode()
        if mode == "queue":
            return self._run(enqueue_all_work(batch))
        return [self._perform(job, mode) for job in batch]

    def _perform(self, job: NewJob, mode: Mode) -> UUID:
        """Run `job` here as `mode` says, instead of storing it (`modes`)."""
        handler = modes.handler_for(self.registry.handlers, job, mode)
        context = modes.context_of(job, self.options)
        if mode == "inline":
            modes.run_blocking(handler, job, context)
        else:
            modes.start_thread(handler, job, context, self._background)
        return context.id

    def drain(
        self,
        names: Iterable[str] | str | None = None,
        *,
        timeout: Duration = 30,
        include_delayed: bool = False,
    ) -> DrainResult:
        """For tests: run the ready jobs of the queue this was made from (`queue.sync()`)
        until none is ready, on an event loop of its own; see `Queue.drain`."""
        return drain_blocking(
            self.registry,
            self.connector,
            names,
            timeout=timeout,
            include_delayed=include_delayed,
        )

    def job(self, job_id: UUID | str) -> JobInfo | None:
        """What the queue knows of one job (never its arguments), or `None`."""
        return self._run(job_call(job_id_of(job_id)))

    def wait(self, job_id: UUID | str, timeout: Duration | None = None) -> JobInfo:
        """Wait until the job has finished and return it (see `Queue.wait`), on a
        connection of its own while it waits."""
        return wait_sync(self.connector, self.job, job_id_of(job_id), timeout)

    def result(self, job_id: UUID | str) -> Any:
        """What the completed job's handler returned (see `Queue.result`)."""
        return self._run(result_call(job_id_of(job_id)))

    def jobs(
        self, state: JobState | str | None = None, name: str | None = None, limit: int = 50
    ) -> list[JobInfo]:
        """The newest jobs, optionally of one state and name."""
        return self._run(jobs_call(state, name, limit))

    def counts(self) -> Counts:
        """How many jobs are in each state: counted up to 10,000 a state, past that the
        planner's estimate, named in `Counts.estimated`."""
        return self._run(counts_call())

    def counts_by_name(self) -> dict[str, Counts]:
        """How many jobs of each name are in each state (estimates as `counts`)."""
        return self._run(counts_by_name_call())

    def key_counts(self, name: str, most: int = BUSIEST) -> list[KeyCounts]:
        """The busiest `most` keys (`NewJob.key`) of job `name`, each with its ready,
        waiting and running jobs, the most live jobs first (reads the name's live keyed
        jobs)."""
        return self._run(key_counts_call(name, most))

    def acts(self, job_id: UUID | str) -> list[Act]:
        """Every act a person did to the job, oldest first; kept after its row is purged."""
        return self._run(acts_call(job_id_of(job_id)))

    def attempts(self, job_id: UUID | str) -> list[Attempt]:
        """Every run of the job, oldest first (see `Queue.attempts`)."""
        return self._run(attempts_call(job_id_of(job_id)))

    def pause(self, name: str, by: str, reason: str) -> ActResult:
        """Pause job name `name`, committed at once (see `Queue.pause`)."""
        return self._run(pause_call(name, by, reason))

    def resume(self, name: str, by: str, reason: str) -> ActResult:
        """Resume paused job name `name`, committed at once (see `Queue.resume`)."""
        return self._run(resume_call(name, by, reason))

    def paused(self) -> list[Pause]:
        """The job names paused now, in name order."""
        return self._run(paused_call())

    def name_acts(self, name: str) -> list[Act]:
        """Every act on job name `name` (each pause and resume), oldest first."""
        return self._run(name_acts_call(name))

    def ping(self) -> None:
        """Raise unless the database answers."""
        with self.pool.connection() as conn:
            conn.execute(sql.PING)
