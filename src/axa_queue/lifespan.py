"""The worker inside another application: `Queue.running()`, `Queue.lifespan` and
`Queue.health()` (the `Hosting` methods of `Queue`).

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
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import psycopg

from .errors import AxaQueueError
from .handlers.retries import first_line, kind, summary
from .health import HEALTH_TIMEOUT, Health
from .options import QueueOptions, to_seconds
from .worker import STUCK_AFTER

__all__ = ["ABORT_AFTER", "Hosted", "Hosting"]

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


class _Troubled(Protocol):
    def trouble(self, after: float) -> str | None: ...


class Host(Protocol):
    """What `Hosting` needs of the queue it is part of."""

    _hosted: Hosted | None

    @property
    def options(self) -> QueueOptions: ...
    @property
    def is_open(self) -> bool: ...
    @property
    def worker(self) -> _Troubled | None: ...
    async def open(self, dsn: str | None = None, *, setup: bool = True) -> object: ...
    async def close(self) -> None: ...
    async def ping(self) -> None: ...
    async def run(self, stop: asyncio.Event | None = None) -> None: ...
    def running(self, *, setup: bool = True) -> contextlib.AbstractAsyncContextManager[object]: ...


H = TypeVar("H", bound=Host)


class Hosting:
    """The methods of `Queue` that run its worker inside an application, and say
    whether it can do its work."""

    _hosted: Hosted | None
    """The worker run for `running()`, while it is."""

    @contextlib.asynccontextmanager
    async def running(self: H, *, setup: bool = True) -> AsyncIterator[H]:
        """Run the worker for the block, in a task of this event loop, for an
        application that has its own (an ASGI app, a service's main):

            async with queue.running():
                await serve_forever()

        Opens the queue first unless it is open (and closes it after), setting the
        tables up (`setup=True`) or only checking them. A crash of the worker is logged
        and reported by `health()` (see `lifespan.Hosted`). Leaving the block stops it
        as `axa-queue worker` stops on SIGTERM: no new jobs, jobs in progress finish
        within `shutdown_grace` (when set). One at a time per queue."""
        if self._hosted is not None:
            raise AxaQueueError(
                "the queue is already running its worker here (queue.running() or "
                "queue.lifespan): enter it once per process"
            )
        opened = not self.is_open
        if opened:
            await self.open(setup=setup)
        grace = self.options.shutdown_grace
        try:
            self._hosted = Hosted(self.run, None if grace is None else to_seconds(grace))
            yield self
        finally:
            try:
                if self._hosted is not None:
                    await self._hosted.close()
            finally:
                self._hosted = None
                if opened:
                    await self.close()

    def lifespan(self: Host, app: object) -> contextlib.AbstractAsyncContextManager[None]:
        """`FastAPI(lifespan=queue.lifespan)` or `Starlette(lifespan=queue.lifespan)`:
        the app's lifespan runs the worker, as `running()` does (with setup). To run
        more at startup, enter it in a lifespan of your own:
        `async with queue.running(): yield`."""
        return _lifespan(self)

    async def health(
        self: Host, *, stuck_after: float = STUCK_AFTER, timeout: float = HEALTH_TIMEOUT
    ) -> Health:
        """Whether this queue can do its work: `Health(True, "ok")`, or
        `Health(False, why)` when it is not open, the worker of `running()` crashed,
        the database does not answer within `timeout` seconds, or the worker's
        statements (or a background service) have failed for `stuck_after` seconds.
        For an application's health route; `/health` of `axa-queue worker` says the same."""
        if not self.is_open:
            return Health(False, "the worker is not running (the queue is not open)")
        hosted = self._hosted
        if hosted is not None and hosted.crash is not None:
            return Health(False, f"the worker crashed: {hosted.crash}")
        if hosted is not None and hosted.task.done():
            return Health(False, "the worker is not running (it stopped)")
        try:
            await asyncio.wait_for(self.ping(), timeout)
        except asyncio.TimeoutError:
            return Health(False, f"the database did not answer within {timeout:g} s")
        except (psycopg.Error, AxaQueueError) as error:
            return Health(False, f"cannot reach the database: {first_line(error)}")
        worker = self.worker
        why = None if worker is None else worker.trouble(stuck_after)
        if why is not None:
            return Health(False, why)
        return Health(True, "ok")


@contextlib.asynccontextmanager
async def _lifespan(queue: Host) -> AsyncIterator[None]:
    async with queue.running():
        yield
