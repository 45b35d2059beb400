"""The functions taking the caller's connection, on every kind of connection accepted:
psycopg's, Django's, SQLAlchemy's (sync and async, on psycopg and on asyncpg) and
asyncpg's, each committing and rolling back with the caller's transaction."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import asyncpg
import psycopg
import psycopg_pool
import pytest
import sqlalchemy
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb
from sqlalchemy.ext.asyncio import (
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from axa_queue import (
    SETUP_STATEMENTS,
    ActKind,
    Duplicate,
    JobState,
    NewJob,
    acts_on,
    cancel,
    counts_on,
    enqueue_all_on,
    enqueue_on,
    job_on,
    jobs_on,
    retry,
)
from axa_queue.db.adapters import ACCEPTED, dollar_query, run
from axa_queue.db.calls import Call, Steps, ask
from axa_queue.jobs.enqueue import COPY_FROM, enqueue_call
from conftest import set_up

SECRET = "943 476 5919"
"""What must never leave the `args` column."""


@pytest.fixture(autouse=True)
def _django_in_async_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests are async (most kinds of connection are); Django's calls in them block
    the event loop, as in any sync code, which Django refuses unless told it is meant."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def url_of(dsn: str, driver: str = "postgresql") -> str:
    """The server of the conninfo `dsn` as a URL for `driver`, without its options."""
    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.get("user", "")))
    password = f":{quote(str(parts['password']))}" if parts.get("password") else ""
    host = parts.get("host", "127.0.0.1")
    return f"{driver}://{user}{password}@{host}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


def django_settings(dsn: str, schema: str) -> dict[str, Any]:
    """The `DATABASES` entry of a Django project using this test's schema."""
    parts = conninfo_to_dict(dsn)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.get("dbname", ""),
        "USER": parts.get("user", ""),
        "PASSWORD": parts.get("password", ""),
        "HOST": parts.get("host", "127.0.0.1"),
        "PORT": str(parts.get("port", 5432)),
        "OPTIONS": {"options": f"-c search_path={schema}"},
    }


def django_ready() -> None:
    """Configure a bare Django project (no apps) once per process, if nothing else did."""
    import django
    from django.conf import settings

    if not settings.configured:  # the project of the Django tests (tests/django_site)
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")
    django.setup()


@contextlib.contextmanager
def django_alias(dsn: str, schema: str, **extra: Any) -> Any:
    """`connections[alias]` of a database alias made for this test, removed afterwards."""
    django_ready()
    from django.db import connections

    alias = f"axa_{schema}"
    connections.settings[alias] = connections.configure_settings(
        {"default": {}, alias: {**django_settings(dsn, schema), **extra}}
    )[alias]
    try:
        yield connections[alias]
    finally:
        connections[alias].close()
        del connections[alias]
        del connections.settings[alias]


