"""Calls: one statement with its parameters and how to read its rows, run on a sync
or an async psycopg connection, written once.

Each operation callers can do on their own connection (enqueue, acts, job info,
counts) is a `Call`: the SQL, its parameters, and how to read the rows back. An
operation of several statements (a unique enqueue sent again after a race) is `Steps`:
a generator that yields each `Call` and is sent back what it read, so its loop is
written once, with no waiting in it, as psycopg splits its protocol from its waiting.
Either is `Work`.

`run_sync` and `run_async` do a piece of work on a psycopg connection: `drive` and
`drive_async` send each step's call as it comes; `adapters.run` does it on whichever
kind of connection a caller gives (Django's, SQLAlchemy's and asyncpg's too) and
returns the value, or an awaitable of it for an async one. The operations are defined
once; only these few lines of waiting differ between sync and async.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, Union, cast

import psycopg
from psycopg.pq import PipelineStatus
from psycopg.rows import RowFactory, namedtuple_row
from psycopg.types.json import set_json_dumps

__all__ = [
    "Call",
    "Connection",
    "Row",
    "Steps",
    "Work",
    "ask",
    "by_name",
    "drive",
    "drive_async",
    "run_async",
    "run_sync",
    "send_async",
    "send_sync",
]

T = TypeVar("T")
Row = Any
"""A row read by name: a named tuple whose fields are the statement's column names."""

by_name = cast("RowFactory[Any]", namedtuple_row)
"""psycopg's `namedtuple_row`, its rows typed `Any` so their fields can be read by name:
every statement's rows are read this way, so a column added to a statement cannot shift
the others (a computed column is named with `AS`)."""
Connection = Union["psycopg.Connection[Any]", "psycopg.AsyncConnection[Any]"]
"""A psycopg connection, sync or async, with any row factory."""


@dataclass(frozen=True)
class Call(Generic[T]):
    """A statement with its parameters and the function that reads its result.

    `read` gets the rows (empty when the statement returns none), each a named tuple
    read by column name (so a column added to a statement cannot shift the others), and
    the row count.
    """

    query: str
    params: Sequence[Any] | Mapping[str, Any]
    read: Callable[[list[Row], int], T]
    finished: Callable[[BaseException | None], None] | None = None
    """Told once the statement has run (`None`) or failed (what it raised): how a
    tracing hook ends its span around an enqueue (see `tracing`); usually `None`."""
    copy_rows: Iterable[Sequence[Any]] | None = None
    """For a `COPY ... FROM STDIN (FORMAT BINARY)` query: the rows to send (iterated as
    they are sent, once per send), each value of the PostgreSQL type `copy_types` names
    in its place, a `json`/`jsonb` value as JSON text already (`params` is then unused)."""
    copy_types: Sequence[str] = ()
    instead: Callable[[], Call[T]] | None = None
    """For a COPY: makes the same work as one ordinary statement, sent instead where COPY
    cannot go (a connection in pipeline mode, asyncpg's: see `adapters`); made only
    there, so the COPY does not pay for it."""

    def __repr__(self) -> str:
        # Parameters may hold job arguments: never show them.
        return f"Call({self.query.split(None, 3)[:3]!r}...)"


Steps = Generator[Call[Any], Any, T]
"""An operation of several statements: it yields each `Call` to send, is sent back what
that call read, and returns its result. It never waits itself: a driver (`drive`,
`drive_async`) sends its calls, on a sync or an async connection alike."""

Work = Call[T] | Steps[T]
"""What a driver runs: one `Call`, or the `Steps` of an operation of several."""


def ask(call: Call[T]) -> Steps[T]:
    """`value = yield from ask(call)`: send `call` from `Steps`, typed by what it reads."""
    value: T = yield call
    return value


