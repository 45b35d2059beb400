"""Registry: what this process has in code for its queue, registered at import time.

The handlers by job name, the limits (`limits.Limits`: per-name, global and rate), the
schedules, the run observers and the middleware and the calls made in the threads
sync handlers run in (`ThreadHooks`). `Queue` owns one and registers into it (`Queue.handler`, `limit`,
`schedule`, `observe`, `middleware`); the worker's services read it, and never the
`Queue`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..jobs.model import NewJob
from ..limits import AttemptLimits, Limits
from ..middleware import Middleware
from ..schedules.schedule import Schedule
from .handler import JobHandler
from .retries import describe, kind

__all__ = ["Registry", "RunObserver", "ThreadHooks"]

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

    def filled(self, job: NewJob) -> NewJob:
        """`job` with its handler's defaults where it leaves them unset, when this
        process has its handler (`Policy.fill`); else `job` itself."""
        handler = self.handlers.get(job.name)
        return job if handler is None else handler.policy.fill(job)

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
