"""Adapters: the caller's connection, of whichever library, and a `Call` sent on it.

The functions that take the caller's connection (`enqueue_on`, `enqueue_all_on`,
`cancel`, `retry`, `job_on`, `jobs_on`, `counts_on`, `acts_on`) accept:

- psycopg `Connection` and `AsyncConnection` (`calls.run_sync`, `calls.run_async`);
- Django's `connection` or `connections[alias]` (the PostgreSQL backend on psycopg 3):
  connected if it is not yet, the statement sent on Django's own psycopg connection,
  so Django's `atomic` (or its autocommit) decides when it commits;
- SQLAlchemy `Session`, `scoped_session`, `Connection` (the `postgresql+psycopg`
  dialect), `AsyncSession`, `async_scoped_session` and `AsyncConnection` (the
  `postgresql+psycopg` and `postgresql+asyncpg` dialects): the statement joins the
  transaction SQLAlchemy holds, begun as any statement of SQLAlchemy's would begin it;
- asyncpg `Connection` and a pool's connection (`async with pool.acquire() as conn`):
  in the caller's `conn.transaction()`, or committed at once outside one.

Sync connections (psycopg's `Connection`, Django's, SQLAlchemy's `Session` and
`Connection`) return the value; async ones return an awaitable of it. The statements
are written once, for psycopg (`%s`, `%(name)s`); for asyncpg each is turned into
`$n` once and cached. The statement goes to the driver itself, never through Django's
cursor or SQLAlchemy's `execute`, whose debug logs (`DEBUG = True`, `echo=True`) would
print the parameters, and so a job's arguments.

Django, SQLAlchemy and asyncpg are imported only here, only when an object of theirs
is given: the core needs none of them. A type is recognised once (by its classes'
modules) and its sender cached, so the adapter costs a dictionary lookup per call.
"""

from __future__ import annotations

import functools
import json
import re
import weakref
from collections import namedtuple
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, Union, overload

import psycopg
from psycopg.types.json import Json, Jsonb

from .calls import Call, Row, Work, drive, drive_async, run_async, run_sync, send_async, send_sync

if TYPE_CHECKING:
    from typing import TypeAlias

    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session
    from sqlalchemy.orm import Session, scoped_session

__all__ = [
    "ACCEPTED",
    "AnyConnection",
    "AsyncpgConnection",
    "DjangoConnection",
    "SomeAsyncConnection",
    "SomeSyncConnection",
    "dollar_query",
    "run",
]

T = TypeVar("T")


class DjangoConnection(Protocol):
    """Django's `connection` or `connections[alias]` (a `BaseDatabaseWrapper`), as far
    as its type says."""

    vendor: str

    def ensure_connection(self) -> None: ...


class AsyncpgConnection(Protocol):
    """An asyncpg `Connection`, or a pool's connection, as far as its type says."""

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]: ...


SomeSyncConnection: TypeAlias = Union[
    "psycopg.Connection[Any]",
    "Session",
    "scoped_session[Any]",
    "SAConnection",
    DjangoConnection,
]
"""A connection whose calls return their value: psycopg's, Django's, SQLAlchemy's sync ones."""

SomeAsyncConnection: TypeAlias = Union[
    "psycopg.AsyncConnection[Any]",
    "AsyncSession",
    "async_scoped_session[Any]",
    "SAAsyncConnection",
    AsyncpgConnection,
]
"""A connection whose calls return an awaitable: psycopg's, SQLAlchemy's async ones, asyncpg's."""

AnyConnection: TypeAlias = SomeSyncConnection | SomeAsyncConnection
"""Any connection the functions taking the caller's connection accept."""

ACCEPTED = (
    "a psycopg Connection or AsyncConnection; Django's connection (django.db.connection "
    "or connections[alias], PostgreSQL on psycopg 3); a SQLAlchemy Session, Connection, "
    "AsyncSession or AsyncConnection (postgresql+psycopg, or postgresql+asyncpg when "
    "async); or an asyncpg Connection (a pool's too: `async with pool.acquire() as conn:`)"
)
"""What the functions taking the caller's connection accept, as errors name it."""


class Sender(NamedTuple):
    """How a call is sent on one kind of connection."""

    send: Callable[[Any, Call[Any]], Any]
    """Sends a call on a connection of that kind: its value, or (`waits`) an awaitable."""
    waits: bool
    """Whether the connection is an async one: `send` returns an awaitable."""


_senders: dict[type, Sender] = {}
"""The sender found for each type of connection given so far."""


