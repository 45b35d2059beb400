"""The job a handler is running: `JobContext`, and `current_job()` to reach it.

A run's context is set for the whole of its run (its middleware chain and its handler)
in a `contextvars.ContextVar`, so it is seen in an async handler's task and, copied
with the context, in the thread a sync handler runs in. It holds what a handler needs
to be idempotent and to know where it stands (id, name, attempt of its limit, deadline),
never the job's arguments; and its durable steps (`step`, `jobs.steps`) and sleeps
(`sleep`, `sleep_until`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol
from uuid import UUID, uuid4

from .db.calls import Call, drive, drive_async
from .errors import NotInAJobError, OptionsError, StepError
from .handlers.policies import Sleep
from .jobs.parents import parent_results_call
from .jobs.steps import RunLink, check_name
from .options import Duration, to_timedelta

__all__ = [
    "JobContext",
    "Stoppable",
    "current_job",
    "enter",
    "fresh",
    "leave",
    "running_job",
    "running_or_none",
    "trace_run",
]


class Stoppable(Protocol):
    """What a run's context reads its `cancelled` flag from: the worker's own record of
    the run, whose `stopped` is set (on the event loop) when the run is stopped; and
    where `trace_run` leaves its span's trace context (`run_trace`)."""

    @property
    def stopped(self) -> object: ...

    run_trace: str | None


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
    parent_traces: tuple[Mapping[str, str], ...] = field(default=(), repr=False, compare=False)
    """The trace contexts of the runs of the jobs this one depends on (carriers like
    `trace_context`), in the order of its dependencies, the first 128 of them: written
    by its release when those runs were traced (`axa_queue.otel`), else empty.
    `axa_queue.otel` links the run's span to each."""
    _run: Stoppable | None = field(default=None, repr=False, compare=False)
    """The worker's record of the run (`None` for a run without a row): `cancelled`
    reads it, so the flag changes while this context stays frozen."""
    _lender: Any = field(default=None, repr=False, compare=False)
    """The worker loop's `lending.Lender` while an async handler runs (its lent
    connection is what `queue.pool.connection()` hands out), else `None`."""
    _link: RunLink | None = field(default=None, repr=False, compare=False)
    """How the run reaches the worker's event loop, for its parents' results and its
    steps (a sync handler's thread sends its reads there), and its steps once it has
    any: the worker's, for a run of a stored job; `None` for a run without a row."""

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
        link = self._link
        if link is None:
            return _nothing() if _on_a_loop() else []
        call = parent_results_call(self.id)
        if _here() is link.loop:
            return link.send(call)
        return _sent(link, call)

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """A durable step: `fn(*args, **kwargs)` run once for the job, its result
        recorded. The first time, it runs `fn` and records what it returned (JSON, as a
        job's result is), only while this run holds its claim (else `ClaimLostError`,
        and nothing is recorded: let it end the run); on a later attempt of the job (a
        retry, a run after a sleep or a crash) it returns the recorded result, decoded
        from its JSON, without calling `fn`. Awaitable in an async handler (`await
        job.step("charge", charge_card, order_id)`; `fn` may be async or sync), a value
        in a sync one (`fn` sync). Each step's `name` (1 to 200 characters) is unique
        within the job: a name given twice in a run is a `StepError`. If `fn` raises,
        nothing is recorded and the error propagates. At least once: if the process dies
        after `fn` returned and before its result was recorded, the next attempt calls
        `fn` again (docs/handlers.md). The recorded steps are read in one statement on
        the first step of a run; each step recorded is one more. The result is private
        like arguments: never logged or shown. A run without a row (inline, or a
        handler called directly) just calls `fn`."""
        if _on_a_loop():
            return _step_async(self._link, name, fn, args, kwargs)
        link = self._link
        if link is None:
            check_name(name, None)
            return fn(*args, **kwargs)
        book = link.steps()

        def send(call: Call[Any]) -> Any:
            return _sent(link, call)

        found, value = drive(send, book.look(name))
        if found:
            return value
        started = time.monotonic()
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                _close(value)
                raise StepError(
                    f"step {name!r} of job {self.id}: its function returned an awaitable in a "
                    "sync handler; give a sync function, or make the handler async"
                )
            call, value = book.record(name, value, time.monotonic() - started)
            drive(send, call)
        except BaseException:
            book.give_up(name)
            raise
        return value

    def sleep(self, duration: Duration) -> Any:
        """Leave the loop and be queued again after `duration` (seconds or a
        `timedelta`), without spending an attempt (the job's `max_attempts` rises with
        the attempt number, as a `Snooze` does) and with its recorded steps kept, so a
        job can wait hours without holding a worker: its next run starts from the
        beginning of the handler, its recorded steps returning their results
        (`step`). Awaited in an async handler (`await job.sleep(timedelta(hours=1))`),
        called in a sync one: either way it raises `Sleep`, which must propagate (a
        handler that catches every `Exception` would swallow it). Its attempt's outcome
        is `slept`."""
        delay = to_timedelta(duration, "duration")
        if delay < timedelta(0):
            raise OptionsError(f"expected sleep's duration to be zero or more, got: {duration!r}")
        if _on_a_loop():
            return _raise(Sleep(delay))
        raise Sleep(delay)

    def sleep_until(self, when: datetime) -> Any:
        """`sleep` until `when` (a timezone-aware `datetime`; a time past is now)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise OptionsError(
                f"expected sleep_until's time to be a timezone-aware datetime, got: {when!r}"
            )
        return self.sleep(max(when - datetime.now(timezone.utc), timedelta(0)))

    @property
    def is_last_attempt(self) -> bool:
        """Whether a failure of this run fails the job for good (no retry follows)."""
        return self.attempt >= self.max_attempts


def _here() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _sent(link: RunLink, call: Call[Any]) -> Any:
    """Send `call` on the worker's event loop from another thread (a sync handler's) and
    wait for what it read."""
    return asyncio.run_coroutine_threadsafe(link.send(call), link.loop).result()


async def _send_async(link: RunLink, call: Call[Any]) -> Any:
    """Send `call` on the worker's event loop, from a coroutine on any loop."""
    if _here() is link.loop:
        return await link.send(call)
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(link.send(call), link.loop))


async def _step_async(
    link: RunLink | None,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """`JobContext.step` in an async handler: the same `StepBook` protocol, awaited."""
    if link is None:
        check_name(name, None)
        value = fn(*args, **kwargs)
        return await value if inspect.isawaitable(value) else value
    book = link.steps()

    async def send(call: Call[Any]) -> Any:
        return await _send_async(link, call)

    found, value = await drive_async(send, book.look(name))
    if found:
        return value
    started = time.monotonic()
    try:
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        call, value = book.record(name, value, time.monotonic() - started)
        await drive_async(send, call)
    except BaseException:
        book.give_up(name)
        raise
    return value


def _close(value: Any) -> None:
    """Close a coroutine that will not be awaited (no "never awaited" warning)."""
    close = getattr(value, "close", None)
    if callable(close):
        close()


async def _raise(error: BaseException) -> Any:
    raise error


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


def trace_run(job: JobContext, carrier: str) -> None:
    """Give the worker the trace context of the span of `job`'s run (JSON text of a W3C
    carrier): written with the run's ending, it becomes the `parent_traces` of the jobs
    that depend on this one (migration 20). `axa_queue.otel` calls it; a run without a
    row keeps nothing."""
    run = job._run
    if run is not None:
        run.run_trace = carrier


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
