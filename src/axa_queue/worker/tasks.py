"""Tasks of the worker: ending them for sure, and what to log of a failure."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..handlers.retries import summary

__all__ = ["CANCEL_AGAIN", "CANCEL_GIVE_UP", "Troubles", "cancel_all", "summary", "uncancel"]

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


class Troubles:
    """The background services failing now (`schedules`, `maintenance`, `listener`):
    since when (monotonic) and why (the error's type and first line)."""

    def __init__(self) -> None:
        self.since: dict[str, tuple[float, str]] = {}

    def failed(self, service: str, error: BaseException | str) -> None:
        """Note that `service` is failing (since its first failure)."""
        since = self.since.get(service, (time.monotonic(), ""))[0]
        self.since[service] = (since, error if isinstance(error, str) else summary(error))

    def cleared(self, service: str) -> None:
        self.since.pop(service, None)
