"""The worker's own connections: the exchange loop's, and the side one.

The exchange loop sends one statement at a time on a connection of its own, so no pool
checkout lies on the path from a wake-up to a claim. Heartbeats, claim proofs, lost
runs and stale recovery share the side connection, made again at once when it breaks
(a pool would wait out its reconnect backoff). Both come from the `Connector`, with
the queue's connect and session settings.

A statement on the side connection that has no answer within half of `stale_after` (a
connection cut without a word: a network partition leaves TCP waiting for hours) is
given up and its connection dropped, as if it broke: the heartbeat then counts the
silence, and a run that cannot report in for `stale_after` stops before a peer's
recovery could take its job.

When each connection broke or was made is read on `monotonic()`, the clock the worker
times its claims by (the `Connector`'s: a test may move it on).
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any
from uuid import uuid4

import psycopg
from psycopg.rows import namedtuple_row

from .. import sql
from ..db.connector import Connector

__all__ = ["Connections"]


class Connections:
    """The exchange and side connections, and when one of them last broke."""

    def __init__(self, connector: Connector, stale: float) -> None:
        self.connector = connector
        self.stale = stale
        self.exchange: psycopg.AsyncConnection[Any] | None = None
        """The exchange loop's connection, made on first use."""
        self.side: psycopg.AsyncConnection[Any] | None = None
        """Heartbeats, claim proofs, lost runs and stale recovery."""
        self.connected_since: float | None = None
        """When (`monotonic()`) `side` was last connected; stale recovery waits
        `stale_after`."""
        self.present = False
        """Whether the side connection holds this process's presence lock
        (`sql.PRESENCE_HOLD`): taken as it connects, tried again at each presence
        write until it is (`hold_presence`)."""
        self.broken_at = -1.0
        """When (`monotonic()`) a connection of this worker last broke: runs heard of
        before must prove their claim before their handler starts."""
        self.identity: dict[str, Any] = {
            "worker": uuid4(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        """Who this process is, as the statements that claim and end runs record it in
        `axa_queue_attempts` (`worker`: its id in `axa_workers`, `Presence`'s row)."""

    def monotonic(self) -> float:
        """The clock the worker times its claims by (`Connector.monotonic`): when each
        run last proved its claim, when a connection broke or was made."""
        return self.connector.monotonic()

    def now(self) -> Any:
        """The `now` parameter of the worker's statements: the test clock, else None
        (the database's own clock)."""
        return self.connector.clock

    async def for_exchange(self) -> psycopg.AsyncConnection[Any]:
        """The exchange loop's connection, made on first use and after it broke, which
        plans its claims without sorts (`sql.CLAIM_SETTINGS`) and waits at most
        `sql.EXCHANGE_ROW_WAIT` for a lock, where it may keep a session setting."""
        if self.exchange is None or self.exchange.closed:
            conn = await self.connector.connect()
            if self.connector.keeps_session_state():
                await conn.execute(sql.CLAIM_SETTINGS)
                await conn.execute(sql.EXCHANGE_ROW_WAIT)
            self.exchange = conn
        return self.exchange

    async def exchange_broke(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The exchange's connection broke: the next exchange connects again."""
        self.exchange = None
        self.broken_at = self.monotonic()
        await conn.close()

    async def for_side(self) -> psycopg.AsyncConnection[Any]:
        """The side connection, made again at once when it broke."""
        if self.side is None or self.side.closed:
            # A server that does not answer must not hold heartbeats (and so the
            # runs' giving up) for the system's TCP timeout.
            self.side = await self.connector.connect(
                connect_timeout=max(2, int(self.answer_within()))
            )
            self.connected_since = self.monotonic()
            self.present = False
            await self.hold_presence()
        return self.side

    async def hold_presence(self) -> bool:
        """Take this process's presence lock on the side connection, if it does not hold
        it yet (`sql.PRESENCE_HOLD`): while that session lives, no other process gives
        back the runs this one claimed ahead, however long its event loop is blocked
        (`sql.GIVE_BACK_GONE`). Never behind a transaction pooler, where a session lock
        would stay on a shared server connection; there, silence alone decides, as in a
        process that cannot take it. Whether it holds it; a failure is the next
        statement's to see."""
        conn = self.side
        if self.present or conn is None or not self.connector.keeps_session_state():
            return self.present
        cursor = conn.cursor(row_factory=namedtuple_row)
        try:
            await asyncio.wait_for(
                cursor.execute(sql.PRESENCE_HOLD, {"worker": self.identity["worker"]}),
                self.answer_within(),
            )
            row: Any = await cursor.fetchone()
        except (psycopg.Error, asyncio.TimeoutError):
            return False
        self.present = row is not None and bool(row.held)
        return self.present

    async def side_broke(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.broken_at = self.monotonic()
        if self.side is conn:
            self.side, self.connected_since, self.present = None, None, False
        await conn.close()

    async def on_side(self, statement: str, params: Any) -> list[Any]:
        """Run one statement on the side connection and return its rows, read by name;
        a broken connection is dropped (the next statement connects again) and noted."""
        try:
            conn = await self.for_side()
        except psycopg.OperationalError:
            self.broken_at = self.monotonic()
            raise

        async def send() -> list[Any]:
            cursor = conn.cursor(row_factory=namedtuple_row)
            await cursor.execute(statement, params)
            return await cursor.fetchall() if cursor.description is not None else []

        try:
            return await asyncio.wait_for(send(), self.answer_within())
        except asyncio.TimeoutError:
            await self.side_broke(conn)
            raise psycopg.OperationalError(
                f"the database did not answer within {self.answer_within():g} s"
            ) from None
        except psycopg.OperationalError:
            await self.side_broke(conn)
            raise

    def answer_within(self) -> float:
        """Seconds a statement on the side connection may wait for its answer (also
        for a lock): half of `stale_after`, at least one."""
        return max(1.0, self.stale / 2)

    async def close(self) -> None:
        for conn in (self.exchange, self.side):
            if conn is not None:
                await conn.close()