@overload
def run(conn: SomeSyncConnection, work: Work[T]) -> T: ...
@overload
def run(conn: SomeAsyncConnection, work: Work[T]) -> Awaitable[T]: ...
@overload
def run(conn: AnyConnection, work: Work[T]) -> T | Awaitable[T]: ...
def run(conn: AnyConnection, work: Work[T]) -> T | Awaitable[T]:
    """Do `work` (a `Call`, or the `Steps` of an operation) on `conn`: the value for a
    sync connection, an awaitable of it for an async one, each call sent as `conn`'s
    kind takes it. Raises `TypeError` naming what is accepted for anything else."""
    if isinstance(conn, psycopg.Connection):
        return run_sync(conn, work)
    if isinstance(conn, psycopg.AsyncConnection):
        return run_async(conn, work)
    kind = type(conn)
    sender = _senders.get(kind)
    if sender is None:
        try:
            sender = _senders[kind] = _sender_for(kind)
        except TypeError as refused:
            _tell_refused(work, refused)
            raise
    send = sender.send
    if sender.waits:
        return drive_async(lambda call: _told_async(send, conn, call), work)
    return drive(lambda call: _told_sync(send, conn, call), work)


def _tell_refused(work: Work[Any], refused: TypeError) -> None:
    """Tell the first call of `work` (`Call.finished`) that nothing was sent: a span
    around it ends all the same."""
    first = work if isinstance(work, Call) else next(work, None)
    if first is not None and first.finished is not None:
        first.finished(refused)
    if not isinstance(work, Call):
        work.close()


def _told_sync(send: Callable[[Any, Call[T]], T], conn: Any, call: Call[T]) -> T:
    """`send` the call; then tell its `finished` (how a tracing hook ends its span
    around an enqueue), if any, how it ended."""
    told = call.finished
    if told is None:
        return send(conn, call)
    try:
        value = send(conn, replace(call, finished=None))
    except BaseException as error:
        told(error)
        raise
    told(None)
    return value


async def _told_async(send: Callable[[Any, Call[T]], Awaitable[T]], conn: Any, call: Call[T]) -> T:
    """`_told_sync`, the call awaited."""
    told = call.finished
    if told is None:
        return await send(conn, call)
    try:
        value = await send(conn, replace(call, finished=None))
    except BaseException as error:
        told(error)
        raise
    told(None)
    return value


def _roots(kind: type) -> set[str]:
    """The top-level packages of `kind` and of the classes it derives from."""
    return {(getattr(k, "__module__", None) or "").partition(".")[0] for k in kind.__mro__}


def _sender_for(kind: type) -> Sender:
    """The sender for connections of type `kind`, or a `TypeError` naming what is accepted."""
    roots = _roots(kind)
    if "django" in roots:
        from django.db.backends.base.base import BaseDatabaseWrapper
        from django.utils.connection import ConnectionProxy

        if issubclass(kind, ConnectionProxy):
            return Sender(_on_django_proxy, waits=False)
        if issubclass(kind, BaseDatabaseWrapper):
            return Sender(_on_django, waits=False)
    if "sqlalchemy" in roots:
        found = _sqlalchemy_sender(kind)
        if found is not None:
            return found
    if "asyncpg" in roots:
        from asyncpg import Connection as AsyncpgConnectionClass
        from asyncpg.pool import PoolConnectionProxy

        if issubclass(kind, (AsyncpgConnectionClass, PoolConnectionProxy)):
            return Sender(_on_asyncpg, waits=True)
    raise TypeError(refusal(kind, roots))


def refusal(kind: type, roots: set[str] | None = None) -> str:
    """Why a `kind` is refused, naming what is accepted and, for a pool or an engine,
    how to take a connection from it."""
    roots = _roots(kind) if roots is None else roots
    name = kind.__name__
    hint = ""
    if "psycopg_pool" in roots:
        hint = "; a pool is not a connection: use `with pool.connection() as conn:`"
    elif "asyncpg" in roots and "Pool" in name:
        hint = "; a pool is not a connection: use `async with pool.acquire() as conn:`"
    elif "sqlalchemy" in roots and "Engine" in name:
        hint = "; an engine is not a connection: use `with engine.begin() as conn:`"
    return f"expected {ACCEPTED}; got a {kind.__module__}.{name}{hint}"


# --- Django ------------------------------------------------------------------------------


def _on_django_proxy(proxy: Any, call: Call[T]) -> T:
    """Send `call` on the connection `django.db.connection` stands for in this thread or
    task, looked up once: each attribute read through the proxy looks it up again."""
    return _on_django(proxy._connections[proxy._alias], call)


