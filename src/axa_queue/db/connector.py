"""Connector: how this process reaches the database, in one place.

Every pool and connection of the queue (the async pool of `Queue`, the sync pool of
`SyncQueue`, the worker's own exchange and side connections, the listener, and so
the CLI's, which go through a `Queue`) is made here, with the same connect settings (`pooler.connect_kwargs`: prepared
statements, the schema's cursor) and, unless behind a transaction pooler, the same
session settings (`sql.SESSION_SETTINGS`).

It also carries the clocks tests may set: `clock`, `None` (the default) to let each
statement take the database's own time, or a datetime passed as the statements' `now`
parameter instead; and `monotonic`, the process's clock the worker times its claims
by (`time.monotonic`, or one a test moves on).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from typing_extensions import Self

from .. import sql
from ..context import running_or_none as _running
from ..errors import OptionsError
from ..handlers.retries import first_line, kind
from ..options import QueueOptions, dsn_from_environment
from . import dsns, pooler
from .lending import Lent

__all__ = [
    "RECONNECT_DELAYS",
    "TRANSIENT_REFUSALS",
    "Connected",
    "Connector",
    "QuickPool",
    "reconnect_delays",
    "refused",
]

log = logging.getLogger("axa_queue")

RECONNECT_DELAYS = (0.05, 0.5)
"""The pool's first wait between tries to connect again, and the longest: psycopg_pool's
own (1, 2, 4, 8 s ...) would leave handlers and housekeeping waiting for seconds after
the database is back."""


def reconnect_delays() -> Iterator[float]:
    """The waits between tries to connect again: `RECONNECT_DELAYS[0]`, doubling up to
    `RECONNECT_DELAYS[1]`, then that for as long as it takes."""
    delay, longest = RECONNECT_DELAYS
    while True:
        yield delay
        delay = min(delay * 2, longest)


class QuickPool(AsyncConnectionPool):
    """The queue's pool: reconnects within half a second of the database coming back;
    inside a worker's run of an async handler, `connection()` hands out the connection
    lent to the run, with no checkout (see `lending`).

    The quick reconnect is its connection class's (`connection_class`, psycopg_pool's
    public hook): its `connect` tries again after each failure to connect, waiting
    `reconnect_delays()`, while the pool is open and for up to `reconnect_timeout`, so
    psycopg_pool, which makes every connection through it, never sees those failures
    and never waits out its own backoff. Past `reconnect_timeout` the failure is
    psycopg_pool's, as before: it gives the connection up (after one more such round)
    and makes a new one when a client asks. Once the pool is closed, a failure ends
    the tries at once, so closing never waits for them."""

    def __init__(self, conninfo: str = "", **kwargs: Any) -> None:
        super().__init__(conninfo, connection_class=_reconnecting(self), **kwargs)
        self.handed: psycopg.AsyncConnection[Any] | None = None
        """A connection made for this pool before it opened (`open_with`), to be its
        first instead of a new one."""

    async def open_with(self, conn: psycopg.AsyncConnection[Any], timeout: float) -> None:
        """Open the pool (waiting for its first connection, `timeout` seconds at most)
        with `conn`, made by `connection_class` before, as that first connection in
        place of a new one: `Queue.open` checks the tables on one, and a new server
        process for the pool would cost another login and about 5 ms of CPU. The pool
        configures it as it configures every one it makes; `conn` is closed if the pool
        does not take it."""
        self.handed = conn
        try:
            await self.open(wait=True, timeout=timeout)
        finally:
            left, self.handed = self.handed, None
            if left is not None:
                await left.close()

    async def take_handed(self) -> psycopg.AsyncConnection[Any] | None:
        """The connection handed over, once, if it is still good (open, idle);
        closed, and None, if not."""
        conn, self.handed = self.handed, None
        if conn is None:
            return None
        if conn.closed or conn.broken or conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.close()
            return None
        return conn

    def connection(self, timeout: float | None = None) -> Any:
        job = _running()
        if job is not None:
            lender = job._lender
            if lender is not None and lender.lends_to(job._run, self):
                return Lent(lender, job._run, timeout)
        return super().connection(timeout)

    async def keep_connecting(
        self, connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]
    ) -> psycopg.AsyncConnection[Any]:
        """`connect()`, tried again after each `OperationalError` (the database
        unreachable, restarting, refusing connections) at `reconnect_delays()`, while
        the pool is open and for up to its `reconnect_timeout`; then the error is
        raised, for psycopg_pool to handle as its own."""
        delays = reconnect_delays()
        give_up_at = time.monotonic() + self.reconnect_timeout
        while True:
            try:
                return await connect()
            except psycopg.OperationalError:
                if self.closed or time.monotonic() >= give_up_at:
                    raise
            await asyncio.sleep(next(delays))


def _reconnecting(pool: QuickPool) -> type[psycopg.AsyncConnection[Any]]:
    """The connection class of `pool`: psycopg's, whose `connect` keeps trying
    (`QuickPool.keep_connecting`)."""

    class Reconnecting(psycopg.AsyncConnection[Any]):
        """A connection of a `QuickPool`, made with quick tries again."""

        @classmethod
        async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            made = await pool.take_handed()
            if made is None:
                made = await pool.keep_connecting(
                    lambda: super(Reconnecting, cls).connect(conninfo, **kwargs)
                )
            assert isinstance(made, cls)
            return made

    return Reconnecting


TRANSIENT_REFUSALS = (
    "starting up",
    "shutting down",
    "in recovery",
    "too many clients",
    "connection slots are reserved",
)
"""What a server that is there but not ready says when it refuses a connection."""


def refused(error: psycopg.OperationalError) -> bool:
    """Whether the server answered and refused this login for good (a wrong role,
    password or database name), so waiting for it would not help. psycopg gives no
    SQLSTATE for a failed connection: the server's answer is a `FATAL:` in its text."""
    text = str(error)
    return "FATAL:" in text and not any(word in text for word in TRANSIENT_REFUSALS)


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(sql.SESSION_SETTINGS)


