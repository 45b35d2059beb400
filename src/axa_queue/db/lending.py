"""Connections of the queue's pool lent to the worker's loops (`Lending`, `Lender`).

A checkout of psycopg_pool costs about 30 µs: as much as the rest of a short job's run.
So a worker lends each of its loops, while it runs async handlers, a connection it
keeps checked out of the queue's pool: inside a run, `queue.pool.connection()` hands
out that connection, with no checkout, and takes it back when the block ends. What a
handler sees is what the pool gives: an autocommit connection of the queue's pool,
whose block commits on success and rolls back on an error.

A lent connection comes back clean or not at all: when the block ends it is brought
back to idle as the pool would (psycopg's commit on success, rollback on an error);
a connection still not idle after that (a statement cut by a cancellation, a broken
or closed connection) goes back to the pool, which closes it or rolls it back, and
the next block checks out another. It is lent to one run at a time: a block opened
while it is out (nested, or in a task the handler started), or by a task that outlives
its run, gets a connection of the pool as before. Sync handlers (run in threads) are
lent nothing: the pool and its connections belong to the worker's event loop.

The worker lends at most the pool's size less `LEND_SPARE` connections at once, so
its housekeeping, the application's enqueues and the handlers' other blocks always
have connections to check out (with the default `pool_size`, `workers + 4`, every
loop may be lent one); a loop over that number checks out as before. It takes a
connection lazily (a handler that never asks costs nothing) and gives it back to the
pool once no loop has used it for `LEND_IDLE` (see `worker.runs.Runner`), so an idle
worker holds none.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

__all__ = ["LEND_IDLE", "LEND_SPARE", "Lender", "Lending", "Lent"]

LEND_IDLE = 1.0
"""Seconds a lent connection may stay with the worker unused by any loop before it goes
back to the pool (a timer checks, so it goes back within one to two such periods)."""

LEND_SPARE = 4
"""Connections of the pool never lent: what the rest of the process always has."""

_IDLE = TransactionStatus.IDLE
_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class Lending:
    """What one worker lends: connections of `pool`, at most `most` out at once."""

    __slots__ = ("most", "out", "pool")

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool
        self.most = max(pool.max_size - LEND_SPARE, 0)
        """How many connections may be lent at once."""
        self.out = 0
        """How many are lent now (or being checked out to be)."""


class Lender:
    """What one of the worker's loops may lend: a connection of the pool (taken on first
    use), to the run it is running (`run`), one block at a time."""

    __slots__ = ("busy", "conn", "lending", "pool", "run")

    def __init__(self, lending: Lending) -> None:
        self.lending = lending
        self.pool = lending.pool
        self.conn: psycopg.AsyncConnection[Any] | None = None
        """The connection lent, once a run asked for one."""
        self.run: object | None = None
        """The run it lends to now (the worker's `Run`), `None` between runs."""
        self.busy = False
        """Whether a block holds the connection now."""

    def lends_to(self, run: object, pool: object) -> bool:
        """Whether a block of `run` asking `pool` for a connection gets this one."""
        return (
            run is self.run
            and pool is self.pool
            and not self.busy
            and (self.conn is not None or self.lending.out < self.lending.most)
        )

    async def take(self, timeout: float | None) -> psycopg.AsyncConnection[Any]:
        """The connection to lend, checked out if the loop has none (or a broken one)."""
        conn = self.conn
        if conn is not None and not conn.closed:
            return conn
        if conn is not None:  # closed while it waited: the pool replaces it
            await self.drop(conn)
        self.lending.out += 1
        try:
            taken: psycopg.AsyncConnection[Any] = await self.pool.getconn(timeout)
        except BaseException:
            self.lending.out -= 1
            raise
        self.conn = taken
        return taken

    async def drop(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Give `conn` back to the pool (which rolls it back, or closes and replaces it)."""
        if self.conn is conn:
            self.conn = None
            self.lending.out -= 1
        await self.pool.putconn(conn)

    async def give_back(self) -> None:
        """Give the connection back to the pool (unless a block holds it: that block
        gives it back when it ends, as its run is over)."""
        conn, self.run = self.conn, None
        if conn is not None and not self.busy:
            await self.drop(conn)


class Lent:
    """The context manager `queue.pool.connection()` returns inside a run that is lent
    a connection: cheaper than psycopg_pool's own (no checkout)."""

    __slots__ = ("conn", "lender", "run", "timeout")

    def __init__(self, lender: Lender, run: object, timeout: float | None) -> None:
        self.lender = lender
        self.run = run
        self.timeout = timeout
        self.conn: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        lender = self.lender
        lender.busy = True  # before any await: no other block of the run takes it meanwhile
        conn = lender.conn
        if conn is not None and not conn.closed:  # the usual case: no coroutine more
            self.conn = conn
            return conn
        try:
            self.conn = await lender.take(self.timeout)
        except BaseException:
            lender.busy = False
            raise
        return self.conn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lender, conn = self.lender, self.conn
        assert conn is not None
        try:
            if conn.pgconn.transaction_status in _OPEN:
                # As the pool's own block ends: commit on success, roll back on an error.
                await conn.__aexit__(exc_type, exc, tb)
        finally:
            lender.busy = False
            if (
                conn.pgconn.transaction_status != _IDLE
                or conn.closed
                or lender.run is not self.run
                or lender.conn is not conn
            ):
                # Not clean (the pool rolls it back or closes it, and replaces it), or
                # its run is over: back to the pool; the next block checks out another.
                await lender.drop(conn)