def _on_django(conn: Any, call: Call[T]) -> T:
    """Send `call` on Django's connection: connected first when it is not yet, and sent
    on its psycopg connection, so Django's transaction state (autocommit, or the
    `atomic` block in progress) holds the statement. A database error comes out as
    Django's own (`django.db.IntegrityError`, ...), as from Django's cursor."""
    if conn.vendor != "postgresql":
        raise TypeError(
            f"Django's connection {conn.alias!r} is to {conn.vendor}: the job queue lives in "
            f"PostgreSQL; pass connections[alias] of a PostgreSQL database"
        )
    conn.ensure_connection()
    raw = conn.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(
            f"Django's connection {conn.alias!r} runs on {type(raw).__module__.partition('.')[0]}, "
            "not psycopg 3, which axa-queue sends its statements with: Django uses psycopg 3 "
            "whenever it can import it (check that `import psycopg` works where Django runs)"
        )
    conn.validate_no_broken_transaction()
    with conn.wrap_database_errors:
        # Django's cursors bind parameters into the text, in Python; the queue's
        # statements bind them on the server, which is cheaper. Whether a statement is
        # prepared stays the connection's choice (`prepare_threshold`: Django's default,
        # None, prepares none, so its connections keep working behind a pooler).
        return send_sync(raw, call, server_binding=True)


# --- SQLAlchemy --------------------------------------------------------------------------


def _sqlalchemy_sender(kind: type) -> Sender | None:
    """The sender for a SQLAlchemy type, or `None` when it is none of those accepted."""
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session, scoped_session

    if issubclass(kind, scoped_session):
        return Sender(lambda scoped, call: _on_session(scoped(), call), waits=False)
    if issubclass(kind, Session):
        return Sender(_on_session, waits=False)
    if issubclass(kind, SAConnection):
        return Sender(_on_sqlalchemy, waits=False)
    try:
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
    except ImportError:  # pragma: no cover - SQLAlchemy without its asyncio extension
        return None
    if issubclass(kind, async_scoped_session):
        return Sender(lambda scoped, call: _on_async_session(scoped(), call), waits=True)
    if issubclass(kind, AsyncSession):
        return Sender(_on_async_session, waits=True)
    if issubclass(kind, AsyncConnection):
        return Sender(_on_async_sqlalchemy, waits=True)
    return None


def _dialect_refusal(conn: Any, wanted: str) -> TypeError:
    dialect = conn.dialect
    return TypeError(
        f"this SQLAlchemy connection uses the {dialect.name}+{dialect.driver} dialect; "
        f"axa-queue takes {wanted}: make the engine with that dialect "
        f'(create_engine("postgresql+psycopg://..."))'
    )


_session_connections: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()
"""For each `Session` and `AsyncSession`, its transaction and the connection that
transaction holds: asking the session again (for an `AsyncSession`, a trip through
SQLAlchemy's greenlet) cost more than the rest of a call, and within one transaction
the answer does not change."""


def _on_session(session: Any, call: Call[T]) -> T:
    """Send `call` on the connection of a SQLAlchemy `Session` (or the one a
    `scoped_session` holds for this scope), beginning the session's transaction as any
    statement would."""
    transaction = session.get_transaction()
    held = _session_connections.get(session)
    if held is not None and held[0] is transaction and transaction.is_active:
        return _on_sqlalchemy(held[1], call)
    conn = session.connection()
    _session_connections[session] = (session.get_transaction(), conn)
    return _on_sqlalchemy(conn, call)


def _on_sqlalchemy(conn: Any, call: Call[T]) -> T:
    """Send `call` on a sync SQLAlchemy `Connection`, in the transaction it holds, begun
    here when none is (as SQLAlchemy's own first statement would), so `conn.commit()`
    and `conn.rollback()` decide."""
    if not conn.in_transaction():
        conn.begin()
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise _dialect_refusal(conn, "postgresql+psycopg for a sync connection")
    return send_sync(raw, call)


async def _on_async_session(session: Any, call: Call[T]) -> T:
    """Send `call` on the connection of a SQLAlchemy `AsyncSession` (or the one an
    `async_scoped_session` holds for this scope), beginning its transaction as any
    statement would."""
    transaction = session.sync_session.get_transaction()
    held = _session_connections.get(session)
    if held is not None and held[0] is transaction and transaction.is_active:
        return await _on_async_sqlalchemy(held[1], call)
    conn = await session.connection()
    _session_connections[session] = (session.sync_session.get_transaction(), conn)
    return await _on_async_sqlalchemy(conn, call)


