"""The worker inside another application: `Queue.running()` and `Queue.lifespan`.

`Hosted` runs a queue's `run()` in a task of the application's event loop and watches
it: a crash of that task (what `run()` raises; its services retry the database on
their own, so this is a bug or a broken environment) is logged once, with the error's
type and first line, and kept for the health check (`Queue.health`), which answers
503 from then on, so the application's orchestrator replaces it; the worker is not
started again in the same process. On close it stops the worker as `axa-queue worker`
stops on SIGTERM: no more claims, jobs in progress finish within `shutdown_grace`
(when set), then aborted and left for stale recovery.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .handlers.retries import kind, summary

__all__ = ["ABORT_AFTER", "Hosted"]

log = logging.getLogger("axa_queue")

ABORT_AFTER = 5.0
"""Seconds past `shutdown_grace` before a worker that has not stopped is cancelled: it
returns within the grace by itself, so this only guards against a bug."""


class Hosted:
    """A queue's `run()` in a watched task; made and closed by `Queue.running()`."""

    def __init__(
        self, run: Callable[[asyncio.Event], Coroutine[Any, Any, None]], grace: float | None
    ) -> None:
        self.stop = asyncio.Event()
        self.grace = grace
        self.crash: str | None = None
        """What ended the worker, if it crashed: the error's type and first line."""
        self.task = asyncio.get_running_loop().create_task(
            self._watch(run), name="axa-queue-worker"
        )

    async def _watch(self, run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
        try:
            await run(self.stop)
        except Exception as error:
            self.crash = summary(error)
            log.error(
                "the worker crashed (%s); it takes no more jobs and the health check fails "
                "until the application is restarted",
                kind(error),
                extra={"error": self.crash},
            )

    async def close(self) -> None:
        """Stop the worker: jobs in progress finish (within `shutdown_grace`, when set)
        and their endings are written; returns once it has stopped."""
        self.stop.set()
        if self.task.done():
            return
        timeout = None if self.grace is None else self.grace + ABORT_AFTER
        done, _ = await asyncio.wait([self.task], timeout=timeout)
        if not done:
            log.error(
                "the worker did not stop within its grace period (%g s); aborting it (stale "
                "recovery will queue its jobs again)",
                self.grace,
                extra={"grace": self.grace},
            )
            self.task.cancel()
            await asyncio.wait([self.task])
