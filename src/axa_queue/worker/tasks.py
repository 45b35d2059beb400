"""Tasks of the worker: ending them for sure, how soon a failing one tries again, and
what to log of a failure that lasts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ..handlers.retries import summary

__all__ = [
    "BEAT_RETRY_MAX",
    "CANCEL_AGAIN",
    "CANCEL_GIVE_UP",
    "SAID_EVERY",
    "Streak",
    "Troubles",
    "beat_retry",
    "cancel_all",
    "lasting",
    "pause",
    "summary",
    "uncancel",
]

log = logging.getLogger("axa_queue.worker")

CANCEL_AGAIN = 0.1
"""Seconds to wait for a cancelled task to end before cancelling it again: on Python
3.10 and 3.11 `asyncio.wait_for` (which psycopg_pool uses while a task waits for a
connection) loses a cancellation that arrives as the connection is handed over, and the
task goes on as if nothing happened."""

CANCEL_GIVE_UP = 5.0
"""Seconds of cancelling again before a stop leaves behind tasks that will not end."""


async def cancel_all(tasks: list[asyncio.Task[Any]] | set[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait until every one has ended, cancelling again any that lost
    its cancellation (see `CANCEL_AGAIN`), for up to `CANCEL_GIVE_UP`. Cancelled itself
    meanwhile, it still waits for them (each is cancelled again and again, so not for
    long), then re-raises."""
    pending = {task for task in tasks if not task.done()}
    interrupted = False
    give_up = time.monotonic() + CANCEL_GIVE_UP
    while pending:
        if time.monotonic() >= give_up:
            log.error(
                "stopping: tasks did not end when cancelled (%d; a handler that swallows "
                "cancellations?); leaving them",
                len(pending),
                extra={"tasks": len(pending)},
            )
            break
        for task in pending:
            task.cancel()
        try:
            _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN)
        except asyncio.CancelledError:
            interrupted = True
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: what a cancelled loop raised is no news now
    if interrupted:
        raise asyncio.CancelledError


def uncancel() -> None:
    """Forget a cancellation this worker asked for (Python 3.11+ counts them)."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()


SAID_EVERY = 30.0
"""While a background service keeps failing, how often its failure is logged again (with
how long it has lasted), after the first at once: a database down for an hour then
writes a few hundred lines, not one at every try (the listener tries every second, the
give-back and the heartbeat every interval, sooner after a failure)."""


BEAT_RETRY_MAX = 5.0
"""The longest wait before a failed heartbeat, presence write or give-back is tried
again (it starts at half a second and doubles, never past the heartbeat interval): once
the database is back, each goes through within seconds, so no live process shows as
gone and the health check stops failing, instead of a whole interval later (a minute
by default)."""


def beat_retry(retry: float | None, every: float) -> float:
    """The wait before the next try of a failing heartbeat, presence write or give-back
    (`retry`: the last wait after a failure; None after a success): half a second, then
    doubling up to `BEAT_RETRY_MAX`, never past `every` (the heartbeat interval)."""
    return min(every, 0.5 if retry is None else min(retry * 2, BEAT_RETRY_MAX))


async def pause(seconds: float, until: asyncio.Event) -> None:
    """Sleep `seconds`, or less if `until` is set meanwhile (`State.back`)."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(until.wait(), seconds)


def lasting(lasted: float) -> str:
    """How long a failure has lasted, for its log line (`Streak.failed`): nothing for the
    first, "; for 31 s" after."""
    return "" if lasted < 1 else f"; for {lasted:.0f} s"


class Streak:
    """One service's failures in a row, for its log: the first said at once, then one
    every `SAID_EVERY` with how long the streak has lasted, and its end once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since: float | None = None
        self.say_at = 0.0

    def failed(self) -> float | None:
        """A failure: for how many seconds the streak has lasted when this one is to be
        logged, else None."""
        now = self.clock()
        if self.since is None:
            self.since, self.say_at = now, now
        if now < self.say_at:
            return None
        self.say_at = now + SAID_EVERY
        return now - self.since

    def ended(self) -> float | None:
        """A success: for how many seconds the streak it ends lasted, if there was one."""
        if self.since is None:
            return None
        lasted, self.since = self.clock() - self.since, None
        return lasted


class Troubles:
    """The background services failing now (`schedules`, `maintenance`, `listener`):
    since when (monotonic) and why (the error's type and first line), for the health
    check; and each one's `Streak`, for its log."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since: dict[str, tuple[float, str]] = {}
        self.streaks: dict[str, Streak] = {}

    def failed(self, service: str, error: BaseException | str) -> float | None:
        """Note that `service` is failing (since its first failure). Returns for how many
        seconds it has been failing when this failure is to be logged (`Streak.failed`),
        else None."""
        since = self.since.get(service, (self.clock(), ""))[0]
        self.since[service] = (since, error if isinstance(error, str) else summary(error))
        return self.streaks.setdefault(service, Streak(self.clock)).failed()

    def cleared(self, service: str) -> float | None:
        """`service` works again: for how many seconds it had been failing, if it was."""
        self.since.pop(service, None)
        streak = self.streaks.get(service)
        return None if streak is None else streak.ended()
