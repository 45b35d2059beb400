"""The worker: claims jobs, runs them under supervision, and records how they ended.

One `Worker` serves one `Queue.run()`. Its parts, each a task:

- the exchange loop sends one statement (`sql.EXCHANGE`) that records how finished
  runs ended, many rows at once, each fenced by its own attempt, and in the same
  commit claims as many ready jobs as there are free loops, honouring priority order
  and per-name limits. It sends the next as soon as the last is answered and there is
  something to do: endings to record, or free loops and a reason to look for work (a
  notification, a loop coming free, a retry's backoff ending, or the poll interval).
  While one statement is in flight the next batch gathers, so at low load an ending is
  written at once and at high load many share a statement (with `prefetch`, while
  every loop is busy, endings also wait up to `HOLD_ENDINGS` for others). An ending is
  durable once its statement commits: a process killed in between leaves its job
  `running`, and stale recovery runs it again;
- each run supervises one handler: its timeout, and whether its claim was lost; a
  run whose claim may have expired (it waited, the event loop was blocked, or a
  connection dropped since it was last heard) proves it with a heartbeat before its
  handler starts;
- the heartbeat reports in for all jobs of this process in one statement per
  interval, on a connection of its own (no pool, no reconnect backoff); a run whose
  attempt no longer matches lost its claim, so its handler is stopped and its job
  goes to `needs_review` (see `sql.MARK_LOST`);
- the listener wakes the exchange loop on LISTEN/NOTIFY, reconnecting when it drops;
- housekeeping and schedule ticks (see `maintenance`); stale recovery runs on the
  heartbeat's connection, only once it has been connected for `stale_after`, and never
  takes back a run this process holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import timedelta
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

import psycopg

from . import maintenance, pooler, sql
from .options import to_seconds, to_timedelta
from .retries import backoff, cut_error, describe, first_line

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["Worker"]

log = logging.getLogger("axa_queue.worker")

MIN_HEARTBEAT = 0.02
"""The shortest gap between heartbeats, in seconds, so a tiny setting cannot spin."""

RETRY_DATABASE = 0.5
"""Seconds between tries when the database does not answer a write that must land."""

STUCK_AFTER = 30.0
"""Seconds of failed statements, the database answering all along, before a health
check says the worker is stuck (see `Worker.trouble`)."""

CANCEL_AGAIN = 0.1
"""Seconds to wait for a cancelled task to end before cancelling it again: on Python
3.10 and 3.11 `asyncio.wait_for` (which psycopg_pool uses while a task waits for a
connection) loses a cancellation that arrives as the connection is handed over, and the
task goes on as if nothing happened."""

CANCEL_GIVE_UP = 5.0
"""Seconds of cancelling again before a stop leaves behind tasks that will not end."""

SERVICE_RETRY_MAX = 60.0
"""The longest wait before a failing background service (maintenance, the listener)
tries again; it starts at the poll interval and doubles."""

LOG_AGAIN = 60.0
"""Seconds between log lines for a schedule that keeps failing."""

HOLD_ENDINGS = 0.020
"""Seconds an ending may wait for others to share its statement, only while every loop
is busy and enough claimed jobs wait for them (`prefetch`); else it is written at once."""

RunObserver = Callable[[str, str, float], None]
"""Told `(job name, outcome, seconds)` as each run ends; see `Queue.observe`."""

GAVE_UP = "it could not report in"
"""How the reason of a run stopped by its own worker for want of contact begins."""

OUTCOMES = {"completed": "completed", "queued": "retried", "failed": "failed"}
"""The outcome an observer is told for each status an ending writes."""


@dataclass(eq=False, slots=True)
class Run:
    """One claimed run of a job, identified by its id (as text) and attempt; once it
    has ended, also how, waiting to be written (`status`, `error`, `delay`)."""

    id: str
    name: str
    attempts: int
    limit: int
    timeout: float | None
    args_text: str = field(repr=False)
    last_heard: float
    """When (monotonic) the last statement that proved its claim was sent."""
    done: bool = False
    stopped: tuple[str, str] | None = None
    """Why the run was stopped from outside: ("lost", reason) or ("timeout", text)."""
    order: tuple[int, float] = (0, 0.0)
    """Claim order: (minus priority, run_at in epoch seconds)."""
    task: asyncio.Task[None] | None = None
    """The loop running it, once it runs; the same loop goes on to later runs."""
    started: bool = False
    """Whether its handler was called (a run stopped before that did no work)."""
    timer: asyncio.TimerHandle | None = None
    seconds: float = 0.0
    """How long the handler ran, once it has ended."""
    cancelled: bool = False
    """Whether `stop` cancelled its loop's task (a cancellation to forget when handled)."""
    status: str = "running"
    """How it ended: `completed`, `failed`, or `queued` again after `delay` seconds."""
    error: str | None = None
    delay: float = 0.0

    def stop(self, kind: str, reason: str) -> None:
        """Stop this run's handler: its claim is gone, or its time is up."""
        if self.done or self.stopped is not None:
            return
        self.stopped = (kind, reason)
        if self.task is not None:
            # Its loop is waiting inside this run's handler (nothing else of the run
            # awaits before it is done), so the cancellation lands in this handler.
            self.cancelled = True
            self.task.cancel()

    def lose(self, reason: str) -> None:
        """Stop this run: its claim is gone."""
        self.stop("lost", reason)

    def fields(self) -> dict[str, Any]:
        """The log fields that name this run (never its arguments)."""
        return {"job_id": self.id, "job": self.name, "attempt": self.attempts}

    def end(self, status: str, error: str | None = None, delay: float = 0.0) -> Run:
        """Say how the run ended; it is then written with the next exchange."""
        self.status = status
        self.error = error
        self.delay = delay
        return self


