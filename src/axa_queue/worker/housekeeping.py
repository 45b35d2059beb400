"""Housekeeping: the maintenance loop (`maintenance.run_once` every
`maintenance_interval`), the worker's own stale recovery, the moves of finished jobs
to the history (`maintenance.move_history` every `history.move_interval`), and a warning
in the log for each job name whose jobs wait with no live worker process to handle them.

Stale recovery runs on the side connection, only once it has been connected for
`stale_after` (every live worker has had that long to report in since the database
came back), and never takes back a run this process holds.

The runs a gone process (silent for three heartbeat intervals) claimed ahead and never
started are given back every heartbeat interval (`maintenance.give_back_gone`), on the
side connection too, once it has been connected for three of this process's intervals
and a second (`sql.GIVE_BACK_GRACE_MS`); never this process's own runs.

The warning about a name nobody handles (`presence.unhandled_steps`: jobs due for
longer than `unhandled_after`, no live process with a handler for it) is logged once
per name by each process, and again only after the name was handled, or had no such
jobs, for a round.
"""

from __future__ import annotations

import asyncio
import logging
import random

import psycopg
from psycopg_pool import AsyncConnectionPool

from .. import history, maintenance, sql
from ..db.calls import run_async
from ..handlers.registry import Registry
from ..handlers.retries import first_line, kind
from ..options import QueueOptions
from ..presence import GONE_AFTER_BEATS, unhandled_steps
from . import decisions
from .claims import heartbeat_every
from .connections import Connections
from .state import State
from .tasks import Troubles, beat_retry, cancel_all, lasting, pause, summary

__all__ = ["Housekeeping"]

log = logging.getLogger("axa_queue.worker")

FIRST_ROUND_SPREAD = 30.0
"""The longest wait, in seconds, before a worker's first round of maintenance and its
first move to the history: each waits a random part of its interval, at most this, so
that the processes one deploy starts spread theirs, and a process that starts on a
backlog spends its first moments on jobs. (Stale recovery waits for `stale_after`
anyway; the give-backs for three heartbeat intervals.)"""


def first_wait(every: float, draw: float) -> float:
    """The wait before the first of rounds `every` seconds apart: the part `draw` (from
    0 to 1) of the interval, at most `FIRST_ROUND_SPREAD`."""
    return min(every, FIRST_ROUND_SPREAD) * draw


