"""Handlers: the code that runs a job, and typed jobs that can queue themselves.

A handler is registered under a job name with `@queue.handler("Report")` or
`queue.handle("Report", fn)`; a name registered twice is refused unless
`replace=True`. Its first argument is the job's arguments (a second one, when it takes
one, is the run's `JobContext`: decided once, from its signature, when it is made): the JSON value as stored,
or, when the parameter is annotated with a dataclass or a pydantic model (a typed
handler), an instance of it built from the stored fields, each converted and checked
by its declared type (`typed.from_json`; a model by its `model_validate_json`):
unknown keys, missing fields and wrong types fail the attempt with a `TypeError`
naming the fields, never a value or an unknown key.

The returned `JobHandler` can queue itself: `await report.perform_later(args,
priority=5)`, which is `queue.enqueue(report.job(args, priority=5))`: the queue's mode
decides what that does (`QueueOptions.mode`, else the `AXA_QUEUE_MODE` variable, see
`modes`): `queue` stores a row (the default), `inline` runs the handler now in the
caller and raises what it raises (for tests and scripts), and `background` runs it as a
task in this process, with no row and no retries.

`async def` handlers run on the event loop; plain `def` handlers run in a thread, so
a CPU-heavy or blocking handler never holds up heartbeats.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import typing
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, Generic, Protocol, TypeVar
from uuid import UUID

from typing_extensions import Unpack

from .. import context, logs
from ..context import JobContext
from ..jobs.arguments import is_typed
from ..jobs.model import JobOptions, NewJob
from ..jobs.typed import from_json
from ..limits import AttemptLimits
from ..options import QueueOptions
from .policies import NO_POLICY, Policy

__all__ = ["HandlerFunction", "JobHandler"]

log = logging.getLogger("axa_queue.handlers")

A = TypeVar("A")
HandlerFunction = (
    Callable[[A], "Awaitable[object] | object"]
    | Callable[[A, JobContext], "Awaitable[object] | object"]
)
"""A job's code: takes the arguments (and, if it has a second parameter, the run's
`JobContext`); an `async def` or a plain function."""


class Performer(Protocol):
    """What a handler needs of its queue (`Queue` is one): its options (the attempt
    limit of a fresh `JobContext`) and a way to queue a job, which honours the queue's
    mode (`perform_later`)."""

    @property
    def options(self) -> QueueOptions: ...

    async def enqueue(self, job: NewJob) -> UUID: ...


def _argument_type(fn: Callable[..., object]) -> type | None:
    """The dataclass or pydantic model the handler's first parameter is annotated
    with, if any."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if not parameters:
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolved forward references: treat the arguments as plain JSON
        return None
    hint = hints.get(parameters[0].name)
    if isinstance(hint, type) and is_typed(hint):
        return hint
    return None


