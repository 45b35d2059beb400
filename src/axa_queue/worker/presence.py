"""Presence: this worker process's row in `axa_workers`, written from a thread.

Made when the worker starts and refreshed once per `heartbeat_interval` with its jobs in
progress and the interval itself (readers call a process silent for three of them
gone), deleted when the worker stops cleanly (`sql.WORKER_GONE`). The same statement
(`sql.WORKER_BEAT`: one primary-key upsert, whatever the number of jobs) marks started
the runs claimed ahead whose handler started and whose mark no exchange has been seen to
write yet (`State.unmarked`).

It is written from a thread of its own, on a connection of its own, so a handler that
blocks the event loop does not silence it: a live process is never taken as gone for
that (its runs claimed ahead are given back only when it is: `sql.GIVE_BACK_GONE`), and,
its start marks riding with its row, a process heard from has its starts marked. The
event loop's heartbeats still stamp the runs themselves (`worker.claims`): a blocked
loop's started runs go stale after `stale_after`, as before.

A write that fails is logged once (and once when one goes through again), and tried
again at the next interval, on a new connection if the old one broke. `heard` says
when the last write that went through was sent, on the worker's monotonic clock: a run
claimed ahead starts at once only while it is recent (`Claims.doubtful`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from importlib import metadata
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .. import sql
from ..handlers.registry import Registry
from ..handlers.retries import first_line, kind
from ..options import QueueOptions
from .claims import MIN_HEARTBEAT
from .connections import Connections
from .run import Run
from .state import State

__all__ = ["Presence"]

log = logging.getLogger("axa_queue.worker")


def _version() -> str:
    try:
        return metadata.version("axa-queue")
    except metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


class Presence:
    """Keeps this process's row in `axa_workers` while it works, from a thread."""

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
        self.failing = False
        """Whether the last write failed (logged once, until one goes through)."""
        self.heard = float("-inf")
        """When (`Connections.monotonic()`) the last write that went through was sent."""
        self.stop = threading.Event()
        """Set to end the thread (before the row is removed at a clean stop)."""
        self.thread: threading.Thread | None = None
        self.conn: psycopg.Connection[Any] | None = None
        """The thread's own connection, made again when it broke."""

    def _params(self, runs: list[Run]) -> dict[str, object]:
        return {
            "id": self.id,
            "host": self.connections.identity["host"],
            "pid": self.connections.identity["pid"],
            "names": sorted(self.registry.handlers),
            "loops": self.options.workers,
            "running": self.state.active,
            "version": _version(),
            "beat_ms": max(1, round(self.every() * 1000)),
            "starts": "{" + ",".join(r.id for r in runs) + "}",
            "started_attempts": "{" + ",".join(str(r.attempts) for r in runs) + "}",
            "now": self.connections.now(),
        }

    def every(self) -> float:
        """Seconds between writes: the heartbeat interval, recorded with the row so
        readers know when this process has missed too many."""
        return max(self.options.heartbeat_interval.total_seconds(), MIN_HEARTBEAT)

    def _connect(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed:
            connector = self.connections.connector
            self.conn = psycopg.Connection.connect(
                connector.dsn or "",
                autocommit=True,
                connect_timeout=max(2, int(self.connections.answer_within())),
                **connector.kwargs(sync=True),
            )
        return self.conn

    def seen(self) -> bool:
        """Write the row now, with the start marks due (in the thread); whether it went
        through. The marks written, or found needing none, leave `State.unmarked`."""
        runs = list(self.state.unmarked.copy().values())
        sent = self.connections.monotonic()
        try:
            cursor = self._connect().cursor(row_factory=dict_row)
            cursor.execute(sql.WORKER_BEAT, self._params(runs))
            busy = {row["id"] for row in cursor.fetchall() if not row["marked"]}
        except psycopg.Error as error:
            if isinstance(error, psycopg.OperationalError) and self.conn is not None:
                self.conn.close()
            if not self.failing:
                log.warning(
                    "could not record this worker process in axa_workers (%s); trying again",
                    kind(error),
                    extra={"error": first_line(error)},
                )
            self.failing = True
            return False
        self.heard = sent
        if self.failing:
            log.info("this worker process is recorded in axa_workers again")
        self.failing = False
        for one in runs:
            if one.id not in busy:  # held by another statement: sent again next time
                self.state.unmarked.pop(one.key, None)
        return True

    def _beats(self) -> None:
        """The thread: write the row at once, then every heartbeat interval, until
        `stop` is set."""
        try:
            while True:
                try:
                    self.seen()
                except Exception as error:  # a bug: logged, and the thread goes on
                    log.error("recording this worker process failed (%s)", kind(error))
                if self.stop.wait(self.every()):
                    return
        finally:
            if self.conn is not None:
                self.conn.close()

    async def loop(self) -> None:
        """Start the thread, and wait until cancelled (then the thread ends)."""
        self.thread = threading.Thread(target=self._beats, name="axa-queue-presence", daemon=True)
        self.thread.start()
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self.stop.set()

    async def ended(self, within: float | None) -> None:
        """End the thread, waiting up to `within` seconds for its last write."""
        self.stop.set()
        if self.thread is not None:
            await asyncio.to_thread(self.thread.join, within)

    async def gone(self) -> None:
        """End the thread, then delete the row (a clean stop); a failure leaves it to
        housekeeping."""
        await self.ended(self.connections.answer_within())
        try:
            await self.connections.on_side(sql.WORKER_GONE, {"id": self.id})
        except psycopg.Error as error:
            log.info(
                "could not remove this worker process from axa_workers (%s); housekeeping will",
                kind(error),
                extra={"error": first_line(error)},
            )
