"""Setup and the schema check: upgrading axa 0.1.0's table, setups racing each other,
and `open(setup=False)` refusing a schema that is missing anything it needs."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

import seed_crate as crate
from axa_queue import SETUP_STATEMENTS, Queue, QueueOptions, SchemaError
from axa_queue.schema import SETUP_LOCK
from conftest import eventually, running, status_of

TABLES = ("axa_queue", "axa_schedule", "axa_job_acts")


def drop_everything(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP TABLE IF EXISTS axa_queue, axa_schedule, axa_job_acts CASCADE")
    conn.execute("DROP FUNCTION IF EXISTS axa_job_acts_refuse, axa_queue_notify CASCADE")


def tables(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    ).fetchall()
    return {row[0] for row in rows}


async def test_an_axa_010_table_with_queued_rows_is_brought_up_to_date_and_its_rows_run(
    make_queue, admin
) -> None:
    for statement in crate.V010_SETUP_STATEMENTS:
        admin.execute(statement)
    ids = [uuid4() for _ in range(3)]
    for n, job_id in enumerate(ids):
        admin.execute(crate.V010_ENQUEUE, crate.params(job_id, "Report", Jsonb({"n": n})))
    finished = uuid4()
    admin.execute(crate.V010_ENQUEUE, crate.params(finished, "Report", Jsonb({"n": 9})))
    admin.execute(
        "UPDATE axa_queue SET status = 'failed', error = 'told to fail' WHERE id = %s",
        (finished,),
    )
    before = admin.execute(
        "SELECT id, name, args, status, error, run_at, created_at FROM axa_queue ORDER BY id"
    ).fetchall()

    queue = await make_queue()
    assert tables(admin) >= set(TABLES)
    after = admin.execute(
        "SELECT id, name, args, status, error, run_at, created_at, attempts, max_attempts, "
        "priority, timeout_ms FROM axa_queue ORDER BY id"
    ).fetchall()
    assert [row[:7] for row in after] == before, "nothing lost or changed"
    assert {row[7:] for row in after} == {(0, None, 0, None)}

    seen: list[int] = []
    queue.handle("Report", lambda args: seen.append(args["n"]))
    async with running(queue):
        await eventually(lambda: all(status_of(admin, i)[0] == "completed" for i in ids))
    assert sorted(seen) == [0, 1, 2]
    assert status_of(admin, finished) == ("failed", "told to fail", 0)


async def test_eight_setups_at_once_on_an_empty_schema_all_succeed(dsn, admin) -> None:
    for _ in range(3):
        drop_everything(admin)
        queues = [Queue(dsn, QueueOptions(pool_size=1)) for _ in range(8)]
        try:
            await asyncio.gather(*(q.open() for q in queues))
        finally:
            await asyncio.gather(*(q.close() for q in queues))
        assert tables(admin) >= set(TABLES)


def test_eight_setups_at_once_from_threads_all_succeed(dsn, admin) -> None:
    errors: list[BaseException] = []

    async def boot() -> None:
        queue = Queue(dsn, QueueOptions(pool_size=1))
        await queue.open()
        await queue.close()

    def in_thread() -> None:
        try:
            asyncio.run(boot())
        except BaseException as error:
            errors.append(error)

    for _ in range(2):
        drop_everything(admin)
        threads = [threading.Thread(target=in_thread) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        assert tables(admin) >= set(TABLES)


BOOT = """
import asyncio, sys
from axa_queue import Queue, QueueOptions
async def main():
    queue = Queue(sys.argv[1], QueueOptions(pool_size=1))
    await queue.open()
    await queue.close()
