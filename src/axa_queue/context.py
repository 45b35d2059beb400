"""The job a handler is running: `JobContext`, and `current_job()` to reach it.

A run's context is set for the whole of its run (its middleware chain and its handler)
in a `contextvars.ContextVar`, so it is seen in an async handler's task and, copied
with the context, in the thread a sync handler runs in. It holds what a handler needs
to be idempotent and to know where it stands (id, name, attempt of its limit, deadline),
never the job's arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID, uuid4

from .errors import NotInAJobError

__all__ = [
    "JobContext",
    "Stoppable",
    "current_job",
    "enter",
    "fresh",
    "leave",
    "running_job",
    "running_or_none",
]


class Stoppable(Protocol):
    """What a run's context reads its `cancelled` flag from: the worker's own record of
    the run, whose `stopped` is set (on the event loop) when the run is stopped."""

    @property
    def stopped(self) -> object: ...


@dataclass(frozen=True, slots=True)
class JobContext:
    """The job a run belongs to, as its handler sees it (never its arguments)."""

    id: UUID
    """The job's id."""
    name: str
    """The job's name (the handler's)."""
    attempt: int
    """Which run of the job this is: 1 for the first. It also fences the run: a run
    whose claim was lost can write nothing more."""
    max_attempts: int
    """The limit on runs that applies: the job's own, else its handler's, else the
    queue's `max_attempts` (`limits.AttemptLimits`)."""
    deadline: datetime | None = None
    """When the run times out (UTC), if the job has a timeout; else `None`."""
    trace_context: Mapping[str, str] | None = field(default=None, repr=False, compare=False)
    """The W3C trace context stored when the job was queued inside a trace (a carrier:
    `traceparent`, and `tracestate` if any), or `None`: jobs queued outside a trace, by a
    schedule or by the Rust crate have none. `axa_queue.otel` links the run's span to
    it; other tracing code may read it the same way (docs/observability.md)."""
    _run: Stoppable | None = field(default=None, repr=False, compare=False)
    """The worker's record of the run (`None` for a run without a row): `cancelled`
    reads it, so the flag changes while this context stays frozen."""
    _lender: Any = field(default=None, repr=False, compare=False)
    """The worker loop's `lending.Lender` while an async handler runs (its lent
    connection is what `queue.pool.connection()` hands out), else `None`."""
    _parents: Callable[[], Awaitable[list[Any]]] | None = field(
        default=None, repr=False, compare=False
    )
    """Reads what the job's parents returned, on the worker's event loop (`_loop`): the
    worker's, for a run of a stored job; `None` for a run without a row."""
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False, compare=False)
    """The event loop of the worker running the job (a sync handler's thread sends the
    read there)."""

    @property
    def cancelled(self) -> bool:
        """Whether this run has been stopped: its job cancelled by a person (`cancel`,
        on any connection, once committed), its timeout passed, or its claim lost. An
        async handler is cancelled then (it sees `asyncio.CancelledError`); a sync one
        runs on in its thread until it returns, so a long one polls this and stops.
        Nothing it returns afterwards is recorded. Safe to read from any thread."""
        return self._run is not None and self._run.stopped is not None

    def parent_results(self) -> Any:
        """What the jobs this one depends on returned, in the order of its dependencies
        (a chord's callback: its group's results in the group's order; `None` for a
        parent that returned nothing or did not complete), read by the worker running
        the job: awaitable in an async handler (`await job.parent_results()`), a list
        in a sync one (its thread waits for the read). Empty for a job without
        dependencies, and for a run without a row (inline, or a handler called
        directly); with a connection of your own, `parent_results_on(conn, job.id)`.
        Private like arguments: never logged or shown."""
        reader, loop = self._parents, self._loop
        if reader is None or loop is None:
            return _nothing() if _on_a_loop() else []
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            return reader()
        return asyncio.run_coroutine_threadsafe(_awaited(reader), loop).result()

    @property
    def is_last_attempt(self) -> bool:
        """Whether a failure of this run fails the job for good (no retry follows)."""
        return self.attempt >= self.max_attempts


async def _awaited(reader: Callable[[], Awaitable[list[Any]]]) -> list[Any]:
    return await reader()


async def _nothing() -> list[Any]:
    return []


def _on_a_loop() -> bool:
    """Whether this thread runs an event loop (so a caller awaits what it is given)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


_current: ContextVar[JobContext] = ContextVar("axa_queue_current_job")


def current_job() -> JobContext:
    """The job this code runs for: inside a handler (async, or sync in its thread) or a
    middleware. Raises `NotInAJobError` anywhere else."""
    try:
        return _current.get()
    except LookupError:
        raise NotInAJobError() from None


def running_or_none() -> JobContext | None:
    """The current job, or `None` outside a run (for the log record factory)."""
    return _current.get(None)


def enter(job: JobContext) -> Token[JobContext]:
    """Make `job` the current job until `leave` is given the token returned (the
    worker's way, without a context manager's cost on every run)."""
    return _current.set(job)


def leave(token: Token[JobContext]) -> None:
    """End what `enter` started."""
    _current.reset(token)


def fresh(name: str, max_attempts: int) -> JobContext:
    """The context of a run that has no row (an inline or background run, or a handler
    called directly): a new id, the first attempt, no deadline."""
    return JobContext(uuid4(), name, 1, max_attempts)


@contextlib.contextmanager
def running_job(job: JobContext) -> Iterator[JobContext]:
    """Make `job` the current job for the code run inside the block."""
    token = _current.set(job)
    try:
        yield job
    finally:
        _current.reset(token)
