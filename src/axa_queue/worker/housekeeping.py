"""Housekeeping: the maintenance loop (`maintenance.run_once` every
`maintenance_interval`), the worker's own stale recovery, and the moves of finished
jobs to the history (`maintenance.move_history` every `history.move_interval`).

Stale recovery runs on the side connection, only once it has been connected for
`stale_after` (every live worker has had that long to report in since the database
came back), and never takes back a run this process holds.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg
from psycopg_pool import AsyncConnectionPool

from .. import history, maintenance
from ..handlers.registry import Registry
from ..handlers.retries import first_line, kind
from ..options import QueueOptions
from . import decisions
from .connections import Connections
from .state import State
from .tasks import Troubles, summary

__all__ = ["Housekeeping"]

log = logging.getLogger("axa_queue.worker")


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

    async def loop(self) -> None:
        """The rounds and the moves, side by side, until cancelled."""
        await asyncio.gather(self.rounds(), self.moves())

    async def moves(self) -> None:
        """Move finished jobs to the history every `history.move_interval`: often, in
        small batches, so the hot table stays small. A failure is logged and counted in
        the health check until a move goes through, tried again sooner (from
        `poll_interval` on, backing off)."""
        every = history.move_interval(self.options)
        retry = self.options.poll_interval.total_seconds()
        while True:
            try:
                failure: BaseException | None = await maintenance.move_history(
                    self.pool, self.options
                )
            except Exception as error:  # a bug, or anything the database driver raised
                failure = error
                log.error("moving finished jobs failed (%s)", kind(error))
            if failure is None:
                self.troubles.cleared("history")
                retry = self.options.poll_interval.total_seconds()
                await asyncio.sleep(every)
            else:
                self.troubles.failed("history", failure)
                await asyncio.sleep(min(retry, every))
                retry = decisions.next_retry(retry)

    async def rounds(self) -> None:
        """A round of maintenance every `maintenance_interval` (sooner after a failure)."""
        every = self.options.maintenance_interval.total_seconds()
        retry = self.options.poll_interval.total_seconds()
        while True:
            failure: BaseException | None
            try:
                failure = await maintenance.run_once(
                    self.pool, self.options, self.registry.schedules
                )
                failure = await self.recover_stale() or failure
            except Exception as error:  # a bug, or anything the database driver raised
                failure = error
                log.error(
                    "housekeeping failed (%s); trying again in %g s",
                    kind(error),
                    retry,
                    extra={"error": summary(error), "retry_in": retry},
                )
            if failure is None:
                self.troubles.cleared("maintenance")
                retry = self.options.poll_interval.total_seconds()
                await asyncio.sleep(every)
            else:
                self.troubles.failed("maintenance", failure)
                await asyncio.sleep(min(retry, every))
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