def _takes_job(fn: Callable[..., object]) -> bool:
    """Whether the handler takes the run's `JobContext` as its second argument: it has
    a second positional parameter with no default, or one annotated `JobContext` (a
    second parameter with a default, not so annotated, is left to its default, as
    before; so is `*args`, which a decorator's wrapper may pass on to a one-parameter
    function)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2:
        second = positional[1]
        if second.default is inspect.Parameter.empty:
            return True
        annotation = second.annotation
        return annotation is JobContext or annotation in ("JobContext", "axa_queue.JobContext")
    return False


def _is_async(fn: Callable[..., object]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


class JobHandler(Generic[A]):
    """A registered handler: call it like the function, or queue it with `perform_later`."""

    def __init__(
        self, queue: Performer, name: str, fn: HandlerFunction[A], policy: Policy = NO_POLICY
    ) -> None:
        self.queue = queue
        self.name = name
        self.fn = fn
        self.policy = policy
        """Its retry policy and defaults (`policies`): `max_attempts`, `timeout`,
        `priority`, `backoff`, `retry_on`, `discard_on`."""
        self.is_async = _is_async(fn)
        self.coroutine_function = (
            typing.cast("Callable[[A], Awaitable[object]]", fn) if self.is_async else None
        )
        """The function itself when it is `async`, so a worker can await it directly."""
        self.argument_type = _argument_type(fn)
        self.takes_job = _takes_job(fn)
        """Whether `fn` takes the run's `JobContext` as its second argument."""
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<JobHandler {self.name!r} {'async' if self.is_async else 'sync'}>"

    def __call__(self, args: A, job: JobContext | None = None) -> Any:
        """Call the handler's function directly, as if it were not registered. A
        handler that takes a `JobContext` gets `job`, else a fresh one (a new id, the
        first attempt of the handler's `max_attempts`, else the queue's);
        `current_job()` is set only in runs (`invoke`, a worker)."""
        if self.takes_job:
            return self.fn(args, job if job is not None else self._fresh())  # type: ignore[call-arg]
        return self.fn(args)  # type: ignore[call-arg]

    def _fresh(self) -> JobContext:
        own = self.policy.max_attempts
        limits = AttemptLimits(
            self.queue.options.max_attempts, {} if own is None else {self.name: own}
        )
        return context.fresh(self.name, limits.of(self.name))

    def decode(self, raw: Any) -> A:
        """The handler's argument from the stored JSON value: as it is, or, for a typed
        handler, its dataclass or pydantic model, converted and checked field by field
        (see `arguments`); a `TypeError` naming the fields, never a value or an unknown
        key, if it does not fit."""
        if self.argument_type is not None:
            return from_json(self.argument_type, raw, self.name)  # type: ignore[no-any-return]
        return raw  # type: ignore[no-any-return]

    async def invoke(
        self, args: A, executor: Executor | None = None, job: JobContext | None = None
    ) -> Any:
        """Run the handler once with `args` as the job `job` (a fresh one if `None`):
        on the loop if async, else in `executor`, with `current_job()` set in either,
        and its log records carrying the job's fields. Returns what it returned."""
        logs.add_job_fields()
        if job is None:
            job = self._fresh()
        token = context.enter(job)
        try:
            return await self.call(args, job, executor)
        finally:
            context.leave(token)

    async def call(self, args: A, job: JobContext, executor: Executor | None = None) -> Any:
        """Call the handler with `args` (and `job` if it takes it): awaited on the loop
        if async, else in a thread of `executor` with a copy of this context (so
        `current_job()` and the log fields reach it). Returns what it returned. The
        caller sets the current job (`invoke`, the worker's runner)."""
        if self.is_async:
            result = self.fn(args, job) if self.takes_job else self.fn(args)  # type: ignore[call-arg]
            if inspect.isawaitable(result):
                return await result
            return result
        loop = asyncio.get_running_loop()
        run = contextvars.copy_context().run
        if self.takes_job:
            result = await loop.run_in_executor(executor, run, self.fn, args, job)
        else:
            result = await loop.run_in_executor(executor, run, self.fn, args)
        if inspect.isawaitable(result):
            return await result
        return result

    def job(
        self,
        args: A,
        **options: Unpack[JobOptions],
    ) -> NewJob:
        """The `NewJob` that runs this handler with `args`, for `enqueue_on` or a schedule,
        with the handler's `max_attempts`, `timeout` and `priority` where `options` do
        not set them."""
        return self.policy.fill(NewJob(self.name, args, **options))

    async def perform_later(
        self,
        args: A,
        **options: Unpack[JobOptions],
    ) -> UUID:
        """Run this handler with `args` as the queue's mode says, exactly as
        `queue.enqueue(self.job(args, ...))` does.

        `queue` (the default): store a job and return its id. `inline`: run it now, in
        the caller, raising what it raises. `background`: start it as a task in this
        process; a failure is logged, not retried. Both store nothing and return the
        id their run was given (its `JobContext.id`), which no row has.
        """
        return await self.queue.enqueue(self.job(args, **options))
