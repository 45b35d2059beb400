"""The schedule loop: ticks the schedules every poll interval (the tick itself is
`axa_queue.schedules.schedule.Ticker`, on a connection of the queue's pool), waking the exchange
when it queued a job, and reporting schedules that keep failing."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ..handlers.retries import kind
from .state import State
from .tasks import Troubles, summary

__all__ = ["LOG_AGAIN", "Tick", "tick_loop"]

log = logging.getLogger("axa_queue.worker")

LOG_AGAIN = 60.0
"""Seconds between log lines for a schedule that keeps failing."""

Tick = Callable[[], Awaitable[tuple[int, dict[str, Exception]]]]
"""Queues a job for each due schedule: how many were queued, and each failure by name."""


async def tick_loop(tick: Tick, every: float, state: State, troubles: Troubles) -> None:
    """Tick every `every` seconds until cancelled; failures are logged (each schedule at
    most every `LOG_AGAIN`) and reported, and never end the loop."""
    logged: dict[str, float] = {}
    """When each failing schedule was last logged (monotonic)."""
    while True:
        failures: dict[str, Exception]
        try:
            queued, failures = await tick()
        except Exception as broken:  # the schedules' table, not one schedule
            queued, failures = 0, {"": broken}
        if queued:
            state.wake()
        now = time.monotonic()
        for name in [name for name in logged if name not in failures]:
            del logged[name]
        for name, failure in failures.items():
            if now - logged.get(name, -LOG_AGAIN) >= LOG_AGAIN:
                logged[name] = now
                fields = {"error": summary(failure), "retry_in": every}
                if name:
                    log.error(
                        "a schedule could not queue its job: %s (%s); trying again in %g s",
                        name,
                        kind(failure),
                        every,
                        extra={"schedule": name, **fields},
                    )
                else:
                    log.error(
                        "could not queue scheduled jobs (%s); trying again in %g s",
                        kind(failure),
                        every,
                        extra=fields,
                    )
        if failures:
            name, first = next(iter(failures.items()))
            where = f"schedule {name!r}: " if name else ""
            troubles.failed("schedules", f"{where}{summary(first)}")
        else:
            troubles.cleared("schedules")
        await asyncio.sleep(every)