@dataclass
class Opened:
    """A connection of one kind, with how its caller commits and rolls back."""

    conn: Any
    commit: Callable[[], Awaitable[None]]
    rollback: Callable[[], Awaitable[None]]
    sync: bool

    async def __call__(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(conn, *args)`, awaited when the connection is async."""
        result = function(self.conn, *args)
        if self.sync:
            assert not isinstance(result, Awaitable), "a sync connection returned an awaitable"
            return result
        assert isinstance(result, Awaitable), "an async connection returned a value"
        return await result


def done(function: Callable[[], Any]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result = function()
        if isinstance(result, Awaitable):
            await result

    return call


KINDS = [
    "psycopg",
    "psycopg async",
    "django",
    "sqlalchemy session",
    "sqlalchemy scoped session",
    "sqlalchemy connection",
    "sqlalchemy async session",
    "sqlalchemy async scoped session",
    "sqlalchemy async connection",
    "sqlalchemy asyncpg session",
    "sqlalchemy asyncpg connection",
    "asyncpg",
    "asyncpg pool",
]


@contextlib.asynccontextmanager
async def opened(kind: str, dsn: str, schema: str) -> AsyncIterator[Opened]:
    """A connection of `kind` to this test's schema, in a transaction of its caller's."""
    psycopg_options = {"options": f"-c search_path={schema}"}
    asyncpg_settings = {"server_settings": {"search_path": schema}}
    if kind == "psycopg":
        with psycopg.connect(dsn) as conn:
            yield Opened(conn, done(conn.commit), done(conn.rollback), sync=True)
    elif kind == "psycopg async":
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            yield Opened(aconn, aconn.commit, aconn.rollback, sync=False)
    elif kind == "django":
        from django.db import transaction

        with django_alias(dsn, schema) as connection:
            block = transaction.atomic(using=connection.alias)
            block.__enter__()

            async def commit() -> None:
                block.__exit__(None, None, None)
                block.__enter__()

            async def rollback() -> None:
                transaction.set_rollback(True, using=connection.alias)
                block.__exit__(None, None, None)
                block.__enter__()

            yield Opened(connection, commit, rollback, sync=True)
            block.__exit__(None, None, None)
    elif kind.startswith("sqlalchemy") and "async" not in kind:
        engine = sqlalchemy.create_engine(
            url_of(dsn, "postgresql+psycopg"), connect_args=psycopg_options
        )
        try:
            if kind == "sqlalchemy connection":
                with engine.connect() as conn:
                    yield Opened(conn, done(conn.commit), done(conn.rollback), sync=True)
            elif kind == "sqlalchemy scoped session":
                scoped = scoped_session(sessionmaker(engine))
                yield Opened(scoped, done(scoped.commit), done(scoped.rollback), sync=True)
                scoped.remove()
            else:
                with Session(engine) as session:
                    yield Opened(session, done(session.commit), done(session.rollback), sync=True)
        finally:
            engine.dispose()
    elif kind.startswith("sqlalchemy"):
        on_asyncpg = "asyncpg" in kind
        aengine = create_async_engine(
            url_of(dsn, "postgresql+asyncpg" if on_asyncpg else "postgresql+psycopg"),
            connect_args=asyncpg_settings if on_asyncpg else psycopg_options,
        )
        try:
            if kind.endswith("connection"):
                async with aengine.connect() as aconn:
                    yield Opened(aconn, aconn.commit, aconn.rollback, sync=False)
            elif "scoped" in kind:
                ascoped = async_scoped_session(
                    async_sessionmaker(aengine), scopefunc=asyncio.current_task
                )
                yield Opened(ascoped, ascoped.commit, ascoped.rollback, sync=False)
                await ascoped.remove()
            else:
                async with async_sessionmaker(aengine)() as asession:
                    yield Opened(asession, asession.commit, asession.rollback, sync=False)
        finally:
            await aengine.dispose()
    elif kind == "asyncpg":
        raw = await asyncpg.connect(url_of(dsn), **asyncpg_settings)
        try:
            yield await in_transactions(raw)
        finally:
            await raw.close()
    elif kind == "asyncpg pool":
        pool = await asyncpg.create_pool(url_of(dsn), min_size=1, max_size=1, **asyncpg_settings)
        try:
            async with pool.acquire() as proxy:
                yield await in_transactions(proxy)
        finally:
            await pool.close()
    else:  # pragma: no cover
        raise AssertionError(kind)


async def in_transactions(conn: Any) -> Opened:
    """An asyncpg connection in a transaction of its caller's, begun again after each end."""
    current = [conn.transaction()]
    await current[0].start()

    async def end(how: str) -> None:
        await getattr(current[0], how)()
        current[0] = conn.transaction()
        await current[0].start()

    async def commit() -> None:
        await end("commit")

    async def rollback() -> None:
        await end("rollback")

    return Opened(conn, commit, rollback, sync=False)


@pytest.fixture
def tables(admin: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The queue's tables in this test's schema; the admin connection to check them."""
    set_up(admin)
    return admin


def stored(admin: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[str, Any] | None:
    row = admin.execute("SELECT status, args FROM axa_queue WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def acts_kept(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM axa_job_acts").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_job_queued_on_each_kind_of_connection_commits_and_rolls_back_with_the_caller(
    kind: str, dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    async with opened(kind, dsn, schema) as conn:
        kept = await conn(enqueue_on, NewJob("mail.send", {"phone": SECRET}))
        assert stored(tables, kept) is None, "seen before the caller committed"
        await conn.commit()
        assert stored(tables, kept) == ("queued", {"phone": SECRET})

        dropped = await conn(enqueue_on, NewJob("mail.send"))
        batch = await conn(enqueue_all_on, [NewJob("a"), NewJob("b")])
        undone = await conn(cancel, kept, "ops", "duplicate")
        assert undone.applied
        await conn.rollback()
        assert stored(tables, dropped) is None
        assert [stored(tables, one) for one in batch] == [None, None]
        assert stored(tables, kept) == ("queued", {"phone": SECRET}), "the cancel rolled back"
        assert acts_kept(tables) == 0, "the act rolled back with the change"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_batch_big_enough_for_copy_commits_and_rolls_back_with_the_caller_on_each_kind(
    kind: str, dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    jobs = [NewJob("Bulk", {"n": n, "phone": SECRET}) for n in range(COPY_FROM + 1)]
    async with opened(kind, dsn, schema) as conn:
        kept = await conn(enqueue_all_on, jobs)  # by COPY on psycopg, an INSERT on asyncpg
        await conn.commit()
        assert [stored(tables, one) for one in kept] == [
            ("queued", {"n": n, "phone": SECRET}) for n in range(COPY_FROM + 1)
        ]
        dropped = await conn(enqueue_all_on, jobs)
        await conn.rollback()
        assert [stored(tables, one) for one in dropped] == [None] * (COPY_FROM + 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_keyed_job_on_each_kind_of_connection_is_queued_once_and_rolls_back_with_the_caller(
    kind: str, dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    async with opened(kind, dsn, schema) as conn:
        first = await conn(enqueue_on, NewJob("Invoice", {"id": SECRET}, unique_key="invoice:1"))
        again = await conn(enqueue_on, NewJob("Invoice", unique_key="invoice:1"))
        assert not isinstance(first, Duplicate)
        assert isinstance(again, Duplicate) and again == first, "taken in this very transaction"
        await conn.commit()
        assert stored(tables, first) == ("queued", {"id": SECRET})
        assert isinstance(
            await conn(enqueue_on, NewJob("Invoice", unique_key="invoice:1")), Duplicate
        )
        batch = await conn(
            enqueue_all_on,
            [NewJob("Invoice", unique_key="invoice:1"), NewJob("Invoice", unique_key="invoice:2")],
        )
        assert batch[0] == first and isinstance(batch[0], Duplicate)
        dropped = await conn(enqueue_on, NewJob("Invoice", unique_key="invoice:3"))
        await conn.rollback()
        assert stored(tables, batch[1]) is None and stored(tables, dropped) is None
        fresh = await conn(enqueue_on, NewJob("Invoice", unique_key="invoice:3"))
        assert not isinstance(fresh, Duplicate) and fresh != dropped, "the key rolled back free"
        await conn.commit()
    keys = tables.execute("SELECT unique_key FROM axa_queue ORDER BY unique_key").fetchall()
    assert keys == [("invoice:1",), ("invoice:3",)]


@pytest.mark.parametrize("kind", KINDS)
async def test_every_function_taking_a_connection_runs_on_each_kind_of_connection(
    kind: str, dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    async with opened(kind, dsn, schema) as conn:
        first, second = await conn(enqueue_all_on, [NewJob("a", [1]), NewJob("b", {"x": SECRET})])
        third = await conn(enqueue_on, NewJob("c", run_in=3600, priority=5, max_attempts=2))
        await conn.commit()
        tables.execute("UPDATE axa_queue SET status = 'failed' WHERE id = %s", (second,))

        info = await conn(job_on, third)
        assert info is not None
        assert (info.id, info.name, info.state, info.priority, info.max_attempts) == (
            third,
            "c",
            JobState.QUEUED,
            5,
            2,
        )
        assert info.run_at > info.created_at
        assert await conn(job_on, uuid.uuid4()) is None
        listed = await conn(jobs_on, "queued")
        assert sorted(job.name for job in listed) == ["a", "c"]
        assert [job.id for job in await conn(jobs_on, None, "b", 5)] == [second]
        counts = await conn(counts_on)
        assert (counts.ready, counts.waiting, counts.failed) == (1, 1, 1)

        cancelled = await conn(cancel, first, "ops", "not needed")
        assert (cancelled.applied, cancelled.kind) == (True, ActKind.CANCELLED)
        again = await conn(cancel, first, "ops", "not needed")
        assert (again.applied, again.found) == (False, JobState.CANCELLED)
        retried = await conn(retry, second, "ops", "fixed upstream")
        assert (retried.applied, retried.kind) == (True, ActKind.RETRIED)
        await conn.commit()

        acts = await conn(acts_on, first)
        assert [(act.kind, act.by, act.reason, act.job_id) for act in acts] == [
            (ActKind.CANCELLED, "ops", "not needed", first)
        ]
        assert acts[0].role is not None
    assert stored(tables, second) == ("queued", {"x": SECRET})


COUNT_NAMED = "SELECT count(*) AS jobs FROM axa_queue WHERE name = %(name)s"


def _count_named(name: str) -> Call[int]:
    return Call(COUNT_NAMED, {"name": name}, lambda rows, _n: rows[0].jobs)


def queued_between_counts(name: str) -> Steps[tuple[int, uuid.UUID, int, str]]:
    """Count the jobs of `name`, queue one, count again, then send a statement that
    fails and say what the steps were told of it at their `yield`."""
    before = yield from ask(_count_named(name))
    job_id = yield from ask(enqueue_call(NewJob(name)))
    after = yield from ask(_count_named(name))
    try:
        yield from ask(Call("SELECT 1 / (%(zero)s::int) AS never", {"zero": 0}, lambda r, n: r))
    except Exception as error:  # each kind's own error class
        return before, job_id, after, str(error)
    raise AssertionError("a division by zero was not raised into the steps")


@pytest.mark.parametrize("kind", KINDS)
async def test_the_steps_of_an_operation_run_alike_on_each_kind_of_connection(
    kind: str, dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    """Each call is sent once the one before it has read its rows, in the caller's
    transaction; what a call raises is raised into the steps where they sent it."""
    async with opened(kind, dsn, schema) as conn:
        before, job_id, after, said = await conn(run, queued_between_counts("Steps"))
        assert (before, after) == (0, 1), "the second count saw the job queued between"
        assert "division by zero" in said
        await conn.rollback()
    assert stored(tables, job_id) is None, "the job rolled back with the caller"


async def test_django_connects_a_connection_that_has_not_connected_yet(
    dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    with django_alias(dsn, schema) as connection:
        connection.close()
        assert connection.connection is None
        job_id = enqueue_on(connection, NewJob("mail.send"))
        assert stored(tables, job_id) == ("queued", {}), "autocommit: queued at once"


async def test_djangos_default_connection_proxy_is_accepted_and_its_atomic_block_decides(
    dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    django_ready()
    from django.db import connection, connections, transaction

    saved = connections.settings.get("default")
    connections.settings["default"] = connections.configure_settings(
        {"default": django_settings(dsn, schema)}
    )["default"]
    with contextlib.suppress(AttributeError):  # not made yet in this context
        del connections["default"]
    try:
        with transaction.atomic():
            kept = enqueue_on(connection, NewJob("mail.send"))
        with pytest.raises(RuntimeError), transaction.atomic():
            dropped = enqueue_on(connection, NewJob("mail.send"))
            raise RuntimeError("the view failed")
        assert stored(tables, kept) == ("queued", {})
        assert stored(tables, dropped) is None
    finally:
        connection.close()
        del connections["default"]
        if saved is None:
            del connections.settings["default"]
        else:
            connections.settings["default"] = saved


async def test_a_database_error_on_djangos_connection_is_djangos_own_error(
    dsn: str, schema: str, admin: psycopg.Connection[Any]
) -> None:
    from django.db import ProgrammingError

    with django_alias(dsn, schema) as connection, pytest.raises(ProgrammingError) as raised:
        enqueue_on(connection, NewJob("mail.send", {"phone": SECRET}))
    assert "axa_queue" in str(raised.value)
    assert SECRET not in str(raised.value)


async def test_a_django_connection_to_another_database_than_postgresql_is_refused(
    dsn: str, schema: str
) -> None:
    with (
        django_alias(dsn, schema, ENGINE="django.db.backends.sqlite3", NAME=":memory:") as lite,
        pytest.raises(TypeError, match="is to sqlite: the job queue lives in PostgreSQL"),
    ):
        enqueue_on(lite, NewJob("mail.send"))


async def test_neither_djangos_debug_log_nor_sqlalchemys_echo_shows_a_jobs_arguments(
    dsn: str, schema: str, tables: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with django_alias(dsn, schema) as connection:
        connection.force_debug_cursor = True  # as DEBUG = True does
        enqueue_on(connection, NewJob("mail.send", {"phone": SECRET}))
        assert SECRET not in repr(connection.queries)
    engine = sqlalchemy.create_engine(
        url_of(dsn, "postgresql+psycopg"),
        connect_args={"options": f"-c search_path={schema}"},
        echo=True,
    )
    with engine.begin() as conn:
        enqueue_on(conn, NewJob("mail.send", {"phone": SECRET}))
    engine.dispose()
    aengine = create_async_engine(
        url_of(dsn, "postgresql+asyncpg"),
        connect_args={"server_settings": {"search_path": schema}},
        echo=True,
    )
    async with AsyncSession(aengine) as session, session.begin():
        await enqueue_on(session, NewJob("mail.send", {"phone": SECRET}))
    await aengine.dispose()
    assert caplog.records, "nothing was logged: the test would prove nothing"
    assert SECRET not in caplog.text
    row = tables.execute("SELECT count(*) FROM axa_queue").fetchone()
    assert row is not None and row[0] == 3


async def test_an_asyncpg_connection_with_its_own_jsonb_codec_stores_the_arguments_once(
    dsn: str, schema: str, tables: psycopg.Connection[Any]
) -> None:
    conn = await asyncpg.connect(url_of(dsn), server_settings={"search_path": schema})
    try:
        await conn.set_type_codec(
            "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )
        job_id = await enqueue_on(conn, NewJob("mail.send", {"phone": SECRET}))
        [many] = await enqueue_all_on(conn, [NewJob("mail.send", {"phone": SECRET})])
    finally:
        await conn.close()
    assert stored(tables, job_id) == ("queued", {"phone": SECRET})
    assert stored(tables, many) == ("queued", {"phone": SECRET})


async def test_psycopgs_json_parameters_reach_asyncpg_as_json_text(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(url_of(dsn), server_settings={"search_path": schema})
    try:
        read = Call(
            "SELECT %(doc)s::jsonb ->> 'a' AS a, %(doc)s::jsonb ->> 'b' AS b, 100 %% 7 AS r",
            {"doc": Jsonb({"a": "x", "b": 2})},
            lambda rows, count: (rows[0].a, rows[0].b, rows[0].r, count),
        )
        assert await run(conn, read) == ("x", "2", 2, 1)
    finally:
        await conn.close()


def test_psycopg_placeholders_become_asyncpgs_numbered_ones_once_per_statement() -> None:
    assert dollar_query("SELECT %(a)s, %(b)s::int, %(a)s::text, 5 %% 2") == (
        "SELECT $1, $2::int, $1::text, 5 % 2",
        ("a", "b"),
    )
    assert dollar_query("SELECT %s, %s") == ("SELECT $1, $2", 2)
    assert dollar_query("SELECT 1") == ("SELECT 1", 0)
    with pytest.raises(ValueError, match="mixes"):
        dollar_query("SELECT %s, %(a)s")


async def test_anything_else_is_refused_with_what_is_accepted_and_how_to_get_a_connection(
    dsn: str, schema: str
) -> None:
    with pytest.raises(TypeError) as refused:
        enqueue_on(object(), NewJob("mail.send", {"phone": SECRET}))  # type: ignore[call-overload]
    assert str(refused.value) == f"expected {ACCEPTED}; got a builtins.object"

    pool = psycopg_pool.ConnectionPool(dsn, open=False)
    with pytest.raises(TypeError, match=r"a pool is not a connection: use `with pool.connection"):
        enqueue_on(pool, NewJob("mail.send"))  # type: ignore[call-overload]

    engine = sqlalchemy.create_engine(url_of(dsn, "postgresql+psycopg"))
    with pytest.raises(TypeError, match=r"an engine is not a connection: use `with engine.begin"):
        counts_on(engine)  # type: ignore[call-overload]
    engine.dispose()

    apool = await asyncpg.create_pool(url_of(dsn), min_size=0, max_size=1)
    try:
        with pytest.raises(
            TypeError, match=r"use `async with pool.acquire\(\) as conn:`"
        ) as raised:
            enqueue_on(apool, NewJob("mail.send", {"phone": SECRET}))  # type: ignore[call-overload]
        assert SECRET not in str(raised.value)
    finally:
        await apool.close()


# --- SQLAlchemy and Alembic migrations (docs/integrations.md) --------------------------


def psycopg_engine(dsn: str, schema: str) -> sqlalchemy.Engine:
    return sqlalchemy.create_engine(
        url_of(dsn, "postgresql+psycopg"), connect_args={"options": f"-c search_path={schema}"}
    )


async def test_the_alembic_recipe_makes_tables_that_check_accepts_and_runs_again_unchanged(
    dsn: str, schema: str, make_queue: Callable[..., Awaitable[Any]]
) -> None:
    from alembic import op
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    from axa_queue.schema import SETUP_LOCK, VERSION, statements_of

    def upgrade() -> None:  # the recipe's migration, word for word
        op.execute(
            sqlalchemy.text("SELECT pg_advisory_xact_lock(:lock)").bindparams(lock=SETUP_LOCK)
        )
        for version in range(1, VERSION + 1):
            for statement in statements_of(version):
                op.execute(statement)

    engine = psycopg_engine(dsn, schema)
    for _ in range(2):  # statements safe to repeat: a second upgrade changes nothing
        with (
            engine.begin() as connection,
            Operations.context(MigrationContext.configure(connection)),
        ):
            upgrade()
    engine.dispose()
    queue = await make_queue(setup=False)  # check only: raises SchemaError if anything lacks
    assert (await queue.counts()).ready == 0


async def test_the_setup_statements_run_through_sqlalchemy_as_the_docs_say(
    dsn: str, schema: str, admin: psycopg.Connection[Any]
) -> None:
    engine = psycopg_engine(dsn, schema)
    with engine.connect() as connection, pytest.raises(sqlalchemy.exc.ProgrammingError) as why:
        for statement in SETUP_STATEMENTS:
            connection.exec_driver_sql(statement)
    assert "placeholder" in str(why.value)
    with engine.begin() as connection:
        quiet = connection.execution_options(no_parameters=True)
        for statement in SETUP_STATEMENTS:
            quiet.exec_driver_sql(statement)
    with engine.begin() as connection:
        for statement in SETUP_STATEMENTS:
            connection.execute(sqlalchemy.text(statement))
    engine.dispose()
    aengine = create_async_engine(
        url_of(dsn, "postgresql+asyncpg"),
        connect_args={"server_settings": {"search_path": schema}},
    )
    async with aengine.begin() as aconnection:
        for statement in SETUP_STATEMENTS:
            await aconnection.exec_driver_sql(statement)
    await aengine.dispose()
    message = admin.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = 'axa_job_acts_refuse'"
    ).fetchone()
    assert message is not None and "'% on % is refused" in message[0], "the % kept as written"


async def test_a_sqlalchemy_connection_on_another_driver_is_refused_naming_the_dialect() -> None:
    engine = sqlalchemy.create_engine("sqlite://")
    with Session(engine) as session, pytest.raises(TypeError) as refused:
        enqueue_on(session, NewJob("mail.send", {"phone": SECRET}))
    engine.dispose()
    assert "the sqlite+pysqlite dialect; axa-queue takes postgresql+psycopg" in str(refused.value)
    assert SECRET not in str(refused.value)


class Psycopg2Connection:
    """Stands for a psycopg2 connection under Django (psycopg2 is not installed here)."""

    __module__ = "psycopg2.extensions"


async def test_a_django_connection_on_psycopg2_is_refused_saying_what_to_check(
    dsn: str, schema: str
) -> None:
    with django_alias(dsn, schema) as connection:
        connection.ensure_connection()
        real, connection.connection = connection.connection, Psycopg2Connection()
        try:
            with pytest.raises(TypeError, match=r"runs on psycopg2, not psycopg 3.*import psyc"):
                enqueue_on(connection, NewJob("mail.send"))
        finally:
            connection.connection = real
