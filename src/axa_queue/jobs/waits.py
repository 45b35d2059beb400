"""Waiting for a job to finish: `Queue.wait` and `SyncQueue.wait`, woken by a
notification, never by reading the table in a loop.

A job has finished, for a waiter, once it is `completed`, `failed`, `cancelled` or
`needs_review` (a person must look at it: nothing more happens to it by itself, so the
waiter gets it back and reads its state). A job queued again after a failed attempt has
not finished.

How a wake-up is never lost (see `sql.EXCHANGE` for the sending side):

1. the waiter's connection `LISTEN`s on `sql.DONE_CHANNEL`;
2. then holds, shared, the waiting lock that every statement finishing jobs tries (so
   from then on they notify), and takes and lets go the ending lock, which waits for
   every such statement that asked before to commit (`sql.WAITING`);
3. only then reads the row; it reads it again on each notification naming the job (or
   `*`), after the connection is made again when it broke, and once more when its time
   is up, before `WaitTimeoutError`.

The statements that finish jobs notify only while some connection holds the waiting
lock, so a queue nobody waits on sends no notification. One `Waiters` serves every `Queue.wait` of a
queue on one connection, closed `LINGER` seconds after its last waiter left;
`SyncQueue.wait` holds a connection of its own while it waits. With `listen=False`, or
behind a transaction pooler (which cannot carry LISTEN), a waiter reads the row every
`poll_interval` instead. Jobs finished by clients that do not notify (the Rust crate,
a hand-written `UPDATE`) are seen at the next notification for another job, or when the
wait's time is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import psycopg

from .. import sql
from ..db.calls import by_name
from ..db.connector import Connector
from ..errors import JobNotFoundError, NotOpenError, WaitTimeoutError
from ..handlers.retries import kind, summary
from ..options import Duration, QueueOptions, to_seconds
from .model import JobInfo, JobState

__all__ = ["FINISHED", "LINGER", "Waiters", "finished", "listens", "wait_sync", "woken"]

log = logging.getLogger("axa_queue")

FINISHED = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.NEEDS_REVIEW}
)
"""The states a wait ends on: nothing more happens to the job by itself."""

LINGER = 10.0
"""Seconds the waiters' connection stays after its last waiter left, for the next one."""

RECONNECT_MAX = 5.0
"""The longest pause between tries to make the waiters' connection again."""


def finished(info: JobInfo) -> bool:
    """Whether a wait for this job is over."""
    return info.state in FINISHED


def listens(options: QueueOptions) -> bool:
    """Whether waiters listen (else they read the row every `poll_interval`): `listen`
    is on and no transaction pooler is in the way."""
    return options.listen and options.resolved_pooler() != "transaction"


def woken(payload: str, tag: str) -> set[str] | None:
    """The job ids a notification on `sql.DONE_CHANNEL` names, for waiters on the table
    whose oid is `tag`: an empty set when it is of another table, `None` for every job
    (`*`)."""
    there, _, ids = payload.partition(" ")
    if there != tag:
        return set()
    if ids == "*":
        return None
    return set(ids.split())


def _seconds(timeout: Duration | None) -> float | None:
    return None if timeout is None else to_seconds(timeout, "timeout")


def _known(job_id: UUID, info: JobInfo | None) -> JobInfo:
    if info is None:
        raise JobNotFoundError(job_id)
    return info