class Housekeeping:
    """Housekeeping rounds, and stale recovery that spares this process's runs."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        registry: Registry,
        options: QueueOptions,
        state: State,
        connections: Connections,
        troubles: Troubles,
    ) -> None:
        self.pool = pool
        self.registry = registry
        self.options = options
        self.state = state
        self.connections = connections
        self.troubles = troubles
        self.stale = options.stale_after.total_seconds()
        self.attempts = registry.attempt_limits(options.max_attempts)
        """What stale recovery counts attempts against (`limits.AttemptLimits`)."""
        self.warned: set[str] = set()
        """The job names this process has warned about, no live worker handling them."""

    async def loop(self) -> None:
        """The rounds, the moves and (`QueueOptions.give_back_gone`) the give-backs, side
        by side, until cancelled. Each is a task of its own, and this returns (or
        raises) only once every one has ended (`cancel_all`): cancelled, a loop in the
        middle of a transaction (a partition made or dropped) ends it and gives its
        connection back before the worker's stop goes on to close the pool. (A plain
        `gather` ended at the first loop's cancellation and left the others running,
        holding their connections and locks after `close()` returned.)"""
        loop = asyncio.get_running_loop()
        loops = [
            loop.create_task(self.rounds(), name="axa-queue-rounds"),
            loop.create_task(self.moves(), name="axa-queue-moves"),
        ]
        if self.options.give_back_gone:
            loops.append(loop.create_task(self.give_backs(), name="axa-queue-give-backs"))
        try:
            await asyncio.gather(*loops)
        finally:
            await cancel_all(loops)

    async def give_backs(self) -> None:
        """Every heartbeat interval, give back the runs gone processes claimed ahead and
        never started (`give_back_gone`); a failure is counted in the health check,
        logged (`Streak`) and tried again sooner (`beat_retry`), so the health
        check says ok within seconds of the database coming back."""
        every = heartbeat_every(self.options)
        retry: float | None = None  # the last wait after a failure
        while True:
            await asyncio.sleep(every if retry is None else retry)
            failure: BaseException | None
            try:
                failure = await self.give_back_gone(every)
            except Exception as error:  # a bug: logged, and the loop goes on
                failure = error
                log.error("giving back the jobs of gone worker processes failed (%s)", kind(error))
            if failure is None:
                retry = None
                lasted = self.troubles.cleared("give back")
                if lasted is not None:
                    log.info(
                        "giving back the jobs of gone worker processes again, after %.1f s", lasted
                    )
                continue
            retry = beat_retry(retry, every)
            lasted = self.troubles.failed("give back", failure)
            if lasted is not None and isinstance(failure, psycopg.Error):
                log.warning(  # a consequence of the outage the other lines say
                    "could not give back the jobs of gone worker processes (%s%s)",
                    kind(failure),
                    lasting(lasted),
                    extra={"error": first_line(failure)},
                )

    async def give_back_gone(self, beat: float) -> psycopg.Error | None:
        """Give back the runs of gone processes claimed ahead and never started, on the
        side connection, once it has been connected for `GONE_AFTER_BEATS` heartbeat
        intervals (`beat`, this process's) and `sql.GIVE_BACK_GRACE_MS`: every live process
        has reported in since the database came back. Returns the error that stopped it,
        if any (the caller logs it)."""
        connections = self.connections
        try:
            conn = await connections.for_side()
        except psycopg.Error as error:
            connections.broken_at = connections.monotonic()
            return error
        since = connections.connected_since
        wait = GONE_AFTER_BEATS * beat + sql.GIVE_BACK_GRACE_MS / 1000
        if since is None or connections.monotonic() - since < wait:
            return None
        try:
            given = await maintenance.give_back_gone(
                conn,
                beat,
                self.attempts,
                connections.identity["worker"],
                now=connections.now(),
            )
        except psycopg.Error as error:
            if isinstance(error, psycopg.OperationalError):
                await connections.side_broke(conn)
            return error
        maintenance.log_given_back(given)
        return None

    async def moves(self) -> None:
        """Move finished jobs to the history every `history.move_interval` (the first
        after `first_wait`): often, in small batches, so the hot table stays small. A
        failure is logged and counted in the health check until a move goes through,
        tried again sooner (from `poll_interval` on, backing off)."""
        every = history.move_interval(self.options)
        retry = self.options.poll_interval.total_seconds()
        await asyncio.sleep(first_wait(every, random.random()))
        while True:
            try:
                failure: BaseException | None = await maintenance.move_history(
                    self.pool, self.options
                )
            except Exception as error:  # a bug, or anything the database driver raised
                failure = error
                log.error("moving finished jobs failed (%s)", kind(error))
            if failure is None:
                lasted = self.troubles.cleared("history")
                if lasted is not None:
                    log.info("moving finished jobs to the history again, after %.1f s", lasted)
                retry = self.options.poll_interval.total_seconds()
                await asyncio.sleep(every)
            else:
                self.troubles.failed("history", failure)
                await pause(min(retry, every), self.state.back)  # sooner once it is back
                retry = decisions.next_retry(retry)

    async def rounds(self) -> None:
        """A round of maintenance every `maintenance_interval` (sooner after a failure),
        the first after `first_wait`."""
        every = self.options.maintenance_interval.total_seconds()
        retry = self.options.poll_interval.total_seconds()
        await asyncio.sleep(first_wait(every, random.random()))
        while True:
            failure: BaseException | None
            try:
                failure = await maintenance.run_once(
                    self.pool, self.options, self.registry.schedules
                )
                failure = await self.recover_stale() or failure
                failure = await self.warn_unhandled() or failure
            except Exception as error:  # a bug, or anything the database driver raised
                failure = error
                log.error(
                    "housekeeping failed (%s); trying again in %g s",
                    kind(error),
                    retry,
                    extra={"error": summary(error), "retry_in": retry},
                )
            if failure is None:
                lasted = self.troubles.cleared("maintenance")
                if lasted is not None:
                    log.info("housekeeping goes through again, after %.1f s", lasted)
                retry = self.options.poll_interval.total_seconds()
                await asyncio.sleep(every)
            else:
                self.troubles.failed("maintenance", failure)
                await pause(min(retry, every), self.state.back)  # sooner once it is back
                retry = decisions.next_retry(retry)

    async def recover_stale(self) -> psycopg.Error | None:
        """Stale recovery, on the side connection, once it has been connected for
        `stale_after`, never taking back a run this process holds. Returns the error
        that stopped it, if any (for the health check)."""
        connections = self.connections
        try:
            conn = await connections.for_side()
        except psycopg.Error as error:
            connections.broken_at = connections.monotonic()
            log.error(
                "could not recover stale jobs (%s)", kind(error), extra={"error": first_line(error)}
            )
            return error
        since = connections.connected_since
        if since is None or connections.monotonic() - since < self.stale:
            return None
        try:
            recovered = await maintenance.recover_stale(
                conn, self.stale, self.attempts, held=self.state.held_literals()
            )
        except psycopg.Error as error:
            if isinstance(error, psycopg.OperationalError):
                await connections.side_broke(conn)
            log.error(
                "could not recover stale jobs (%s)", kind(error), extra={"error": first_line(error)}
            )
            return error
        maintenance.log_recovered(recovered)
        return None

    async def warn_unhandled(self) -> psycopg.Error | None:
        """Log a warning for each job name whose jobs have been due for longer than
        `unhandled_after` with no live worker process handling it, once per name until
        it is handled again. Returns the error that stopped it, if any."""
        try:
            async with self.pool.connection() as conn:
                _, found = await run_async(
                    conn,
                    unhandled_steps(
                        self.stale,
                        self.options.unhandled_after.total_seconds(),
                        self.registry.handlers,  # its own names, its row written or not
                    ),
                )
        except psycopg.Error as error:
            log.error(
                "could not look for job names no worker handles (%s)",
                kind(error),
                extra={"error": first_line(error)},
            )
            return error
        for one in found:
            if one.name not in self.warned:
                log.warning(
                    "jobs of %r wait with no live worker handling that name (%d due for "
                    "longer than %g s, the oldest %.0f s): start a worker with a handler "
                    "for it, or cancel them if the name is a mistake",
                    one.name,
                    one.jobs,
                    self.options.unhandled_after.total_seconds(),
                    one.oldest,
                    extra={"job": one.name, "jobs": one.jobs, "oldest_seconds": one.oldest},
                )
        self.warned = {one.name for one in found}
        return None