async def _on_async_sqlalchemy(conn: Any, call: Call[T]) -> T:
    """Send `call` on a SQLAlchemy `AsyncConnection`, in the transaction it holds (begun
    here when none is). On `postgresql+psycopg` it goes to psycopg's connection. On
    `postgresql+asyncpg`, SQLAlchemy starts asyncpg's transaction only with its first
    statement: until it has, the call goes through SQLAlchemy's driver cursor, which
    starts it as SQLAlchemy's own statements do; once it has, to asyncpg directly."""
    if conn.sync_connection is None:
        await conn.start()
    if not conn.in_transaction():
        await conn.begin()
    raw = conn.sync_connection.connection.driver_connection
    if isinstance(raw, psycopg.AsyncConnection):
        return await send_async(raw, call)
    if type(raw).__module__.partition(".")[0] == "asyncpg":
        if raw.is_in_transaction():  # SQLAlchemy's transaction has started on asyncpg
            return await _on_asyncpg(raw, call)
        query, args = asyncpg_statement(call)
        rows, count = await conn.run_sync(_through_cursor, query, args)
        return call.read(rows, count)
    raise _dialect_refusal(conn, "postgresql+psycopg or postgresql+asyncpg")


def _through_cursor(sync_conn: Any, query: str, args: tuple[Any, ...]) -> tuple[list[Row], int]:
    """Run in SQLAlchemy's greenlet: the statement on the driver's cursor, its rows by name."""
    cursor = sync_conn.connection.cursor()
    try:
        cursor.execute(query, args)
        if cursor.description is None:
            return [], cursor.rowcount
        names = tuple(column[0] for column in cursor.description)
        return [_row_type(names)(*row) for row in cursor.fetchall()], cursor.rowcount
    finally:
        cursor.close()


# --- asyncpg -----------------------------------------------------------------------------


async def _on_asyncpg(conn: Any, call: Call[T]) -> T:
    """Send `call` on an asyncpg connection (asyncpg caches it as a prepared statement)."""
    query, args = asyncpg_statement(call)
    records = await conn.fetch(query, *args)
    if not records:
        return call.read([], 0)
    row = _row_type(tuple(records[0].keys()))
    return call.read([row(*record) for record in records], len(records))


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")


@functools.lru_cache(maxsize=256)
def dollar_query(query: str) -> tuple[str, tuple[str, ...] | int]:
    """`query`'s psycopg placeholders as asyncpg's `$n`: the new text, and the parameter
    names in `$n` order (a name used twice is one `$n`), or how many `%s` there were.
    A literal `%%` becomes `%`. Made once per statement."""
    names: list[str] = []
    positional = 0

    def number(found: re.Match[str]) -> str:
        nonlocal positional
        if found[0] == "%%":
            return "%"
        if found[1] is None:
            positional += 1
            return f"${positional}"
        if found[1] not in names:
            names.append(found[1])
        return f"${names.index(found[1]) + 1}"

    text = _PLACEHOLDER.sub(number, query)
    if names and positional:
        raise ValueError("a statement mixes %s and %(name)s placeholders")
    return text, tuple(names) if names else positional


def asyncpg_statement(call: Call[Any]) -> tuple[str, tuple[Any, ...]]:
    """`call` as asyncpg takes it: the `$n` text and its arguments in order, with
    psycopg's JSON wrappers (`Json`, `Jsonb`) as JSON text, which asyncpg's default
    `json`/`jsonb` codec takes (the statements cast their JSON parameters). A COPY goes
    as the ordinary statement it carries (`Call.instead`): asyncpg's COPY takes other
    values than psycopg's binary rows."""
    if call.instead is not None:
        call = call.instead()
    query, order = dollar_query(call.query)
    params = call.params
    if isinstance(order, int):
        values: Sequence[Any] = params if isinstance(params, Sequence) else ()
    else:
        mapping: Mapping[str, Any] = params if isinstance(params, Mapping) else {}
        values = [mapping[name] for name in order]
    return query, tuple(_asyncpg_value(value) for value in values)


def _asyncpg_value(value: Any) -> Any:
    if isinstance(value, (Json, Jsonb)):
        return json.dumps(value.obj)
    return value


@functools.lru_cache(maxsize=256)
def _row_type(names: tuple[str, ...]) -> Any:
    """A named tuple for rows of these columns, so they are read by name as psycopg's are
    (a name that is no identifier, `EXPLAIN`'s `QUERY PLAN`, with `_` for what is not a
    letter or digit, as psycopg's `namedtuple_row` has it)."""
    return namedtuple("Row", [re.sub(r"\W", "_", name) for name in names])