def drive(send: Callable[[Call[Any]], Any], work: Work[T]) -> T:
    """Do `work`, each of its calls sent with `send` (which returns what the call read).
    What a call raises is raised into the steps, at the `yield` that sent it."""
    if isinstance(work, Call):
        value: T = send(work)
        return value
    try:
        call = next(work)
        while True:
            try:
                read = send(call)
            except BaseException as error:
                call = work.throw(error)
            else:
                call = work.send(read)
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(send: Callable[[Call[Any]], Awaitable[Any]], work: Work[T]) -> T:
    """`drive`, with each call awaited: the same steps, on an async connection."""
    if isinstance(work, Call):
        value: T = await send(work)
        return value
    try:
        call = next(work)
        while True:
            try:
                read = await send(call)
            except BaseException as error:
                call = work.throw(error)
            else:
                call = work.send(read)
    except StopIteration as done:
        result: T = done.value
        return result


def _as_is(text: str) -> str:
    """JSON text sent as it is (a COPY's JSON values are encoded already)."""
    return text


def run_sync(conn: psycopg.Connection[Any], work: Work[T], *, server_binding: bool = False) -> T:
    """Do `work` on a sync connection: send its call, or each of its steps' calls, and
    return what it read. With `server_binding`, on a cursor that sends the parameters
    apart from the statement whatever the connection's `cursor_factory` (Django's binds
    them into the text, in Python)."""
    if isinstance(work, Call):
        return send_sync(conn, work, server_binding)
    return drive(lambda call: send_sync(conn, call, server_binding), work)


def send_sync(conn: psycopg.Connection[Any], call: Call[T], server_binding: bool = False) -> T:
    """Send one call on a sync connection and read its result (see `run_sync`)."""
    if call.finished is not None:
        return _told_sync(conn, call, call.finished, server_binding)
    if call.instead is not None and conn.pgconn.pipeline_status != PipelineStatus.OFF:
        call = call.instead()  # a pipeline refuses COPY
    cursor = (
        psycopg.Cursor(conn, row_factory=by_name)
        if server_binding
        else conn.cursor(row_factory=by_name)
    )
    with cursor:
        if call.copy_rows is not None:
            set_json_dumps(_as_is, cursor)
            with cursor.copy(call.query) as copy:
                copy.set_types(call.copy_types)
                for row in call.copy_rows:
                    copy.write_row(row)
            return call.read([], cursor.rowcount)
        cursor.execute(call.query, call.params)
        rows = cursor.fetchall() if cursor.description is not None else []
        return call.read(rows, cursor.rowcount)


async def run_async(conn: psycopg.AsyncConnection[Any], work: Work[T]) -> T:
    """Do `work` on an async connection: `run_sync`, each call awaited."""
    if isinstance(work, Call):
        return await send_async(conn, work)
    return await drive_async(lambda call: send_async(conn, call), work)


async def send_async(conn: psycopg.AsyncConnection[Any], call: Call[T]) -> T:
    """Send one call on an async connection and read its result."""
    if call.finished is not None:
        return await _told_async(conn, call, call.finished)
    if call.instead is not None and conn.pgconn.pipeline_status != PipelineStatus.OFF:
        call = call.instead()  # a pipeline refuses COPY
    async with conn.cursor(row_factory=by_name) as cursor:
        if call.copy_rows is not None:
            set_json_dumps(_as_is, cursor)
            async with cursor.copy(call.query) as copy:
                copy.set_types(call.copy_types)
                for row in call.copy_rows:
                    await copy.write_row(row)
            return call.read([], cursor.rowcount)
        await cursor.execute(call.query, call.params)
        rows = await cursor.fetchall() if cursor.description is not None else []
        return call.read(rows, cursor.rowcount)


def _told_sync(
    conn: psycopg.Connection[Any],
    call: Call[T],
    told: Callable[[BaseException | None], None],
    server_binding: bool,
) -> T:
    """`send_sync`, then `told` how it ended (the calls without `finished` pay nothing)."""
    try:
        value = send_sync(conn, replace(call, finished=None), server_binding)
    except BaseException as error:
        told(error)
        raise
    told(None)
    return value


async def _told_async(
    conn: psycopg.AsyncConnection[Any], call: Call[T], told: Callable[[BaseException | None], None]
) -> T:
    """`send_async`, then `told` how it ended."""
    try:
        value = await send_async(conn, replace(call, finished=None))
    except BaseException as error:
        told(error)
        raise
    told(None)
    return value
