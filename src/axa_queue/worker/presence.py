"""Presence: this worker process's row in `axa_workers`.

Made when the worker starts and refreshed once per `heartbeat_interval` with its jobs in
progress (`sql.WORKER_SEEN`: one primary-key upsert on the side connection, whatever the
number of jobs) and the interval itself (readers call a process silent for three of them
gone), deleted when the worker stops cleanly (`sql.WORKER_GONE`). It only
informs people (the `workers` command, the dashboard): a failure is logged (at once,
then every `SAID_EVERY`, and once when a write goes through again), tried again within
seconds (`beat_retry`), and never stops a job.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata

import psycopg

from .. import sql
from ..handlers.registry import Registry
from ..handlers.retries import first_line, kind
from ..options import QueueOptions
from .claims import heartbeat_every
from .connections import Connections
from .state import State
from .tasks import Streak, beat_retry, lasting

__all__ = ["Presence"]

log = logging.getLogger("axa_queue.worker")


def _version() -> str:
    try:
        return metadata.version("axa-queue")
    except metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class Presence:
    """Keeps this process's row in `axa_workers` while it works."""

    def __init__(
        self,
        state: State,
        connections: Connections,
        registry: Registry,
        options: QueueOptions,
    ) -> None:
        self.state = state
        self.connections = connections
        self.registry = registry
        self.options = options
        self.id = connections.identity["worker"]
        """Its id in `axa_workers`: the one its runs' attempts name."""
        self.writes_failing = Streak()
        """The writes failing in a row, for the log: the first said at once, then one
        every `SAID_EVERY`, and the first that goes through again."""

    def _params(self) -> dict[str, object]:
        return {
            "id": self.id,
            "host": self.connections.identity["host"],
            "pid": self.connections.identity["pid"],
            "names": sorted(self.registry.handlers),
            "loops": self.options.workers,
            "running": self.state.active,
            "version": _version(),
            "beat_ms": max(1, round(self.every() * 1000)),
            "now": self.connections.now(),
        }

    async def seen(self) -> bool:
        """Write the row now; whether it went through."""
        try:
            await self.connections.on_side(sql.WORKER_SEEN, self._params())
            await self.connections.hold_presence()  # when it could not be taken before
        except psycopg.Error as error:
            lasted = self.writes_failing.failed()
            if lasted is not None:
                log.warning(
                    "could not record this worker process in axa_workers (%s%s); trying again",
                    kind(error),
                    lasting(lasted),
                    extra={"error": first_line(error)},
                )
            return False
        lasted = self.writes_failing.ended()
        if lasted is not None:
            log.info("recorded this worker process in axa_workers again, after %.1f s", lasted)
        return True

    def every(self) -> float:
        """Seconds between writes: the heartbeat interval, recorded with the row so
        readers know when this process has missed too many."""
        return heartbeat_every(self.options)

    async def loop(self) -> None:
        """Make the row at once, then refresh it every heartbeat interval; after a failed
        write, sooner (`beat_retry`), so that once the database is back the
        process is shown live again within seconds, not an interval later."""
        every = self.every()
        retry: float | None = None  # the last wait after a failure
        while True:
            retry = None if await self.seen() else beat_retry(retry, every)
            await asyncio.sleep(every if retry is None else retry)

    async def gone(self) -> None:
        """Delete the row (a clean stop); a failure leaves it to housekeeping."""
        try:
            await self.connections.on_side(sql.WORKER_GONE, {"id": self.id})
        except psycopg.Error as error:
            log.info(
                "could not remove this worker process from axa_workers (%s); housekeeping will",
                kind(error),
                extra={"error": first_line(error)},
            )