class Worker:
    """Runs a queue's jobs until stopped. Made and driven by `Queue.run`."""

    def __init__(self, queue: Queue, identity: str | None = None) -> None:
        self.queue = queue
        self.options = queue.options
        self.pool = queue.pool
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.slots = self.options.workers
        self.room = self.options.workers + self.options.prefetch
        """Runs this process may hold: its loops, and the jobs claimed ahead for them."""
        self.low_water = max(self.slots, self.options.prefetch // 4)
        """With no more jobs claimed ahead than this waiting, claim more now (`_due`)."""
        self.waiting: list[Run] = []
        """Runs claimed ahead (`prefetch`), best first, waiting for a loop."""
        self.active = 0
        """Runs whose handler has started and not yet ended."""
        self.runs: dict[tuple[str, int], Run] = {}
        self.in_use: Counter[str] = Counter()
        self.endings: list[Run] = []
        """Runs that ended, waiting to be written."""
        self.endings_since = 0.0
        """When the oldest ending not yet sent was made (event loop time)."""
        self.flush_at: asyncio.TimerHandle | None = None
        """Sends the endings gathered once the oldest has waited `HOLD_ENDINGS`."""
        self.nudge = asyncio.Event()
        """Set when there may be something to do: an ending, a free loop, new work."""
        self.look = True
        """Whether there may be work not looked for yet (else exchanges only record)."""
        self.wakes = 0
        """How many times something said there may be new work."""
        self.claiming = False
        """Whether a statement in flight may bring new runs."""
        self.stopping = False
        """No more claims: jobs in progress finish, their endings are recorded."""
        self.closing = False
        """The exchange loop returns once every ending is recorded."""
        self.executor = JobThreads(self.slots, "axa-queue-job")
        self.helpers: set[asyncio.Task[Any]] = set()
        self.connection: psycopg.AsyncConnection[Any] | None = None
        """The exchange loop's connection, made on first use."""
        self.side: psycopg.AsyncConnection[Any] | None = None
        """Heartbeats, claim checks, lost runs and stale recovery: a connection of its own,
        made again at once when it breaks (a pool would wait out its reconnect backoff)."""
        self.connected_since: float | None = None
        """When (monotonic) `side` was last connected; stale recovery waits `stale_after`."""
        self.broken_at = -1.0
        """When (monotonic) a connection of this worker last broke: runs heard of before
        must prove their claim before their handler starts."""
        self.sending: list[Run] = []
        """The endings in the statement in flight."""
        self.losing: set[str] = set()
        """Ids of jobs whose run here lost its claim, until its fate is written: never
        claimed again meanwhile."""
        self.stale = self.options.seconds("stale_after")
        self.wake_at: asyncio.TimerHandle | None = None
        self.stats: Counter[str] = Counter()
        self.failing: tuple[float, str] | None = None
        """Since when (monotonic) and why exchanges have failed, with none gone through
        since; see `trouble`."""
        self.troubles: dict[str, tuple[float, str]] = {}
        """Background services (`schedules`, `maintenance`, `listener`) failing now: since
        when (monotonic) and why (the error's type and first line); see `trouble`."""
        self.aborting = False
        """Whether this worker cancelled its runs' loops (an abort, or the grace period
        over): a `CancelledError` in a handler is then ours, not the handler's own."""

    # --- the whole ---------------------------------------------------------------------

    def failing_for(self) -> float:
        """Seconds every exchange has failed, none going through; 0 while they do.
        Safe from any thread."""
        failing = self.failing
        return 0.0 if failing is None else time.monotonic() - failing[0]

    def stuck_for(self) -> float:
        """Seconds this worker has been failing at something: its exchanges, or one of
        its background services (see `trouble`); 0 while all go through. Safe from any
        thread."""
        now = time.monotonic()
        since = [since for since, _ in list(self.troubles.values())]
        return max([self.failing_for(), *(now - s for s in since)])

    def trouble(self, after: float) -> str | None:
        """Why this worker cannot do its work, once every exchange for `after` seconds
        has failed (the database answers, but not to the worker's statements: a table
        gone, a privilege revoked, a disk full), or a background service has failed
        for that long ("schedules failing for 42 s: schedule 'nightly': TypeError:
        ..."); else None. Safe from any thread."""
        failing = self.failing
        seconds = self.failing_for()
        if failing is not None and seconds >= after:
            return (
                f"the worker has failed to claim or record jobs for {seconds:.0f} s: {failing[1]}"
            )
        now = time.monotonic()
        for name, (since, why) in sorted(dict(self.troubles).items()):
            if now - since >= after:
                return f"{name} failing for {now - since:.0f} s: {why}"
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then let jobs in progress finish and return.
        Cancelled, it aborts jobs in progress and leaves them for stale recovery.

        What the schedules, housekeeping or the listener raise never ends it: each is
        logged (its type and first line, never a job's arguments), reported by
        `trouble`, and tried again while jobs keep running. Once `stop` is set it
        returns within `shutdown_grace` (when set), whatever the database does."""
        background = [
            self._spawn(self._exchange_loop(), "exchange"),
            self._spawn(self._heartbeat_loop(), "heartbeat"),
            self._spawn(self._maintenance_loop(), "maintenance"),
        ]
        if self.queue.schedule_list:
            background.append(self._spawn(self._schedule_loop(), "schedules"))
        if self.queue.notifies and pooler.listens(self.options):
            background.append(self._spawn(self._listen_loop(), "listener"))
        stopped = asyncio.ensure_future(stop.wait())
        grace = self.options.shutdown_grace
        try:
            await asyncio.wait([stopped, *background], return_when=asyncio.FIRST_COMPLETED)
            for task in background:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            self.stopping = True
            self.nudge.set()
            deadline = None if grace is None else time.monotonic() + to_seconds(grace)
            # Runs claimed by a statement in flight start when it is answered: they
            # are claimed, so they run to their end like the others.
            await self._finish_runs(deadline)
            self.closing = True
            self.nudge.set()
            # Endings are recorded, and lost jobs sent to review, while the grace lasts;
            # what is not written by then is left `running`, for stale recovery.
            while unfinished := [t for t in [background[0], *self.helpers] if not t.done()]:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0.0:
                    if self.endings or self.helpers:
                        log.warning(
                            "stopping: the grace period is over before every ending was "
                            "recorded; stale recovery will queue those jobs again",
                            extra={"endings": len(self.endings), "lost": len(self.helpers)},
                        )
                    break
                await asyncio.wait(unfinished, timeout=left)
            exchange = background[0]
            if exchange.done() and not exchange.cancelled() and exchange.exception() is not None:
                raise exchange.exception()  # type: ignore[misc]
        except BaseException:
            self.aborting = True
            for one in list(self.runs.values()):
                if one.task is not None:
                    one.task.cancel()
            raise
        finally:
            self.aborting = True  # what is cancelled from here on is ours
            stopped.cancel()
            tasks = [*background, *self.helpers]
            tasks += [one.task for one in self.runs.values() if one.task is not None]
            await _cancel_all(tasks)
            for timer in (self.wake_at, self.flush_at):
                if timer is not None:
                    timer.cancel()
            for one in self.runs.values():
                if one.timer is not None:
                    one.timer.cancel()
            self.executor.shutdown(wait=False, cancel_futures=True)
            if self.connection is not None:
                await self.connection.close()
            if self.side is not None:
                await self.side.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(coro, name=f"axa-queue-{name}")

    async def _finish_runs(self, deadline: float | None) -> None:
        """Wait for jobs in progress (also those a claim in flight brings), aborting any
        still running at `deadline` (monotonic; the end of `shutdown_grace`)."""
        told = False
        while self.runs or self.claiming:
            tasks = [r.task for r in self.runs.values() if r.task is not None]
            if not tasks:
                if deadline is not None and time.monotonic() >= deadline:
                    self._forget_waiting()  # a claim still in flight: its runs stay `running`
                    return
                await asyncio.sleep(0.001)  # a claim in flight: its runs start when answered
                continue
            if not told:
                log.info("stopping: waiting for jobs in progress", extra={"running": len(tasks)})
                told = True
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0)
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending and deadline is not None and time.monotonic() >= deadline:
                log.warning(
                    "stopping: aborting jobs still running after the grace period; "
                    "stale recovery will queue them again",
                    extra={"aborted": len(pending)},
                )
                self.aborting = True
                await _cancel_all(pending)
                self._forget_waiting()

    def _forget_waiting(self) -> None:
        """Let go of runs claimed ahead that never started: like the runs aborted, they
        stay `running` for stale recovery."""
        for one in self.waiting:
            self.runs.pop((one.id, one.attempts), None)
            self.in_use[one.name] -= 1
        self.waiting = []

    # --- claiming ----------------------------------------------------------------------

    def _wanted(self, free: int) -> list[dict[str, Any]]:
        """The names to claim, each with how many it may take now (its free places
        under a limit, else all free loops), as `sql.EXCHANGE` reads them."""
        wanted: list[dict[str, Any]] = []
        for name in self.queue.handlers:
            limit = self.queue.limits.get(name)
            room = free if limit is None else min(limit - self.in_use[name], free)
            if room > 0:
                wanted.append({"name": name, "cap": room})
        return wanted

    def _due(self) -> bool:
        """Whether the next exchange should go now rather than let endings gather.

        Only with `prefetch` can it wait: while every loop is busy and more jobs
        claimed ahead wait than `low_water` (the loops, or a quarter of `prefetch` if
        more: enough for the loops while a statement is in flight), nothing needs the
        database yet, so endings gather (for up to `HOLD_ENDINGS`) and one statement
        records them all and claims as many. A loop coming free, the waiting jobs
        running low, or stopping makes it due at once."""
        return (
            self.stopping
            or self.active < self.slots
            or len(self.waiting) <= self.low_water
            or len(self.endings) >= self.room
        )

    def _poke(self) -> None:
        """Wake the exchange loop if it has something to send now; endings that may
        wait are sent by the `HOLD_ENDINGS` timer (set by the loop) at the latest."""
        if self._due():
            self.nudge.set()

    def _flush_due(self) -> None:
        """The oldest ending gathered has waited `HOLD_ENDINGS`: send them now."""
        self.flush_at = None
        self.nudge.set()

    def _poll_due(self) -> None:
        """The poll interval passed with nothing said: look for work anyway."""
        self.look = True
        self.nudge.set()

    async def _exchange_loop(self) -> None:
        poll = self.options.seconds("poll_interval")
        loop = asyncio.get_running_loop()
        while True:
            free = 0 if self.stopping else self.room - len(self.runs)
            claim = free > 0 and self.look
            if not self.endings and not claim:
                if self.closing:
                    return
                # A timer rather than wait_for: no task per wait on the path of a wake-up.
                timer = None if free <= 0 else loop.call_later(poll, self._poll_due)
                await self.nudge.wait()
                if timer is not None:
                    timer.cancel()
                self.nudge.clear()
                continue
            if not self._due() and (
                not self.endings or loop.time() < self.endings_since + HOLD_ENDINGS
            ):
                # Busy loops and jobs waiting for them: let endings gather, so one
                # statement records many and claims many (see `_due`).
                if self.endings and self.flush_at is None:
                    self.flush_at = loop.call_at(self.endings_since + HOLD_ENDINGS, self._flush_due)
                await self.nudge.wait()
                self.nudge.clear()
                continue
            if self.flush_at is not None:
                self.flush_at.cancel()
                self.flush_at = None
            batch, since, self.endings = self.endings, self.endings_since, []
            wanted = self._wanted(free) if claim else []
            wakes = self.wakes
            self.claiming = bool(wanted)
            self.sending = batch
            try:
                claimed, kept = await self._exchange(batch, free if wanted else 0, wanted)
            except psycopg.Error as error:
                self.sending = []
                self.claiming = False
                since_failing = self.failing[0] if self.failing else time.monotonic()
                self.failing = (since_failing, first_line(error))
                log.error(
                    "could not record finished jobs or claim new ones; trying again",
                    extra={"error": first_line(error), "endings": len(batch)},
                )
                self.endings = batch + self.endings
                if batch:
                    self.endings_since = since
                await asyncio.sleep(min(RETRY_DATABASE, poll))
                continue
            self.sending = []
            self.claiming = False
            self.failing = None
            got = len(claimed)
            self._take(claimed)
            if claim and got < free and self.wakes == wakes:
                # Fewer than it could take, and nothing new since it asked: there is
                # no work for us until a notification, a timer, a limited name's place
                # coming free, or the poll interval says otherwise.
                self.look = False
            self._recorded(batch, kept)

    async def _exchange_connection(self) -> psycopg.AsyncConnection[Any]:
        """The exchange loop's own connection: one statement at a time, so no pool
        checkout on the path from a wake-up to a claim."""
        if self.connection is None or self.connection.closed:
            self.connection = await self._connect()
        return self.connection

    async def _connect(self, **extra: Any) -> psycopg.AsyncConnection[Any]:
        """A connection of the worker's own, with the queue's settings (and, unless
        behind a transaction pooler, its session settings)."""
        conn = await psycopg.AsyncConnection.connect(
            self.queue.dsn or "", autocommit=True, **self.queue.connect_kwargs(), **extra
        )
        if pooler.keeps_session_state(self.options):
            await conn.execute(sql.SESSION_SETTINGS)
        return conn

    async def _exchange(
        self, batch: list[Run], free: int, wanted: list[dict[str, Any]]
    ) -> tuple[list[Run], set[tuple[str, int]] | None]:
        """Record the endings of `batch` and claim up to `free` jobs of the `wanted`
        names in one statement; returns the runs claimed, best first, and the (id,
        attempt) of the endings recorded, or `None` when all of them were."""
        conn = await self._exchange_connection()
        ids: list[str] = []
        attempts: list[str] = []
        others: list[dict[str, Any]] = []
        for one in batch:
            if one.status == "completed":
                ids.append(one.id)
                attempts.append(str(one.attempts))
            else:
                others.append(
                    {
                        "id": one.id,
                        "attempts": one.attempts,
                        "status": one.status,
                        "error": one.error,
                        "delay": one.delay,
                    }
                )
        sent = time.monotonic()
        try:
            cursor = await conn.execute(
                sql.EXCHANGE,
                {
                    # Array literals: ids are uuid text and attempts digits, nothing to quote.
                    "completed": "{" + ",".join(ids) + "}",
                    "completed_attempts": "{" + ",".join(attempts) + "}",
                    "endings": json.dumps(others, ensure_ascii=False) if others else "[]",
                    "free": free,
                    "wanted": json.dumps(wanted, ensure_ascii=False),
                    "losing": "{" + ",".join(self.losing) + "}",
                },
            )
            rows = await cursor.fetchall()
        except psycopg.OperationalError:
            self.connection = None  # broken: the next exchange connects again
            self.broken_at = time.monotonic()
            await conn.close()
            raise
        default_limit = self.options.max_attempts
        claimed = [
            Run(
                row[0],
                row[2],
                row[1],
                row[4] if row[4] is not None else default_limit,
                None if row[5] is None else row[5] / 1000,
                row[3],
                sent,
                order=(-row[6], row[7]),
            )
            for row in rows
            if row[2] is not None
        ]
        if len(claimed) > 1:
            claimed.sort(key=_order)
        if len(rows) - len(claimed) == len(batch):
            return claimed, None  # every ending recorded (the usual case)
        return claimed, {(row[0], row[1]) for row in rows if row[2] is None}

    def _take(self, claimed: list[Run]) -> None:
        """Hold newly claimed runs: start them while loops are free, keep the rest
        waiting, best first, for the next loop to come free."""
        for one in claimed:
            self.runs[(one.id, one.attempts)] = one
            self.in_use[one.name] += 1
        if not self.waiting or not claimed or self.waiting[-1].order <= claimed[0].order:
            self.waiting.extend(claimed)  # the usual case: later claims are no better
        else:
            self.waiting = sorted([*self.waiting, *claimed], key=_order)
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start waiting runs on idle loops."""
        while self.waiting and self.active < self.slots:
            one = self.waiting.pop(0)
            self._begin(one)
            one.task = asyncio.get_running_loop().create_task(self._loop(one))

    async def _loop(self, one: Run) -> None:
        """One loop: run `one`, then each run waiting when it ends, until none waits.
        Going on to the next run in the same step costs no task and no turn of the
        event loop."""
        task = asyncio.current_task()
        while True:
            await self._execute(one)
            if not self.waiting or self.active >= self.slots:
                self._poke()
                return
            one = self.waiting.pop(0)
            self._begin(one)
            one.task = task
            self._poke()

    def _begin(self, one: Run) -> None:
        self.active += 1
        if one.timeout is not None:
            one.timer = asyncio.get_running_loop().call_later(
                one.timeout, one.stop, "timeout", f"timed out after {one.timeout:g} s"
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job started", extra={**one.fields(), "worker": self.identity})

    def _release(self, one: Run) -> None:
        if one.timer is not None:
            one.timer.cancel()
        self.active -= 1
        self.runs.pop((one.id, one.attempts), None)
        self.in_use[one.name] -= 1
        if one.name in self.queue.limits:
            self._wake()  # a place under its limit came free: its jobs may be waiting

    # --- running -----------------------------------------------------------------------

    async def _execute(self, one: Run) -> None:
        """Run the handler to its end, its time limit, or the loss of its claim, then
        record the ending. Cancelled from outside (not by `Run.stop`), it aborts: the
        job stays `running` for stale recovery. A `CancelledError` the handler raises of
        its own is a failure of the attempt like any other."""
        handler = self.queue.handlers.get(one.name)
        error: str | None = None
        started = time.monotonic()
        try:
            if handler is None:  # only handled names are claimed; kept for safety
                error = f"no handler for job {one.name}"
            elif one.stopped is not None or (self._doubtful(one) and not await self._prove(one)):
                pass  # lost while it waited for a loop: its handler never starts
            elif handler.coroutine_function is not None:  # awaited here: a coroutine less
                one.started = True
                await handler.coroutine_function(handler.decode(json.loads(one.args_text)))
            else:
                one.started = True
                await handler.invoke(handler.decode(json.loads(one.args_text)), self.executor)
        except asyncio.CancelledError as failure:
            if one.stopped is None:
                if self._aborted():
                    one.done = True
                    self._release(one)
                    raise
                # The handler's own CancelledError, not a stop: a failure like any other.
                error = f"{describe(failure)} raised by the handler"
        except BaseException as failure:  # a job's failure, whatever it is
            error = describe(failure)
        if one.cancelled:  # stopped by us (also when the handler swallowed it): forget it
            _uncancel()
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
            self._end(one.end("completed"))
            return
        error = cut_error(error)
        if one.attempts < one.limit:
            wait = backoff(to_timedelta(self.options.retry_backoff), one.attempts)
            self.stats["retried"] += 1
            log.warning(
                "job failed, will retry",
                extra={**one.fields(), "error": error, "retry_in": wait.total_seconds()},
            )
            self._end(one.end("queued", error, wait.total_seconds()))
            self._wake_in(wait)
        else:
            self.stats["failed"] += 1
            log.error("job failed", extra={**one.fields(), "error": error})
            self._end(one.end("failed", error))

    def _aborted(self) -> bool:
        """Whether the `CancelledError` a run's handler just ended with is this worker
        being aborted (its loop cancelled: `Queue.run` cancelled, or the grace period
        over), rather than one the handler raised of its own. Python 3.11+ counts the
        cancellations asked of the task; 3.10 relies on the worker's own flag."""
        if self.aborting:
            return True
        task = asyncio.current_task()
        cancelling = getattr(task, "cancelling", None)
        return cancelling is not None and cancelling() > 0

    def _lost(self, one: Run, text: str) -> asyncio.Task[Any]:
        """Write the fate of a run that lost its claim (or gave it up), then log what
        really became of its job; until then this process never claims the job again."""
        if one.started:
            self.stats["lost"] += 1
            self._observe(one, "lost")
        self.losing.add(one.id)
        return self._spawn_helper(self._mark_lost(one, text))

    # --- recording endings -------------------------------------------------------------

    def _end(self, ending: Run) -> None:
        if not self.endings:
            self.endings_since = asyncio.get_running_loop().time()
            self.nudge.set()  # the exchange loop sends it, or sets the timer that will
        self.endings.append(ending)

    def _recorded(self, batch: list[Run], kept: set[tuple[str, int]] | None) -> None:
        """Tell observers of the endings recorded (all of them when `kept` is None);
        send the others' jobs to review."""
        for one in batch:
            if kept is None or (one.id, one.attempts) in kept:
                if self.queue.observers:
                    self._observe(one, OUTCOMES[one.status])
            else:
                self.stats[OUTCOMES[one.status]] -= 1
                self._lost(
                    one, "stopped: it finished after another worker or recovery took its claim"
                )

    def _observe(self, one: Run, outcome: str) -> None:
        """Tell the queue's observers how a run ended (never its arguments)."""
        for observer in self.queue.observers:
            try:
                observer(one.name, outcome, one.seconds)
            except Exception as error:
                log.error("a run observer failed", extra={**one.fields(), "error": describe(error)})

    async def _mark_lost(self, one: Run, text: str) -> None:
        """Decide the job's fate with `sql.MARK_LOST` (review, back to the queue, or left
        as another run left it), trying until the database answers, as the run must
        not be taken for a crash and retried; then log what happened."""
        params = {
            "id": one.id,
            "attempts": one.attempts,
            "started": one.started,
            "gave_up": one.stopped is not None and one.stopped[1].startswith(GAVE_UP),
            "ending": None if one.status == "running" else one.status,
            "ending_error": one.error,
            "error": cut_error(text),
            "max": self.options.max_attempts,
        }
        try:
            while True:
                try:
                    rows = await self._on_side(sql.MARK_LOST, params)
                    break
                except psycopg.Error as error:
                    log.error(
                        "could not write what became of a run that lost its claim; trying again",
                        extra={**one.fields(), "error": first_line(error)},
                    )
                    await asyncio.sleep(RETRY_DATABASE)
        finally:
            self.losing.discard(one.id)
        found = rows[0] if rows else (None, None, None)
        level, message = _fate(one, found[0], found[1], found[2])
        log.log(level, message, extra={**one.fields(), "reason": text})

    def _spawn_helper(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self._spawn(coro, "helper")
        self.helpers.add(task)
        task.add_done_callback(self.helpers.discard)
        return task

    # --- heartbeats --------------------------------------------------------------------

    async def _side_connection(self) -> psycopg.AsyncConnection[Any]:
        """The connection for heartbeats, claim checks, lost runs and stale recovery,
        made again at once when it broke."""
        if self.side is None or self.side.closed:
            # A server that does not answer must not hold heartbeats (and so the
            # runs' giving up) for the system's TCP timeout.
            self.side = await self._connect(connect_timeout=max(2, int(self.stale / 2)))
            self.connected_since = time.monotonic()
        return self.side

    async def _on_side(self, statement: str, params: Any) -> list[Any]:
        """Run one statement on the side connection and return its rows; a broken
        connection is dropped (the next statement connects again) and noted."""
        try:
            conn = await self._side_connection()
        except psycopg.OperationalError:
            self.broken_at = time.monotonic()
            raise
        try:
            cursor = await conn.execute(statement, params)
            return await cursor.fetchall() if cursor.description is not None else []
        except psycopg.OperationalError:
            self.broken_at = time.monotonic()
            if self.side is conn:
                self.side = None
                self.connected_since = None
            await conn.close()
            raise

    async def _beat(self, runs: list[Run]) -> set[tuple[str, int]]:
        """Report in for `runs`; returns the (id, attempt) of those still claimed."""
        rows = await self._on_side(
            sql.HEARTBEAT,
            (
                "{" + ",".join(r.id for r in runs) + "}",
                "{" + ",".join(str(r.attempts) for r in runs) + "}",
            ),
        )
        return {(row[0], row[1]) for row in rows}

    def _doubtful(self, one: Run) -> bool:
        """Whether `one`'s claim may have expired: it was proved (claimed, or a heartbeat
        sent) half of `stale_after` ago or more, or a connection broke since."""
        return (
            time.monotonic() - one.last_heard >= self.stale / 2 or one.last_heard <= self.broken_at
        )

    async def _prove(self, one: Run) -> bool:
        """Whether `one`'s handler may start, once a heartbeat for it proves its claim
        (tried until the database answers). A claim found gone stops the run
        (`one.stopped`) and this returns False: its handler never starts."""
        while True:
            sent = time.monotonic()
            try:
                alive = await self._beat([one])
            except psycopg.Error as error:
                log.warning(
                    "could not check a claim before starting its run; trying again",
                    extra={**one.fields(), "error": first_line(error)},
                )
                await asyncio.sleep(RETRY_DATABASE)
                continue
            if (one.id, one.attempts) in alive:
                one.last_heard = sent
                return True
            one.stopped = ("lost", "its claim was gone before its handler started")
            return False

    async def _heartbeat_loop(self) -> None:
        every = max(self.options.seconds("heartbeat_interval"), MIN_HEARTBEAT)
        stale = self.stale
        while True:
            await asyncio.sleep(every)
            runs = [r for r in self.runs.values() if not r.done]
            # Endings not yet written keep their claims too: the run is still this
            # process's until its ending lands.
            ended = [*self.sending, *self.endings]
            if not runs and not ended:
                continue
            sent = time.monotonic()
            try:
                alive = await self._beat(runs + ended)
            except psycopg.Error as error:
                log.warning(
                    "heartbeat failed", extra={"error": first_line(error), "jobs": len(runs)}
                )
                now = time.monotonic()
                for one in runs:
                    # A run in progress gives up once a replacement may have started
                    # (its last report was sent `stale_after` ago); one not started
                    # waits, and proves its claim before it starts.
                    if one.started and now - one.last_heard >= stale:
                        one.lose(f"{GAVE_UP} for {stale:g} s")
                continue
            for one in runs:
                if (one.id, one.attempts) in alive:
                    one.last_heard = max(one.last_heard, sent)
                elif not one.done:
                    one.lose("another worker or recovery took its claim")

    # --- wake-ups ----------------------------------------------------------------------

    def _wake(self) -> None:
        """Look for work at the next exchange, now."""
        self.wakes += 1
        self.look = True
        self.nudge.set()

    def _wake_in(self, delay: timedelta | float) -> None:
        """Look for work again after `delay`, keeping only the earliest such timer."""
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if seconds <= 0:
            self._wake()
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        if self.wake_at is not None and not self.wake_at.cancelled():
            if self.wake_at.when() <= when and self.wake_at.when() > loop.time():
                return
            self.wake_at.cancel()
        self.wake_at = loop.call_at(when, self._wake)

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
                    self.troubles.pop("listener", None)
                    self._wake()  # anything queued while we were not listening
                    async for note in conn.notifies():
                        there, _, delay = note.payload.rpartition(" ")
                        if there != schema:
                            continue
                        try:
                            self._wake_in(float(delay or 0))
                        except ValueError:
                            self._wake()
            except psycopg.Error as error:
                self._failed("listener", error)
                log.warning(
                    "lost the notification connection; polling until it is back",
                    extra={"error": summary(error)},
                )
            except Exception as error:
                self._failed("listener", error)
                log.error(
                    "the listener failed; polling until it is back",
                    extra={"error": summary(error), "retry_in": pause},
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.options.seconds("poll_interval"), 5.0)

    # --- housekeeping ------------------------------------------------------------------

    def _failed(self, service: str, error: BaseException) -> None:
        """Note that `service` is failing, for `trouble` (since its first failure)."""
        since = self.troubles.get(service, (time.monotonic(), ""))[0]
        self.troubles[service] = (since, summary(error))

    async def _maintenance_loop(self) -> None:
        every = self.options.seconds("maintenance_interval")
        retry = self.options.seconds("poll_interval")
        while True:
            failure: BaseException | None
            try:
                failure = await maintenance.run_once(self.queue, recover=False)
                failure = await self._recover_stale() or failure
            except Exception as error:  # a bug, or anything the database driver raised
                failure = error
                log.error(
                    "housekeeping failed; trying again",
                    extra={"error": summary(error), "retry_in": retry},
                )
            if failure is None:
                self.troubles.pop("maintenance", None)
                retry = self.options.seconds("poll_interval")
                await asyncio.sleep(every)
            else:
                self._failed("maintenance", failure)
                await asyncio.sleep(min(retry, every))
                retry = min(retry * 2, SERVICE_RETRY_MAX)

    def _held(self) -> tuple[str, str]:
        """The (ids, attempts) of every run this process holds, as array literals."""
        held = [*self.runs.values(), *self.sending, *self.endings]
        return (
            "{" + ",".join(r.id for r in held) + "}",
            "{" + ",".join(str(r.attempts) for r in held) + "}",
        )

    async def _recover_stale(self) -> psycopg.Error | None:
        """Stale recovery, on the side connection, once it has been connected for
        `stale_after` (every live worker has had that long to report in since the
        database came back), never taking back a run this process holds. Returns the
        error that stopped it, if any (for the health check)."""
        try:
            conn = await self._side_connection()
        except psycopg.Error as error:
            self.broken_at = time.monotonic()
            log.error("could not recover stale jobs", extra={"error": first_line(error)})
            return error
        since = self.connected_since
        if since is None or time.monotonic() - since < self.stale:
            return None
        try:
            recovered = await maintenance.recover_stale(
                conn, self.stale, self.options.max_attempts, held=self._held()
            )
        except psycopg.Error as error:
            if isinstance(error, psycopg.OperationalError) and self.side is conn:
                self.side, self.connected_since = None, None
                self.broken_at = time.monotonic()
                await conn.close()
            log.error("could not recover stale jobs", extra={"error": first_line(error)})
            return error
        maintenance.log_recovered(recovered)
        return None

    async def _schedule_loop(self) -> None:
        every = self.options.seconds("poll_interval")
        logged: dict[str, float] = {}
        """When each failing schedule was last logged (monotonic)."""
        while True:
            failures: dict[str, Exception]
            try:
                queued, failures = await self.queue.tick_each()
            except Exception as broken:  # the schedules' table, not one schedule
                queued, failures = 0, {"": broken}
            if queued:
                self._wake()
            now = time.monotonic()
            for name in [name for name in logged if name not in failures]:
                del logged[name]
            for name, failure in failures.items():
                if now - logged.get(name, -LOG_AGAIN) >= LOG_AGAIN:
                    logged[name] = now
                    log.error(
                        "could not queue scheduled jobs; trying again"
                        if not name
                        else "a schedule could not queue its job; trying again",
                        extra={
                            **({"schedule": name} if name else {}),
                            "error": summary(failure),
                            "retry_in": every,
                        },
                    )
            if failures:
                name, first = next(iter(failures.items()))
                since = self.troubles.get("schedules", (now, ""))[0]
                where = f"schedule {name!r}: " if name else ""
                self.troubles["schedules"] = (since, f"{where}{summary(first)}")
            else:
                self.troubles.pop("schedules", None)
            await asyncio.sleep(every)


class JobThreads(Executor):
    """The threads sync handlers run in: like `ThreadPoolExecutor`, but its threads are
    daemons, so a handler still running when the worker stops (a thread cannot be
    stopped; its job is left to stale recovery) does not keep the process alive: the
    standard pool's threads are joined at exit, which made a stop hang until the
    handler returned."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max = max_workers
        self._name = name
        self._work: SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._work = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot run a sync handler: the worker has stopped")
            future: Future[Any] = Future()
            call = fn if not kwargs else (lambda *a: fn(*a, **kwargs))
            self._work.put((future, call, args))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                thread.start()
                self._threads.append(thread)
            return future

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                self._work.put(None)  # for the next thread
                return
            future, fn, args = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args)
                except BaseException as error:
                    future.set_exception(error)
                else:
                    future.set_result(result)
                del future, fn, args
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            if cancel_futures:
                while not self._work.empty():
                    item = self._work.get_nowait()
                    if item is not None:
                        item[0].cancel()
            self._work.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _order(one: Run) -> tuple[int, float]:
    """The sort key of runs waiting for a loop: best first."""
    return one.order


async def _cancel_all(tasks: list[asyncio.Task[Any]] | set[asyncio.Task[Any]]) -> None:
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
                "stopping: tasks did not end when cancelled (a handler that swallows "
                "cancellations?); leaving them",
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


def summary(error: BaseException) -> str:
    """What to log of a background service's failure: the error's type and its first
    line, never more (a database error's DETAIL and CONTEXT can quote a job's arguments)."""
    if isinstance(error, psycopg.Error) and error.diag.message_primary:
        line = error.diag.message_primary
    else:
        line = first_line(error) if str(error).strip() else ""
    kind = type(error).__qualname__
    return cut_error(f"{kind}: {line}" if line else kind)[:500]


def _uncancel() -> None:
    """Forget a cancellation this worker asked for (Python 3.11+ counts them)."""
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()


FOUND = {
    "completed": "which completed",
    "running": "which is running",
    "queued": "which is queued",
    "failed": "which failed",
    "cancelled": "which was cancelled",
    "needs_review": "which waits for review",
}
"""How the log says what became of a job replaced by a later attempt."""


def _fate(
    one: Run, status: str | None, attempts: int | None, became: str | None
) -> tuple[int, str]:
    """The level and message logging what became of the job of a run that lost its
    claim, from what `sql.MARK_LOST` found (`status`, `attempts`) and changed it to."""
    head = "job stopped" if one.started else "job not started"
    if status is None or attempts is None:
        return logging.WARNING, f"{head}: its claim was gone, and so is its job (deleted)"
    if became == "needs_review":
        return logging.ERROR, (
            f"{head}: another worker or recovery took its claim while it ran (found it "
            f"{status}, attempt {attempts}); it now waits for review"
        )
    if became is not None:
        now = "queued again" if became == "queued" else "failed: no attempts left"
        return logging.WARNING, f"{head}: no one had taken its claim, so it is {now}"
    if attempts > one.attempts:
        return logging.WARNING, f"{head}: replaced by attempt {attempts}, {FOUND[status]}"
    if attempts == one.attempts and status == one.status:
        return logging.INFO, f"{head}: its ending had been recorded after all ({status})"
    if status == "needs_review":
        return logging.WARNING, f"{head}: its claim was gone; the job already waits for review"
    return logging.WARNING, f"{head}: its claim was gone; the job is now {status}"
