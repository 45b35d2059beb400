"""What a connection pooler in front of PostgreSQL allows, and how the queue connects.

`QueueOptions.pooler` says what stands between the queue and the server:

- `direct`: nothing. The connections are the queue's own: prepared statements,
  LISTEN and the session settings (`sql.SESSION_SETTINGS`) all work.
- `session`: a pooler in session mode (PgBouncer's `pool_mode = session`). The server
  connection is the client's until it disconnects, then reset (`server_reset_query`,
  `DISCARD ALL` by default): everything works as direct.
- `transaction`: a pooler in transaction mode. Each transaction may run on another
  server connection, shared with other clients: no prepared statements (another
  client's connection would not know them, or would already have one of that name),
  no LISTEN (the connection that listened goes back to the pool: workers poll), and no
  session settings (they would stay on a connection others then use).

`QueueOptions.schema` names the tables' schema in every statement (`sql.in_schema`),
through a cursor class that makes each statement in the schema once (from its
template, `sql.naming`), since a pooler refuses the `options=-c search_path=...`
startup parameter. After the first time, a statement costs one cache lookup (about
0.3 µs); without a schema the cursor is psycopg's own. Only the queue's own statements
have a template; any other text passes as it is. The caller's statements are never
sent through it: on `queue.connection()` (and
`SyncQueue.connection()`) they are sent as written, in a transaction whose
`search_path` is set to the schema (`SET LOCAL`, which a transaction pooler carries);
on the caller's own connection (`enqueue_on`, `cancel`...) they follow that
connection's `search_path`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import psycopg
from psycopg.abc import Params, Query
from psycopg.copy import AsyncWriter, Writer

from .. import sql
from ..options import QueueOptions

__all__ = ["connect_kwargs", "keeps_session_state", "listens"]

log = logging.getLogger("axa_queue")

PREPARE_THRESHOLD = 5
"""Executions of a statement before psycopg prepares it on the server (its default)."""

_told: set[str] = set()
"""The warnings already given in this process (each is given once)."""


def connect_kwargs(options: QueueOptions, *, sync: bool = False) -> dict[str, Any]:
    """The keyword arguments for `psycopg.(Async)Connection.connect` under `options`:
    no prepared statements behind a transaction pooler (unless `prepare=True`, for
    PgBouncer 1.21+ with `max_prepared_statements`) or with `prepare=False`, and a
    cursor that names the schema when there is one."""
    prepare = (
        options.prepare
        if options.prepare is not None
        else options.resolved_pooler() != "transaction"
    )
    kwargs: dict[str, Any] = {"prepare_threshold": PREPARE_THRESHOLD if prepare else None}
    schema = options.resolved_schema()
    if schema is not None:
        kwargs["cursor_factory"] = _cursor(schema) if sync else _async_cursor(schema)
    return kwargs


def keeps_session_state(options: QueueOptions) -> bool:
    """Whether the queue may leave session settings on its connections: not behind a
    transaction pooler, where the server connection is shared."""
    return options.resolved_pooler() != "transaction"


def listens(options: QueueOptions) -> bool:
    """Whether workers should LISTEN: when `listen` is on and no transaction pooler is
    in the way. Warns once per process when it is asked for but cannot be served."""
    if not options.listen:
        return False
    if options.resolved_pooler() == "transaction":
        if "listen" not in _told:
            _told.add("listen")
            log.warning(
                "LISTEN cannot pass a transaction pooler: workers find new jobs by polling "
                "every poll_interval (%g s; set listen=False to say so and silence this)",
                options.poll_interval.total_seconds(),
                extra={"poll_interval": options.poll_interval.total_seconds()},
            )
        return False
    return True


@functools.cache
def _cursor(schema: str) -> type[psycopg.Cursor[Any]]:
    """A cursor class that names `schema` in every statement it sends."""

    class SchemaCursor(psycopg.Cursor[Any]):
        # `query: Any`: psycopg overloads `execute` (a query with parameters, or a
        # template without); this one override serves both.
        def execute(
            self,
            query: Any,
            params: Params | None = None,
            *,
            prepare: bool | None = None,
            binary: bool | None = None,
        ) -> SchemaCursor:
            if isinstance(query, str):
                query = sql.in_schema(query, schema)
            return super().execute(query, params, prepare=prepare, binary=binary)

        def executemany(
            self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
        ) -> None:
            if isinstance(query, str):
                query = sql.in_schema(query, schema)
            super().executemany(query, params_seq, returning=returning)

        def stream(
            self,
            query: Query,
            params: Params | None = None,
            *,
            binary: bool | None = None,
            size: int = 1,
        ) -> Iterator[Any]:
            if isinstance(query, str):
                query = sql.in_schema(query, schema)
            return super().stream(query, params, binary=binary, size=size)

        @contextlib.contextmanager
        def copy(
            self, statement: Query, params: Params | None = None, *, writer: Writer | None = None
        ) -> Iterator[psycopg.Copy]:
            if isinstance(statement, str):
                statement = sql.in_schema(statement, schema)
            with super().copy(statement, params, writer=writer) as copy:
                yield copy

    return SchemaCursor


@functools.cache
def _async_cursor(schema: str) -> type[psycopg.AsyncCursor[Any]]:
    """An async cursor class that names `schema` in every statement it sends."""

    class SchemaAsyncCursor(psycopg.AsyncCursor[Any]):
        async def execute(
            self,
            query: Any,
            params: Params | None = None,
            *,
            prepare: bool | None = None,
            binary: bool | None = None,
        ) -> SchemaAsyncCursor:
            if isinstance(query, str):
                query = sql.in_schema(query, schema)
            return await super().execute(query, params, prepare=prepare, binary=binary)

        async def executemany(
            self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
        ) -> None:
            if isinstance(query, str):
                query = sql.in_schema(query, schema)
            await super().executemany(query, params_seq, returning=returning)

        async def stream(
            self,
            query: Query,
            params: Params | None = None,
            *,
            binary: bool | None = None,
            size: int = 1,
        ) -> AsyncIterator[Any]:
            if isinstance(query, str):
                query = sql.in_schema(query, schema)
            async for row in super().stream(query, params, binary=binary, size=size):
                yield row

        @contextlib.asynccontextmanager
        async def copy(
            self,
            statement: Query,
            params: Params | None = None,
            *,
            writer: AsyncWriter | None = None,
        ) -> AsyncIterator[psycopg.AsyncCopy]:
            if isinstance(statement, str):
                statement = sql.in_schema(statement, schema)
            async with super().copy(statement, params, writer=writer) as copy:
                yield copy

    return SchemaAsyncCursor
