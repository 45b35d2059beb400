"""The worker: claims jobs, runs them under supervision, and records how they ended.

One `Worker` serves one `Queue.run()`. Its parts, each a task:

- the fetcher claims as many ready jobs as there are free loops, in one statement
  that honours priority order and per-name limits, whenever it is woken: by a
  notification, by a loop coming free, or by the poll interval;
- each run supervises one handler: its timeout, and whether its claim was lost;
- the heartbeat reports in for all running jobs of this process in one statement
  per interval; a run whose attempt no longer matches lost its claim, so its
  handler is stopped and its job goes to `needs_review`;
- the acker records how runs ended, many rows per statement, each fenced by its
  own attempt. While one write is in flight the next batch gathers, so at low load
  a result is written at once and at high load many share a statement. A result is
  durable once that statement commits: a process killed in between (a window of one
  round trip) leaves its job `running`, and stale recovery runs it again;
- the listener wakes the fetcher on LISTEN/NOTIFY, reconnecting when it drops;
- housekeeping and schedule ticks (see `maintenance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

import psycopg

from . import maintenance, sql
from .options import to_seconds, to_timedelta
from .retries import backoff, cut_error, describe

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["Worker"]

log = logging.getLogger("axa_queue.worker")

MIN_HEARTBEAT = 0.02
"""The shortest gap between heartbeats, in seconds, so a tiny setting cannot spin."""

RETRY_DATABASE = 0.5
"""Seconds between tries when the database does not answer a write that must land."""

RunObserver = Callable[[str, str, float], None]
"""Told `(job name, outcome, seconds)` as each run ends; see `Queue.observe`."""

OUTCOMES = {"completed": "completed", "queued": "retried", "failed": "failed"}
"""The outcome an observer is told for each status an ending writes."""


@dataclass(eq=False)
class Run:
    """One claimed run of a job, identified by its id and attempt."""

    id: UUID
    name: str
    attempts: int
    limit: int
    timeout: float | None
    args_text: str = field(repr=False)
    last_heard: float
    done: bool = False
    stopped: tuple[str, str] | None = None
    """Why the run was stopped from outside: ("lost", reason) or ("timeout", text)."""
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    seconds: float = 0.0
    """How long the handler ran, once it has ended."""

    def stop(self, kind: str, reason: str) -> None:
        """Stop this run's handler: its claim is gone, or its time is up."""
        if self.done or self.stopped is not None:
            return
        self.stopped = (kind, reason)
        if self.task is not None:
            self.task.cancel()

    def lose(self, reason: str) -> None:
        """Stop this run: its claim is gone."""
        self.stop("lost", reason)

    def fields(self) -> dict[str, Any]:
        """The log fields that name this run (never its arguments)."""
        return {"job_id": str(self.id), "job": self.name, "attempt": self.attempts}


@dataclass(frozen=True)
class Ending:
    """How a run ended, waiting to be written."""

    run: Run
    status: str
    error: str | None
    delay: float