asyncio.run(main())
"""


def test_eight_setups_at_once_from_processes_all_succeed(dsn, admin) -> None:
    drop_everything(admin)
    boots = [subprocess.Popen([sys.executable, "-c", BOOT, dsn]) for _ in range(8)]
    assert [boot.wait(60) for boot in boots] == [0] * 8
    assert tables(admin) >= set(TABLES)


async def test_the_public_setup_statements_can_run_twice(make_queue, admin) -> None:
    for _ in range(2):
        with admin.transaction():
            admin.execute("SELECT pg_advisory_xact_lock(%s)", (SETUP_LOCK,))
            for statement in SETUP_STATEMENTS:
                admin.execute(statement)
    queue = await make_queue(setup=False)
    assert queue.notifies


async def test_setup_when_the_tables_are_up_to_date_changes_nothing_and_can_repeat(
    make_queue, admin
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("J", {})
    await queue.setup()
    await queue.setup()
    await queue.check()
    assert status_of(admin, job_id) == ("queued", None, 0)


async def test_open_without_setup_on_an_empty_schema_names_the_missing_table(make_queue) -> None:
    with pytest.raises(SchemaError, match="axa_queue") as raised:
        await make_queue(setup=False)
    assert "setup" in str(raised.value), "the message says what to do"


@pytest.mark.parametrize("table", ["axa_schedule", "axa_job_acts"])
async def test_open_without_setup_names_any_other_missing_table(make_queue, admin, table) -> None:
    await make_queue()
    admin.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
    with pytest.raises(SchemaError, match=table):
        await make_queue(setup=False)


@pytest.mark.parametrize(
    ("table", "column"),
    [("axa_queue", "timeout_ms"), ("axa_queue", "attempts"), ("axa_schedule", "interval_ms")],
)
async def test_open_without_setup_refuses_a_table_missing_a_column(
    make_queue, admin, table, column
) -> None:
    await make_queue()
    admin.execute(
        sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(
            sql.Identifier(table), sql.Identifier(column)
        )
    )
    with pytest.raises(SchemaError, match=table) as raised:
        await make_queue(setup=False)
    assert column in str(raised.value)


@pytest.mark.parametrize("trigger", ["axa_job_acts_refuse", "axa_job_acts_refuse_truncate"])
@pytest.mark.parametrize(
    "change",
    [
        "DROP TRIGGER {trigger} ON axa_job_acts",
        "ALTER TABLE axa_job_acts ENABLE TRIGGER {trigger}",
        "ALTER TABLE axa_job_acts DISABLE TRIGGER {trigger}",
    ],
    ids=["dropped", "enabled-not-always", "disabled"],
)
async def test_open_without_setup_refuses_an_acts_trigger_that_is_not_always_on(
    make_queue, admin, trigger, change
) -> None:
    await make_queue()
    admin.execute(change.format(trigger=trigger))
    with pytest.raises(SchemaError, match=rf"\b{trigger}\b") as raised:
        await make_queue(setup=False)
    (other,) = {"axa_job_acts_refuse", "axa_job_acts_refuse_truncate"} - {trigger}
    assert re.search(rf"\b{other}\b", str(raised.value)) is None, "only the one turned off"
    # Setup puts it back.
    await make_queue()
    await make_queue(setup=False)


async def test_an_unreachable_database_fails_at_open_with_psycopgs_error() -> None:
    queue = Queue("postgresql://root@127.0.0.1:1/test?connect_timeout=3")
    with pytest.raises(psycopg.OperationalError):
        await queue.open()
    assert not queue.is_open


SESSIONS = (
    "SELECT pid FROM pg_stat_activity "
    "WHERE application_name = current_setting('application_name') AND pid <> pg_backend_pid()"
)
"""The test's sessions (its schema's `application_name`) but the one asking."""


async def test_open_logs_in_once_the_connection_that_set_up_the_tables_is_the_pools_first(
    dsn, admin
) -> None:
    queue = Queue(dsn, QueueOptions())
    first = queue.connector.first_connection
    pids: list[int] = []

    async def recorded(pool: Any) -> psycopg.AsyncConnection[Any]:
        conn = await first(pool)
        pids.append(conn.info.backend_pid)
        return conn

    queue.connector.first_connection = recorded  # type: ignore[method-assign]
    await queue.open()
    try:
        assert [row[0] for row in admin.execute(SESSIONS)] == pids  # no other login
        async with queue.connection() as conn:
            assert conn.info.backend_pid == pids[0]
            cursor = await conn.execute("SELECT current_setting('plan_cache_mode')")
            assert await cursor.fetchone() == ("force_generic_plan",)  # configured as new
    finally:
        await queue.close()


async def test_a_failed_open_closes_the_connection_it_checked_the_tables_on(dsn, admin) -> None:
    with pytest.raises(SchemaError):
        await Queue(dsn, QueueOptions()).open(setup=False)  # nothing set up
    await eventually(lambda: not admin.execute(SESSIONS).fetchall())


async def test_a_queue_given_no_dsn_opens_its_pool_on_the_environments(dsn, monkeypatch) -> None:
    monkeypatch.setenv("AXA_QUEUE_DSN", dsn)
    queue = Queue(options=QueueOptions())
    await queue.open()
    try:
        async with queue.connection() as first, queue.connection() as second:
            for conn in (first, second):  # the one open() made, and one the pool made
                cursor = await conn.execute("SELECT count(*) FROM axa_queue")
                assert await cursor.fetchone() == (0,)
    finally:
        await queue.close()
