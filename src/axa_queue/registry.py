"""Registry: what this process has in code for its queue, registered at import time.

The handlers by job name, the per-name limits, the schedules, the run observers and
the middleware. `Queue` owns one and registers into it (`Queue.handler`, `limit`,
`schedule`, `observe`, `middleware`); the worker's services read it, and never the
`Queue`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .handlers import JobHandler
from .middleware import Middleware
from .retries import describe
from .schedules import Schedule

__all__ = ["Registry", "RunObserver"]

log = logging.getLogger("axa_queue.worker")

RunObserver = Callable[[str, str, float], None]
"""Told `(job name, outcome, seconds)` as each run ends; see `Queue.observe`."""


@dataclass(eq=False)
class Registry:
    """Handlers, limits, schedules, observers and middleware of one queue (no I/O)."""

    handlers: dict[str, JobHandler[Any]] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    """At most this many runs of the name at once in this process."""
    global_limits: dict[str, int] = field(default_factory=dict)
    """At most this many runs of the name at once across every process (checked by the
    claim statement, `sql.EXCHANGE`)."""
    schedules: list[Schedule] = field(default_factory=list)
    observers: list[RunObserver] = field(default_factory=list)
    middleware: list[Middleware] = field(default_factory=list)
    """Wrapped around every run, the first outermost (see `middleware`)."""

    def tell(self, name: str, outcome: str, seconds: float, fields: dict[str, Any]) -> None:
        """Tell every observer how a run ended (never its arguments); what one raises is
        logged with `fields`, the run's log fields."""
        for observer in self.observers:
            try:
                observer(name, outcome, seconds)
            except Exception as error:
                log.error("a run observer failed", extra={**fields, "error": describe(error)})
