"""The worker: claims jobs, runs them under supervision, and records how they ended.

One `Worker` serves one `Queue.run()`, composed of services with one owner each:

- `exchange`: one statement records endings and claims jobs (`sql.EXCHANGE`), what
  it carries and returns (`wire`), and one bad value isolated to its job or its name
  (`isolation`, `skips`);
- `runs`: the loops that run handlers, under their timeouts (`invoke`: calling a
  handler; `threads`: sync ones; `shelf`: lent connections; `endings`: their log;
  `stopping`: finishing at a stop);
- `claims`: heartbeats, proofs before a run starts, and every lost claim (one path);
- `listener`: LISTEN/NOTIFY wake-ups; `schedules`: the schedule loop;
- `housekeeping`: maintenance rounds and the worker's own stale recovery;
- `presence`: this process's row in `axa_workers` (who is running, for people);
- `connections`: the worker's own exchange and side connections;
- `decisions`: what to send now, how long to wait, how a run that is over is taken, as
  plain functions;
- `state`: the worker's phase (`Phase`) and the runs it holds, shared by the others;
  `run`: one run (`Run`) and its phases (`RunPhase`);
- `drain`: a worker narrowed to some names that stops once none is ready (for tests).

Services get the `Registry` (handlers, limits, schedules, observers) and the
`Connector` (how to connect), never the `Queue`. docs/design.md draws the worker's
phases and a run's states.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from psycopg_pool import AsyncConnectionPool

from ..db.connector import Connector
from ..handlers.registry import Registry, RunObserver
from ..options import QueueOptions
from .claims import GAVE_UP, MIN_HEARTBEAT, RETRY_DATABASE, Claims
from .connections import Connections
from .decisions import HOLD_ENDINGS, SERVICE_RETRY_MAX
from .exchange import OUTCOMES, Exchange
from .housekeeping import Housekeeping
from .listener import listen
from .presence import Presence
from .run import Run
from .runs import Runner
from .schedules import LOG_AGAIN, Tick, tick_loop
from .state import Phase, State
from .tasks import CANCEL_AGAIN, CANCEL_GIVE_UP, Troubles, cancel_all, summary
from .threads import JobThreads

__all__ = [  # `Worker`, and what other modules import from here
    "CANCEL_AGAIN",
    "CANCEL_GIVE_UP",
    "GAVE_UP",
    "HOLD_ENDINGS",
    "LOG_AGAIN",
    "MIN_HEARTBEAT",
    "OUTCOMES",
    "RETRY_DATABASE",
    "SERVICE_RETRY_MAX",
    "STUCK_AFTER",
    "JobThreads",
    "Phase",
    "Run",
    "RunObserver",
    "Worker",
    "summary",
]

log = logging.getLogger("axa_queue.worker")

STUCK_AFTER = 30.0
"""Seconds of failed statements, the database answering all along, before a health
check says the worker is stuck (see `Worker.trouble`)."""


class Worker:
    """Runs a queue's jobs until stopped. Made and driven by `Queue.run`."""

    def __init__(
        self,
        registry: Registry,
        connector: Connector,
        pool: AsyncConnectionPool | None,
        *,
        schema: str = "public",
        notifies: bool = False,
        tick: Tick | None = None,
        identity: str | None = None,
    ) -> None:
        options: QueueOptions = connector.options
        self.options = options
        self.registry = registry
        self.connector = connector
        self.schema = schema
        self.notifies = notifies
        self.tick = tick
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}"
        self.state = State(options.workers, options.prefetch)
        self.troubles = Troubles()
        self.connections = Connections(connector, options.stale_after.total_seconds())
        self.claims = Claims(self.state, self.connections, registry, options, self._spawn)
        self.runner = Runner(self.state, self.claims, registry, options, self.identity, pool)
        self.exchange = Exchange(
            self.state, self.connections, self.runner, self.claims, registry, options
        )
        self.housekeeping = (
            None
            if pool is None
            else Housekeeping(pool, registry, options, self.state, self.connections, self.troubles)
        )
        """Maintenance rounds and stale recovery; none without a pool (a drain's worker)."""
        self.presence = (
            None if pool is None else Presence(self.state, self.connections, registry, options)
        )
        """This process's row in `axa_workers`; none for a drain's worker (a test's)."""

    # --- what others read ------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self.state.phase

    @property
    def stats(self) -> Counter[str]:
        """Outcomes of runs, each counted once its write is confirmed."""
        return self.state.stats

    @property
    def look(self) -> bool:
        """Whether there may be work not looked for yet."""
        return self.state.look

    @property
    def broken_at(self) -> float:
        """When (`Connections.monotonic()`) a connection of this worker last broke."""
        return self.connections.broken_at

    def failing_for(self) -> float:
        """Seconds every exchange has failed, none going through; 0 while they do.
        Safe from any thread."""
        failing = self.exchange.failing
        return 0.0 if failing is None else time.monotonic() - failing[0]

    def stuck_for(self) -> float:
        """Seconds this worker has been failing at something: its exchanges, a run's
        ending or a name's claims (`Isolation.failing_since`), or one of its background
        services (see `trouble`); 0 while all go through. Safe from any thread."""
        now = time.monotonic()
        since = [since for since, _ in list(self.troubles.since.values())]
        since += self.exchange.isolation.failing_since()
        return max([self.failing_for(), *(now - s for s in since)])

    def trouble(self, after: float) -> str | None:
        """Why this worker cannot do its work, once every exchange for `after` seconds
        has failed (the database answers, but not to the worker's statements: a table
        gone, a privilege revoked, a disk full), a run's ending or a name's claims
        have failed for that long while the others went through (`Isolation.trouble`),
        or a background service has failed for that long ("schedules failing for 42
        s: schedule 'nightly': TypeError: ..."); and for `after` seconds after a job
        loop failed unexpectedly (`Runner._failed`: a bug, which the loop survives);
        else None. Safe from any thread."""
        failing = self.exchange.failing
        seconds = self.failing_for()
        if failing is not None and seconds >= after:
            return (
                f"the worker has failed to claim or record jobs for {seconds:.0f} s: {failing[1]}"
            )
        now = time.monotonic()
        crashed = self.runner.crashed
        if crashed is not None and now - crashed[0] < after:
            return (
                f"a job loop failed {now - crashed[0]:.0f} s ago (it went on with the next "
                f"run): {crashed[1]}"
            )
        apart = self.exchange.isolation.trouble(after)
        if apart is not None:
            return apart
        for name, (since, why) in sorted(dict(self.troubles.since).items()):
            if now - since >= after:
                return f"{name} failing for {now - since:.0f} s: {why}"
        return None

    # --- the phases ------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then let jobs in progress finish and return.
        Cancelled, it aborts jobs in progress and leaves them for stale recovery.

        What the schedules, housekeeping or the listener raise never ends it: each is
        logged (its type and first line, never a job's arguments), reported by
        `trouble`, and tried again while jobs keep running. Once `stop` is set it
        returns within `shutdown_grace` (when set), whatever the database does."""
        state = self.state
        state.phase = Phase.WORKING
        background = [
            self._spawn(self.exchange.loop(), "exchange"),
            self._spawn(self.claims.heartbeat_loop(), "heartbeat"),
        ]
        if self.housekeeping is not None:
            background.append(self._spawn(self.housekeeping.loop(), "maintenance"))
        if self.presence is not None:
            background.append(self._spawn(self.presence.loop(), "presence"))
        if self.registry.schedules and self.tick is not None:
            every = self.options.poll_interval.total_seconds()
            loop = tick_loop(self.tick, every, state, self.troubles)
            background.append(self._spawn(loop, "schedules"))
        if self.notifies and self.connector.listens():
            listening = listen(self.connector, self.schema, state, self.troubles, self.options)
            background.append(self._spawn(listening, "listener"))
        stopped = asyncio.ensure_future(stop.wait())
        grace = self.options.shutdown_grace
        try:
            await asyncio.wait([stopped, *background], return_when=asyncio.FIRST_COMPLETED)
            _raise_failure(background)
            state.phase = Phase.STOPPING
            state.nudge.set()
            deadline = None if grace is None else time.monotonic() + grace.total_seconds()
            # Runs claimed by a statement in flight start when it is answered: they
            # are claimed, so they run to their end like the others.
            await self.runner.finish(deadline)
            state.phase = Phase.CLOSING
            state.nudge.set()
            await self._close(background[0], deadline)
            _raise_failure(background[:1])
            await self._threads_end(deadline)
            await self._leave(deadline)
        except BaseException:
            self.runner.aborting = True
            for one in list(state.runs.values()):
                if one.task is not None:
                    one.task.cancel()
            raise
        finally:
            self.runner.aborting = True  # what is cancelled from here on is ours
            stopped.cancel()
            await self._stopped(background)

    async def _close(self, exchange: asyncio.Task[Any], deadline: float | None) -> None:
        """Closing: endings are recorded, and lost jobs' fates written, while the grace
        lasts; what is not written by then is left `running`, for stale recovery."""
        while unfinished := [t for t in [exchange, *self.claims.tasks] if not t.done()]:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0.0:
                if self.state.endings or self.claims.tasks:
                    log.warning(
                        "stopping: the grace period is over before every ending was "
                        "recorded (endings waiting: %d, lost runs: %d); stale recovery will "
                        "queue those jobs again",
                        len(self.state.endings),
                        len(self.claims.tasks),
                        extra={"endings": len(self.state.endings), "lost": len(self.claims.tasks)},
                    )
                break
            await asyncio.wait(unfinished, timeout=left)

    async def _threads_end(self, deadline: float | None) -> None:
        """Closing: wait, while the grace lasts, for the sync handlers still running in
        their threads though their run is over (it was stopped: its job cancelled, its
        timeout, its claim lost; a thread cannot be interrupted), so that what they do
        once they see `current_job().cancelled` is done when `run()` returns. One still
        running after the grace is named by `_stopped`."""
        threads = self.runner.executor
        for job in threads.running():
            log.info(
                "stopping: waiting for the sync handler of job %s %s (attempt %d), whose run "
                "was stopped, to return",
                job.name,
                job.id,
                job.attempt,
                extra={"job_id": str(job.id), "job": job.name, "attempt": job.attempt},
            )
        await threads.wait(deadline)

    async def _leave(self, deadline: float | None) -> None:
        """A clean stop: remove this process's row from `axa_workers`, within the grace."""
        if self.presence is None:
            return
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        with contextlib.suppress(asyncio.TimeoutError):  # housekeeping removes it later
            await asyncio.wait_for(self.presence.gone(), left)

    async def _stopped(self, background: list[asyncio.Task[Any]]) -> None:
        """End every task, timer and connection of this worker."""
        state = self.state
        tasks = [*background, *self.claims.tasks]
        tasks += [one.task for one in state.runs.values() if one.task is not None]
        await cancel_all(tasks)
        for job in self.runner.executor.running():
            log.warning(
                "stopped without the sync handler of job %s %s (attempt %d), still running "
                "in its thread (a thread cannot be interrupted; it ends when the handler "
                "returns, or with the process)",
                job.name,
                job.id,
                job.attempt,
                extra={"job_id": str(job.id), "job": job.name, "attempt": job.attempt},
            )
        for timer in (state.wake_at, self.exchange.flush_at):
            if timer is not None:
                timer.cancel()
        for one in state.runs.values():
            if one.timer is not None:
                one.timer.cancel()
        self.runner.executor.shutdown(wait=False, cancel_futures=True)
        await self.runner.shelf.close()  # every lent connection back to the pool
        await self.connections.close()
        state.phase = Phase.STOPPED

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(coro, name=f"axa-queue-{name}")


def _raise_failure(tasks: list[asyncio.Task[Any]]) -> None:
    """Raise what the first of `tasks` that failed raised, if any."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
