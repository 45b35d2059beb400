"""Registry: what this process has in code for its queue, registered at import time.

The handlers by job name, the limits (`limits.Limits`: per-name, global and rate), the
schedules, the run observers and the middleware and the calls made in the threads
sync handlers run in (`ThreadHooks`). `Queue` owns one and registers into it (`Queue.handler`, `limit`,
`schedule`, `observe`, `middleware`); the worker's services read it, and never the
`Queue`. `Registrations` are the queue's methods that register, kept here with what
they fill.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, overload

from typing_extensions import Unpack

from ..errors import OptionsError, ScheduleError
from ..jobs.model import NewJob, check_name
from ..limits import AttemptLimits, Limits
from ..middleware import Middleware
from ..middleware import check as check_middleware
from ..schedules.schedule import Schedule
from .handler import HandlerFunction, JobHandler, Performer
from .policies import PolicyOptions, policy_of
from .retries import describe, kind

__all__ = ["Registrations", "Registry", "RunObserver", "ThreadHooks"]

A = TypeVar("A")

log = logging.getLogger("axa_queue.worker")

RunObserver = Callable[[str, str, float], None]
"""Told `(job name, outcome, seconds)` as each run ends; see `Queue.observe`."""


@dataclass(eq=False)
class ThreadHooks:
    """Calls made in the threads sync handlers run in, for code whose resources belong to
    a thread (Django's database connections: `axa_queue.contrib.django` adds
    `close_old_connections` around each run and `connections.close_all` at the end).

    `around_run` are called, in that thread, before and after each sync run; one that
    raises before the run fails the run, after it is logged. `thread_end` are called as a
    thread ends (when the worker stops); what they raise is logged."""

    around_run: list[Callable[[], None]] = field(default_factory=list)
    thread_end: list[Callable[[], None]] = field(default_factory=list)


@dataclass(eq=False)
class Registry:
    """Handlers, limits, schedules, observers and middleware of one queue (no I/O)."""

    handlers: dict[str, JobHandler[Any]] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    """The per-name, global and rate limits (`limits.Limits`)."""
    schedules: list[Schedule] = field(default_factory=list)
    observers: list[RunObserver] = field(default_factory=list)
    threads: ThreadHooks = field(default_factory=ThreadHooks)
    """What the threads of sync handlers call around each run and as they end."""
    middleware: list[Middleware] = field(default_factory=list)
    """Wrapped around every run, the first outermost (see `middleware`)."""

    def filled(self, job: NewJob, unknown_names: str = "accept") -> NewJob:
        """`job` with its handler's defaults where it leaves them unset, when this
        process has its handler (`Policy.fill`); else `job` itself, or, when
        `unknown_names` is `"refuse"` (`QueueOptions.unknown_names`), an `OptionsError`."""
        handler = self.handlers.get(job.name)
        if handler is not None:
            return handler.policy.fill(job)
        if unknown_names == "refuse":
            raise OptionsError(
                f"cannot queue job name {job.name!r}: this queue has no handler for it and "
                'its QueueOptions.unknown_names is "refuse"; register a handler for it '
                f'(@queue.handler({job.name!r})), or give unknown_names="accept" to queue '
                "jobs that other processes handle"
            )
        return job

    def attempt_limits(self, default: int) -> AttemptLimits:
        """The effective attempt limit of jobs here (`limits.AttemptLimits`): a job's own,
        else its handler's `max_attempts`, else `default` (`QueueOptions.max_attempts`)."""
        return AttemptLimits(
            default,
            {
                name: handler.policy.max_attempts
                for name, handler in self.handlers.items()
                if handler.policy.max_attempts is not None
            },
        )

    def tell(self, name: str, outcome: str, seconds: float, fields: dict[str, Any]) -> None:
        """Tell every observer how a run ended (never its arguments); what one raises is
        logged with `fields`, the run's log fields."""
        for observer in self.observers:
            try:
                observer(name, outcome, seconds)
            except Exception as error:
                log.error(
                    "a run observer failed (%s) on job %s %s (attempt %s)",
                    kind(error),
                    name,
                    fields.get("job_id"),
                    fields.get("attempt"),
                    extra={**fields, "error": describe(error)},
                )


class Registrant(Performer, Protocol):
    """What `Registrations` needs of the queue it is part of: its `Registry`, and what
    a `JobHandler` needs of its queue (`Performer`)."""

    registry: Registry


class Registrations:
    """The registering methods of `Queue` (no I/O): handlers, schedules, observers and
    middleware, each put into the queue's `Registry`."""

    @property
    def handlers(self: Registrant) -> dict[str, JobHandler[Any]]:
        """The handlers by job name (see `Registry`)."""
        return self.registry.handlers

    @property
    def schedule_list(self: Registrant) -> list[Schedule]:
        """The schedules in code (see `Registry`)."""
        return self.registry.schedules

    @property
    def observers(self: Registrant) -> list[RunObserver]:
        """The run observers (see `Registry`)."""
        return self.registry.observers

    @overload
    def handler(
        self: Registrant, name: str, *, replace: bool = False, **policy: Unpack[PolicyOptions]
    ) -> Callable[[HandlerFunction[A]], JobHandler[A]]: ...
    @overload
    def handler(
        self: Registrant,
        name: HandlerFunction[A],
        *,
        replace: bool = False,
        **policy: Unpack[PolicyOptions],
    ) -> JobHandler[A]: ...
    def handler(
        self: Registrant,
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
            return _register(self, getattr(name, "__name__", repr(name)), name, replace, policy)

        def register(fn: HandlerFunction[A]) -> JobHandler[A]:
            return _register(self, name, fn, replace, policy)

        return register

    def handle(
        self: Registrant,
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
        return _register(self, name, fn, replace, policy)

    def schedule(self: Registrant, schedule: Schedule) -> Schedule:
        """Queue `schedule.job` on every due time of `schedule`. Refuses a name twice."""
        schedules = self.registry.schedules
        if any(s.name == schedule.name for s in schedules):
            raise ScheduleError(f"the schedule {schedule.name!r} was added twice")
        schedules.append(schedule)
        return schedule

    def observe(self: Registrant, observer: RunObserver) -> RunObserver:
        """Call `observer(job name, outcome, seconds)` as each run in this process ends:
        `outcome` is `completed`, `retried`, `failed`, `lost` or `cancelled` (its job
        cancelled by a person while it ran), told once the ending is recorded, and `seconds` is how long the handler ran. It runs on the event loop,
        so it must be quick; what it raises is logged. It is never given the arguments.
        Returns `observer`, so it can be used as a decorator. For metrics."""
        self.registry.observers.append(observer)
        return observer

    def middleware(self: Registrant, fn: Middleware) -> Middleware:
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


def _register(
    queue: Registrant, name: str, fn: HandlerFunction[A], replace: bool, policy: PolicyOptions
) -> JobHandler[A]:
    """`Registrations.handle`: check, then register."""
    check_name(name)
    if not callable(fn):
        raise OptionsError(f"expected the handler of job {name!r} to be callable, got: {fn!r}")
    handlers = queue.registry.handlers
    if name in handlers and not replace:
        raise OptionsError(
            f"a handler for job {name!r} is already registered "
            f"({handlers[name].fn!r}): pass replace=True to replace it"
        )
    registered = JobHandler(queue, name, fn, policy_of(name, policy))
    handlers[name] = registered
    return registered