def _configure_sync(conn: psycopg.Connection[Any]) -> None:
    conn.execute(sql.SESSION_SETTINGS)


class Connector:
    """The DSN, the options that say how to connect, and the clocks tests may set."""

    def __init__(self, options: QueueOptions, dsn: str | None = None) -> None:
        self.options = options
        self._dsn: str | None = None
        self.dsn = dsn
        self.clock: datetime | None = None
        """The time statements take as `now`; `None`: the database's own clock."""
        self.monotonic: Callable[[], float] = time.monotonic
        """The clock (seconds, monotonic) the worker times its claims by: when each run
        last proved its claim, when a connection broke or was made, so whether a run
        must prove its claim before it starts, gives up for want of contact, or stale
        recovery may run yet (`worker.connections.Connections.monotonic`). Tests put
        one they move on, to let that time pass without waiting or blocking the event
        loop; timers and time limits keep the event loop's own clock."""
        self.on_wait: Callable[[psycopg.OperationalError], None] | None = None
        """Called with the error at the first failed try to connect after which
        `Queue.open` keeps trying (`wait_for_database`): `axa-queue worker` says there and
        then, on a terminal, what it waits for and how to stop waiting."""

    @property
    def dsn(self) -> str | None:
        """The database, once given: as libpq reads it (`dsns.normalized`, so a
        SQLAlchemy `postgresql+asyncpg://` URL is read as `postgresql://`)."""
        return self._dsn

    @dsn.setter
    def dsn(self, dsn: str | None) -> None:
        self._dsn = dsns.normalized(dsn) if dsn else dsn

    def resolve(self, who: str = "Queue") -> str:
        """The DSN: given, else from the environment; remembered once found."""
        dsn = self.dsn or dsn_from_environment()
        if not dsn:
            where = f"{who}(...) or open(...)" if who == "Queue" else f"{who}(...)"
            raise OptionsError(
                f"no database given: pass a DSN to {where}, or set AXA_QUEUE_DSN (or DATABASE_URL)"
            )
        self.dsn = dsn
        return dsn

    def kwargs(self, *, sync: bool = False) -> dict[str, Any]:
        """Connection settings (see `pooler.connect_kwargs`)."""
        return pooler.connect_kwargs(self.options, sync=sync)

    def keeps_session_state(self) -> bool:
        """Whether connections may keep session settings (see `pooler`)."""
        return pooler.keeps_session_state(self.options)

    def listens(self) -> bool:
        """Whether workers should LISTEN (see `pooler.listens`)."""
        return pooler.listens(self.options)

    async def connect(
        self,
        *,
        session: bool = True,
        kind: type[psycopg.AsyncConnection[Any]] = psycopg.AsyncConnection,
        **extra: Any,
    ) -> psycopg.AsyncConnection[Any]:
        """One autocommit connection of the caller's own (of class `kind`), with the
        queue's settings and, unless behind a transaction pooler (or `session=False`),
        its session settings."""
        conn = await kind.connect(self.dsn or "", autocommit=True, **self.kwargs(), **extra)
        if session and self.keeps_session_state():
            await conn.execute(sql.SESSION_SETTINGS)
        return conn

    async def first_connection(self, pool: QuickPool) -> psycopg.AsyncConnection[Any]:
        """The DSN resolved, and one connection to it with no session settings (what
        `Queue.open` checks the tables on, then hands over to `pool`, not yet open, as
        its first: made by its connection class): tried again with backoff while the
        database cannot be reached, for up to `wait_for_database` (a worker started
        during an outage or a restart); a login refused for good is raised at once."""
        self.resolve()
        waited = time.monotonic()
        deadline = waited + self.options.wait_for_database.total_seconds()
        pause = 0.25
        first = True
        while True:
            try:
                return await self.connect(session=False, kind=pool.connection_class)
            except psycopg.OperationalError as error:
                left = deadline - time.monotonic()
                if left <= 0 or refused(error):
                    raise
                if first and self.on_wait is not None:
                    self.on_wait(error)
                first = False
                log.warning(
                    "cannot reach the database (%s); trying again in %g s",
                    kind(error),
                    round(min(pause, left), 2),
                    extra={
                        "error": first_line(error),
                        "retry_in": round(min(pause, left), 2),
                        "waited": round(time.monotonic() - waited, 1),
                    },
                )
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, 5.0)

    def connect_sync(self) -> psycopg.Connection[Any]:
        """One sync autocommit connection of the caller's own, with the queue's connect
        settings and no session settings (`SyncQueue.wait` listens on it)."""
        return psycopg.Connection.connect(
            self.resolve("SyncQueue"), autocommit=True, **self.kwargs(sync=True)
        )

    def pool(self, name: str = "axa-queue") -> QuickPool:
        """The async pool (not yet open) of `Queue`: autocommit connections, to the
        DSN resolved (given, else the environment's)."""
        return QuickPool(
            self.resolve(),
            min_size=1,
            max_size=self.options.connections,
            kwargs={"autocommit": True, **self.kwargs()},
            configure=_configure if self.keeps_session_state() else None,
            open=False,
            name=name,
        )

    def sync_pool(self, name: str = "axa-queue-sync") -> ConnectionPool:
        """The sync pool (not yet open) of `SyncQueue`, with the same settings."""
        return ConnectionPool(
            self.dsn or "",
            min_size=1,
            max_size=self.options.connections,
            kwargs={"autocommit": True, **self.kwargs(sync=True)},
            configure=_configure_sync if self.keeps_session_state() else None,
            open=False,
            name=name,
        )


class Connected:
    """What `Queue` and `SyncQueue` share: a `Connector`, and its DSN and options read
    and given through the handle (before it opens)."""

    connector: Connector

    @property
    def dsn(self) -> str | None:
        """The database, once given (see `Connector`)."""
        return self.connector.dsn

    @dsn.setter
    def dsn(self, dsn: str | None) -> None:
        """Give the database (before `open`)."""
        self.connector.dsn = dsn

    @property
    def options(self) -> QueueOptions:
        """The options (see `QueueOptions`)."""
        return self.connector.options

    @options.setter
    def options(self, options: QueueOptions) -> None:
        """Replace the options (before `open`)."""
        self.connector.options = options
