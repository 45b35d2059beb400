"""Calls: one statement with its parameters and how to read its rows, run on a sync
or an async psycopg connection, written once.

Each operation callers can do on their own connection (enqueue, acts, job info,
counts) is a `Call`: the SQL, its parameters, and how to read the rows back.
`run_sync` and `run_async` send a call on a psycopg connection; `adapters.run` sends
it on whichever kind of connection a caller gives (Django's, SQLAlchemy's and
asyncpg's too) and returns the value, or an awaitable of it for an async one. The
operations are defined once; only these few lines of waiting differ between sync and
async.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, Union, cast

import psycopg
from psycopg.pq import PipelineStatus
from psycopg.rows import RowFactory, namedtuple_row
from psycopg.types.json import set_json_dumps

__all__ = ["Call", "Connection", "Row", "by_name", "run_async", "run_sync"]

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


def _as_is(text: str) -> str:
    """JSON text sent as it is (a COPY's JSON values are encoded already)."""
    return text


def run_sync(conn: psycopg.Connection[Any], call: Call[T], *, server_binding: bool = False) -> T:
    """Send `call` on a sync connection and read its result. With `server_binding`, on
    a cursor that sends the parameters apart from the statement whatever the
    connection's `cursor_factory` (Django's binds them into the text, in Python)."""
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


async def run_async(conn: psycopg.AsyncConnection[Any], call: Call[T]) -> T:
    """Send `call` on an async connection and read its result."""
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
    """`run_sync`, then `told` how it ended (the calls without `finished` pay nothing)."""
    try:
        value = run_sync(conn, replace(call, finished=None), server_binding=server_binding)
    except BaseException as error:
        told(error)
        raise
    told(None)
    return value


async def _told_async(
    conn: psycopg.AsyncConnection[Any], call: Call[T], told: Callable[[BaseException | None], None]
) -> T:
    """`run_async`, then `told` how it ended."""
    try:
        value = await run_async(conn, replace(call, finished=None))
    except BaseException as error:
        told(error)
        raise
    told(None)
    return value