class Worker:
    """Runs a queue's jobs until stopped. Made and driven by `Queue.run`."""

    def __init__(self, queue: Queue, identity: str | None = None) -> None:
        self.queue = queue
        self.options = queue.options
        self.pool = queue.pool
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.slots = self.options.workers
        self.runs: dict[tuple[UUID, int], Run] = {}
        self.in_use: Counter[str] = Counter()
        self.endings: list[Ending] = []
        self.writing = 0  # endings taken from `endings` whose write is not yet answered
        self.endings_ready = asyncio.Event()
        self.wake = asyncio.Event()
        self.stopping = False
        self.executor = ThreadPoolExecutor(
            max_workers=self.slots, thread_name_prefix="axa-queue-job"
        )
        self.helpers: set[asyncio.Task[Any]] = set()
        self.wake_at: asyncio.TimerHandle | None = None
        self.stats: Counter[str] = Counter()

    # --- the whole ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then let jobs in progress finish and return.
        Cancelled, it aborts jobs in progress and leaves them for stale recovery."""
        background = [
            self._spawn(self._fetch_loop(), "fetcher"),
            self._spawn(self._heartbeat_loop(), "heartbeat"),
            self._spawn(self._ack_loop(), "acker"),
            self._spawn(self._maintenance_loop(), "maintenance"),
        ]
        if self.queue.schedule_list:
            background.append(self._spawn(self._schedule_loop(), "schedules"))
        if self.options.listen and self.queue.notifies:
            background.append(self._spawn(self._listen_loop(), "listener"))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([stopped, *background], return_when=asyncio.FIRST_COMPLETED)
            for task in background:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            self.stopping = True
            self.wake.set()
            # A claim in flight starts its runs before the fetcher returns; they are
            # claimed, so they run to their end like the others.
            await background[0]
            await self._finish_runs()
            await self._flush_all()
        except BaseException:
            for one in list(self.runs.values()):
                if one.task is not None:
                    one.task.cancel()
            raise
        finally:
            stopped.cancel()
            for task in background:
                task.cancel()
            for task in [*background, *self.helpers]:
                with contextlib.suppress(BaseException):
                    await task
            if self.wake_at is not None:
                self.wake_at.cancel()
            self.executor.shutdown(wait=False, cancel_futures=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(coro, name=f"axa-queue-{name}")

    async def _finish_runs(self) -> None:
        grace = self.options.shutdown_grace
        tasks = [r.task for r in self.runs.values() if r.task is not None]
        if not tasks:
            return
        log.info("stopping: waiting for jobs in progress", extra={"running": len(tasks)})
        timeout = None if grace is None else to_seconds(grace)
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            log.warning(
                "stopping: aborting jobs still running after the grace period; "
                "stale recovery will queue them again",
                extra={"aborted": len(pending)},
            )
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)

    # --- claiming ----------------------------------------------------------------------

    def _claimable(self, free: int) -> tuple[list[str], list[str], list[int]]:
        """Names with no limit, and limited names with their free places."""
        names: list[str] = []
        capped: list[str] = []
        caps: list[int] = []
        for name in self.queue.handlers:
            limit = self.queue.limits.get(name)
            if limit is None:
                names.append(name)
            elif (room := min(limit - self.in_use[name], free)) > 0:
                capped.append(name)
                caps.append(room)
        return names, capped, caps

    async def _fetch_loop(self) -> None:
        poll = self.options.seconds("poll_interval")
        idle = False
        while not self.stopping:
            free = self.slots - len(self.runs)
            if idle or free <= 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), poll)
                self.wake.clear()
                if self.stopping:
                    return
                free = self.slots - len(self.runs)
                if free <= 0:
                    continue
            names, capped, caps = self._claimable(free)
            if not names and not capped:
                idle = True
                continue
            try:
                claimed = await self._claim(free, names, capped, caps)
            except psycopg.Error as error:
                log.error(
                    "could not claim jobs; trying again after the poll interval",
                    extra={"error": str(error)},
                )
                idle = True
                continue
            for one in claimed:
                self._start(one)
            idle = len(claimed) < free

    async def _claim(
        self, free: int, names: list[str], capped: list[str], caps: list[int]
    ) -> list[Run]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                sql.CLAIM, {"free": free, "names": names, "capped": capped, "caps": caps}
            )
            rows = await cursor.fetchall()
        rows.sort(key=lambda row: (-row[6], row[7]))
        now = time.monotonic()
        return [
            Run(
                id=row[0],
                name=row[1],
                args_text=row[2],
                attempts=row[3],
                limit=row[4] if row[4] is not None else self.options.max_attempts,
                timeout=None if row[5] is None else row[5] / 1000,
                last_heard=now,
            )
            for row in rows
        ]

    def _start(self, one: Run) -> None:
        self.runs[(one.id, one.attempts)] = one
        self.in_use[one.name] += 1
        one.task = asyncio.get_running_loop().create_task(self._execute(one))
        if one.timeout is not None:
            one.timer = asyncio.get_running_loop().call_later(
                one.timeout, one.stop, "timeout", f"timed out after {one.timeout:g} s"
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job started", extra={**one.fields(), "worker": self.identity})

    def _release(self, one: Run) -> None:
        if one.timer is not None:
            one.timer.cancel()
        self.runs.pop((one.id, one.attempts), None)
        self.in_use[one.name] -= 1
        self.wake.set()

    # --- running -----------------------------------------------------------------------

    async def _execute(self, one: Run) -> None:
        """Run the handler to its end, its time limit, or the loss of its claim, then
        record the ending. Cancelled from outside (not by `Run.stop`), it aborts: the
        job stays `running` for stale recovery."""
        handler = self.queue.handlers.get(one.name)
        error: str | None = None
        started = time.monotonic()
        try:
            if handler is None:  # only handled names are claimed; kept for safety
                error = f"no handler for job {one.name}"
            else:
                await handler.invoke(handler.decode(json.loads(one.args_text)), self.executor)
        except asyncio.CancelledError:
            if one.stopped is None:
                one.done = True
                self._release(one)
                raise
            _uncancel()
        except BaseException as failure:  # a job's failure, whatever it is
            error = describe(failure)
        one.done = True
        one.seconds = time.monotonic() - started
        if one.stopped is not None and one.stopped[0] == "lost":
            # Keep the run's slot until its job is sent to review, so this process
            # cannot claim the job it just lost again first (the crate's loop cannot).
            try:
                await asyncio.shield(self._lost(one, f"stopped: {one.stopped[1]}"))
            finally:
                self._release(one)
            return
        self._release(one)
        if one.stopped is not None:  # timed out (also when a handler swallowed the cancellation)
            error = one.stopped[1]
        if error is None:
            self.stats["completed"] += 1
            self._end(Ending(one, "completed", None, 0.0))
            return
        error = cut_error(error)
        if one.attempts < one.limit:
            wait = backoff(to_timedelta(self.options.retry_backoff), one.attempts)
            self.stats["retried"] += 1
            log.warning(
                "job failed, will retry",
                extra={**one.fields(), "error": error, "retry_in": wait.total_seconds()},
            )
            self._end(Ending(one, "queued", error, wait.total_seconds()))
            self._wake_in(wait)
        else:
            self.stats["failed"] += 1
            log.error("job failed", extra={**one.fields(), "error": error})
            self._end(Ending(one, "failed", error, 0.0))

    def _lost(self, one: Run, text: str) -> asyncio.Task[Any]:
        self.stats["lost"] += 1
        self._observe(one, "lost")
        log.error(
            "job stopped: it lost its claim; it now waits for review",
            extra={**one.fields(), "reason": text},
        )
        return self._spawn_helper(self._mark_lost(one, text))

    # --- recording endings -------------------------------------------------------------

    def _end(self, ending: Ending) -> None:
        self.endings.append(ending)
        self.endings_ready.set()

    async def _ack_loop(self) -> None:
        while True:
            await self.endings_ready.wait()
            self.endings_ready.clear()
            while self.endings:
                batch, self.endings = self.endings, []
                self.writing = len(batch)  # so a stop waits for this write too
                try:
                    kept = await self._write_endings(batch)
                except psycopg.Error as error:
                    self.writing = 0
                    log.error(
                        "could not record finished jobs; trying again",
                        extra={"error": str(error), "jobs": len(batch)},
                    )
                    self.endings = batch + self.endings
                    await asyncio.sleep(RETRY_DATABASE)
                    continue
                self.writing = 0
                for ending in batch:
                    if (ending.run.id, ending.run.attempts) not in kept:
                        self.stats[ending.status if ending.status != "queued" else "retried"] -= 1
                        self._lost(
                            ending.run,
                            "stopped: it finished after another worker or recovery took its claim",
                        )
                    else:
                        self._observe(ending.run, OUTCOMES[ending.status])

    def _observe(self, one: Run, outcome: str) -> None:
        """Tell the queue's observers how a run ended (never its arguments)."""
        for observer in self.queue.observers:
            try:
                observer(one.name, outcome, one.seconds)
            except Exception as error:
                log.error("a run observer failed", extra={**one.fields(), "error": describe(error)})

    async def _write_endings(self, batch: list[Ending]) -> set[tuple[UUID, int]]:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                sql.FINISH,
                (
                    [e.run.id for e in batch],
                    [e.run.attempts for e in batch],
                    [e.status for e in batch],
                    [e.error for e in batch],
                    [e.delay for e in batch],
                ),
            )
            return {(row[0], row[1]) for row in await cursor.fetchall()}

    async def _flush_all(self) -> None:
        """Wait until every ending is written and every lost job marked."""
        while self.endings or self.writing or self.helpers:
            self.endings_ready.set()
            await asyncio.sleep(0.005)

    async def _mark_lost(self, one: Run, text: str) -> None:
        """Send the job to review, trying until the database answers, as the run must
        not be taken for a crash and retried."""
        while True:
            try:
                async with self.pool.connection() as conn:
                    await conn.execute(sql.MARK_LOST, (cut_error(text), one.id))
                return
            except psycopg.Error as error:
                log.error(
                    "could not mark a lost job for review; trying again",
                    extra={**one.fields(), "error": str(error)},
                )
                await asyncio.sleep(RETRY_DATABASE)

    def _spawn_helper(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self._spawn(coro, "helper")
        self.helpers.add(task)
        task.add_done_callback(self.helpers.discard)
        return task

    # --- heartbeats --------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        every = max(self.options.seconds("heartbeat_interval"), MIN_HEARTBEAT)
        stale = self.options.seconds("stale_after")
        while True:
            await asyncio.sleep(every)
            runs = [r for r in self.runs.values() if not r.done]
            if not runs:
                continue
            try:
                async with self.pool.connection() as conn:
                    cursor = await conn.execute(
                        sql.HEARTBEAT, ([r.id for r in runs], [r.attempts for r in runs])
                    )
                    alive = {(row[0], row[1]) for row in await cursor.fetchall()}
            except psycopg.Error as error:
                log.warning("heartbeat failed", extra={"error": str(error), "jobs": len(runs)})
                now = time.monotonic()
                for one in runs:
                    if now - one.last_heard >= stale:
                        one.lose(f"it could not report in for {stale:g} s")
                continue
            now = time.monotonic()
            for one in runs:
                if (one.id, one.attempts) in alive:
                    one.last_heard = now
                elif not one.done:
                    one.lose("another worker or recovery took its claim")

    # --- wake-ups ----------------------------------------------------------------------

    def _wake_in(self, delay: timedelta | float) -> None:
        """Look for work again after `delay`, keeping only the earliest such timer."""
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds <= 0:
            self.wake.set()
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        if self.wake_at is not None and not self.wake_at.cancelled():
            if self.wake_at.when() <= when and self.wake_at.when() > loop.time():
                return
            self.wake_at.cancel()
        self.wake_at = loop.call_at(when, self.wake.set)

    async def _listen_loop(self) -> None:
        schema = self.queue.schema
        pause = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.queue.dsn or "", autocommit=True, **self.queue.connect_kwargs()
                )
                async with conn:
                    await conn.execute(sql.LISTEN)
                    pause = 0.1
                    self.wake.set()  # anything queued while we were not listening
                    async for note in conn.notifies():
                        there, _, delay = note.payload.rpartition(" ")
                        if there != schema:
                            continue
                        try:
                            self._wake_in(float(delay or 0))
                        except ValueError:
                            self.wake.set()
            except psycopg.Error as error:
                log.warning(
                    "lost the notification connection; polling until it is back",
                    extra={"error": str(error)},
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, self.options.seconds("poll_interval"), 5.0)

    # --- housekeeping ------------------------------------------------------------------

    async def _maintenance_loop(self) -> None:
        every = self.options.seconds("maintenance_interval")
        while True:
            await maintenance.run_once(self.queue)
            await asyncio.sleep(every)

    async def _schedule_loop(self) -> None:
        every = self.options.seconds("poll_interval")
        while True:
            try:
                queued = await self.queue.tick_schedules()
                if queued:
                    self.wake.set()
            except psycopg.Error as error:
                log.error("could not queue scheduled jobs", extra={"error": str(error)})
            await asyncio.sleep(every)


def _uncancel() -> None:
    """Forget a cancellation this worker asked for (Python 3.11+ counts them)."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()