class Waiters:
    """Every `Queue.wait` of one queue, woken through one listening connection."""

    def __init__(self, connector: Connector, read: Callable[[UUID], Awaitable[JobInfo | None]]):
        self.connector = connector
        self.read = read
        """Reads a job (on the queue's pool)."""
        self.events: dict[str, set[asyncio.Event]] = {}
        """What each waiter waits on, by the id of its job."""
        self.task: asyncio.Task[None] | None = None
        self.ready: asyncio.Future[None] | None = None
        """Done once the connection listens and holds the lock (or failed to, first)."""
        self.idle: asyncio.TimerHandle | None = None

    async def wait(self, job_id: UUID, timeout: Duration | None = None) -> JobInfo:
        """The job once finished (see `FINISHED`); `WaitTimeoutError` after `timeout`
        (None: no limit), `JobNotFoundError` when there is no such job."""
        seconds = _seconds(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        info = _known(job_id, await self.read(job_id))
        if finished(info):
            return info
        options = self.connector.options
        event = asyncio.Event()
        key = str(job_id)
        self.events.setdefault(key, set()).add(event)
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        try:
            if listens(options):
                left = None if deadline is None else max(deadline - loop.time(), 0.0)
                try:
                    await asyncio.wait_for(self._listening(), left)
                except asyncio.TimeoutError:
                    # Still waiting for endings in progress to commit: no read is sure
                    # yet but one that finds the job finished.
                    info = _known(job_id, await self.read(job_id))
                    if finished(info):
                        return info
                    raise WaitTimeoutError(job_id, seconds or 0.0, info.state.value) from None
                every = None
            else:
                every = options.poll_interval.total_seconds()
            while True:
                event.clear()
                info = _known(job_id, await self.read(job_id))
                if finished(info):
                    return info
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    raise WaitTimeoutError(job_id, seconds or 0.0, info.state.value)
                pause = left if every is None else every if left is None else min(left, every)
                if pause is None:
                    await event.wait()
                else:
                    # At the time, the row is read once more: finished at the last moment?
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(event.wait(), pause)
        finally:
            waiting = self.events.get(key)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self.events[key]
            if not self.events and self.task is not None:
                self.idle = loop.call_later(LINGER, self._close_idle)

    async def _listening(self) -> None:
        """Make sure the connection listens and holds the lock (`sql.WAITING`); raise
        what stopped it the first time."""
        if self.task is None or self.task.done():
            self.ready = asyncio.get_running_loop().create_future()
            self.task = asyncio.get_running_loop().create_task(
                self._listen(self.ready), name="axa-queue-waiters"
            )
        assert self.ready is not None
        await asyncio.shield(self.ready)

    def _wake(self, ids: set[str] | None) -> None:
        """Wake the waiters of `ids` (None: every waiter) to read their rows."""
        if ids is None:
            for events in self.events.values():
                for event in events:
                    event.set()
            return
        for one in ids:
            for event in self.events.get(one, ()):
                event.set()

    async def _listen(self, ready: asyncio.Future[None]) -> None:
        """Listen until cancelled, waking the waiters each notification names; make the
        connection again when it breaks (then every waiter reads its row)."""
        pause = 0.1
        while True:
            try:
                conn = await self.connector.connect(session=False)
                async with conn:
                    await conn.execute(sql.LISTEN_DONE)
                    cursor = conn.cursor(row_factory=by_name)
                    await cursor.execute(sql.WAITING)
                    row: Any = await cursor.fetchone()
                    tag = str(row.tag)
                    if ready.done():
                        self._wake(None)  # whatever finished while it was away
                    else:
                        ready.set_result(None)
                    pause = 0.1
                    async for note in conn.notifies():
                        self._wake(woken(note.payload, tag))
            except Exception as error:  # a database error, or anything else: try again
                if not ready.done():
                    ready.set_exception(error)
                    return
                log.warning(
                    "lost the connection that waits for jobs to finish (%s); making it again "
                    "in %g s",
                    kind(error),
                    pause,
                    extra={"error": summary(error), "retry_in": pause},
                )
            self._wake(None)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RECONNECT_MAX)

    def _close_idle(self) -> None:
        self.idle = None
        if not self.events and self.task is not None:
            self.task.cancel()
            self.task = None

    async def close(self) -> None:
        """Close the connection, and wake every waiter to read its row once more (on a
        queue closed, that raises `NotOpenError`)."""
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        self._wake(None)
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise
            if self.ready is not None and not self.ready.done():
                # Cancelled before it listened (the lock taken, its answer not yet read):
                # a wait for it would wait for ever; it raises what a closed queue does.
                self.ready.set_exception(NotOpenError())
            if self.ready is not None and self.ready.done() and not self.ready.cancelled():
                self.ready.exception()  # retrieved: nobody may be left to see it


def wait_sync(
    connector: Connector,
    read: Callable[[UUID], JobInfo | None],
    job_id: UUID,
    timeout: Duration | None = None,
) -> JobInfo:
    """`Waiters.wait` for synchronous code, on a connection of its own while it waits."""
    seconds = _seconds(timeout)
    deadline = None if seconds is None else time.monotonic() + seconds
    info = _known(job_id, read(job_id))
    if finished(info):
        return info
    options = connector.options
    if not listens(options):
        every = options.poll_interval.total_seconds()
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeoutError(job_id, seconds or 0.0, info.state.value)
            time.sleep(every if left is None else min(every, left))
            info = _known(job_id, read(job_id))
            if finished(info):
                return info
    key = str(job_id)
    with connector.connect_sync() as conn:
        conn.execute(sql.LISTEN_DONE)
        left = None if deadline is None else deadline - time.monotonic()
        limit = "0" if left is None else f"{max(int(left * 1000), 1)}ms"
        conn.execute(sql.WAITING_LOCK_TIMEOUT, (limit,))
        try:
            row: Any = conn.cursor(row_factory=by_name).execute(sql.WAITING).fetchone()
        except psycopg.errors.LockNotAvailable:
            # Still waiting for endings in progress to commit when the time was up.
            info = _known(job_id, read(job_id))
            if finished(info):
                return info
            raise WaitTimeoutError(job_id, seconds or 0.0, info.state.value) from None
        tag = str(row.tag)
        while True:
            info = _known(job_id, read(job_id))
            if finished(info):
                return info
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeoutError(job_id, seconds or 0.0, info.state.value)
            for note in conn.notifies(timeout=left):
                ids = woken(note.payload, tag)
                if ids is None or key in ids:
                    break
