"""The suite's recycled schemas (`recycled.Recycler`): a schema a test used comes back
to the next test as setup makes it, with no rows, and one a test changed never does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from axa_queue import NewJob, Queue, QueueOptions, cancel, enqueue_on
from axa_queue.schema import check
from conftest import END_SESSIONS, schema_dsn
from moves import move_all
from recycled import SETUP, Recycler


@pytest.fixture
def recycler(database_url: str) -> Iterator[Recycler]:
    """A recycler of its own (the session's keeps serving the other tests), whose
    schemas are all dropped afterwards."""
    kept = Recycler(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        kept.prepare(conn)
        try:
            yield kept
        finally:
            kept.close()
            for name in [*kept.kinds[SETUP].ready, *kept.made]:
                conn.execute(END_SESSIONS, (name,))
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


def _new(conn: psycopg.Connection[Any], recycler: Recycler, name: str) -> str:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    recycler.made.add(name)
    return name


async def test_a_used_schema_comes_back_as_setup_makes_it_with_no_rows(
    database_url: str, recycler: Recycler
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        first = _new(conn, recycler, "t_recycled_one")
        assert recycler.swap(first)  # the prepared schema, under the test's name
        queue = Queue(schema_dsn(database_url, first), QueueOptions(workers=1))
        await queue.open(setup=False)
        try:
            job = await queue.enqueue("recycled.job", {"secret": 1})
        finally:
            await queue.close()
        with psycopg.connect(schema_dsn(database_url, first), autocommit=True) as tables:
            assert cancel(tables, job, by="ops", reason="a row in the acts table").applied
            assert move_all(tables) == 1  # into a day partition, made as a worker makes it
        conn.execute(END_SESSIONS, (first,))

        assert recycler.recycle(conn, first)
        ready = recycler.kinds[SETUP]
        assert recycler._fingerprint(conn, ready.ready[-1]) == ready.reference

        second = _new(conn, recycler, "t_recycled_two")
        assert recycler.swap(second)
        dsn = schema_dsn(database_url, second)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            await check(aconn)  # its acts triggers are on, as setup turns them on
            cursor = await aconn.execute(
                "SELECT count(*) FROM pg_inherits WHERE inhparent = 'axa_queue_history'::regclass"
            )
            assert await cursor.fetchone() == (0,)  # the days made are dropped, as never made
            for table in ("axa_queue", "axa_queue_history", "axa_job_acts", "axa_queue_attempts"):
                cursor = await aconn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
                )
                assert await cursor.fetchone() == (0,)
        queue = Queue(dsn, QueueOptions(workers=1))
        await queue.open(setup=False)
        try:
            again = await queue.enqueue("recycled.job", {})
        finally:
            await queue.close()
        with psycopg.connect(dsn, autocommit=True) as tables:
            assert cancel(tables, again, by="ops", reason="the first act again").applied
            assert tables.execute("SELECT id FROM axa_job_acts").fetchall() == [(1,)]
            with pytest.raises(psycopg.Error):
                tables.execute("TRUNCATE axa_job_acts")  # refused again


CHANGES = {
    "an index added": "CREATE INDEX a_tests_own ON {}.axa_queue (created_at)",
    "an acts trigger turned off": "ALTER TABLE {}.axa_job_acts DISABLE TRIGGER axa_job_acts_refuse",
    "a grant": "GRANT SELECT ON {}.axa_queue TO PUBLIC",
    "a table's setting": "ALTER TABLE {}.axa_queue SET (fillfactor = 50)",
    "a version's row deleted": "DELETE FROM {}.axa_schema_version WHERE version = 20",
}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_schema_a_test_changed_is_dropped_not_recycled(
    database_url: str, recycler: Recycler, change: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        name = _new(conn, recycler, "t_recycled_changed")
        assert recycler.swap(name)
        conn.execute(sql.SQL(change).format(sql.Identifier(name)))
        assert not recycler.recycle(conn, name)


CATALOG_CHANGES = {k: v for k, v in CHANGES.items() if "version" not in k}


@pytest.mark.parametrize("change", CATALOG_CHANGES.values(), ids=CATALOG_CHANGES.keys())
def test_a_catalog_change_after_the_swap_is_seen_without_the_fingerprint(
    database_url: str, recycler: Recycler, change: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        name = _new(conn, recycler, "t_recycled_touched")
        assert recycler.swap(name)
        with psycopg.connect(schema_dsn(database_url, name), autocommit=True) as tables:
            enqueue_on(tables, NewJob("recycled.job", {}))  # rows only: untouched
        assert recycler.untouched(conn, name) is recycler.kinds[SETUP]
        conn.execute(sql.SQL(change).format(sql.Identifier(name)))
        assert recycler.untouched(conn, name) is None


FOREIGN_KEYED = (
    "CREATE TABLE {schema}.parent (id int PRIMARY KEY)",
    "CREATE TABLE {schema}.child (parent int REFERENCES {schema}.parent (id))",
)


def test_two_schemas_made_alike_with_a_foreign_key_have_one_fingerprint(
    database_url: str, recycler: Recycler
) -> None:
    """As `migrate` makes the Django tests' schemas: a foreign key's triggers are named
    after their oids, new in each schema, so the fingerprint reads the key itself."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        prints = []
        for name in ("t_recycled_keyed_1", "t_recycled_keyed_2"):
            _new(conn, recycler, name)
            for statement in FOREIGN_KEYED:
                conn.execute(sql.SQL(statement).format(schema=sql.Identifier(name)))
            prints.append(recycler._fingerprint(conn, name))
        assert prints[0] == prints[1]
        conn.execute("ALTER TABLE t_recycled_keyed_2.child DROP CONSTRAINT child_parent_fkey")
        assert recycler._fingerprint(conn, "t_recycled_keyed_2") != prints[0]


def test_a_schema_that_is_not_empty_is_never_swapped(database_url: str, recycler: Recycler) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        name = _new(conn, recycler, "t_recycled_taken")
        conn.execute(sql.SQL("CREATE TABLE {}.axa_queue (id uuid)").format(sql.Identifier(name)))
        ready = list(recycler.kinds[SETUP].ready)
        assert not recycler.swap(name)
        assert list(recycler.kinds[SETUP].ready) == ready


FILES = """SELECT c.relname, c.relfilenode FROM pg_class c
    WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r'"""


def test_only_the_tables_a_test_wrote_to_are_emptied_and_a_sequence_taken_from_restarts(
    database_url: str, recycler: Recycler
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        name = _new(conn, recycler, "t_recycled_written")
        assert recycler.swap(name)
        made = dict(conn.execute(FILES, (name,)).fetchall())
        with psycopg.connect(schema_dsn(database_url, name), autocommit=True) as tables:
            enqueue_on(tables, NewJob("recycled.job", {}))
            with pytest.raises(psycopg.errors.CheckViolation):  # takes an id, writes no row
                tables.execute(
                    "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason) "
                    "VALUES (gen_random_uuid(), 'recycled.job', 'cancelled', 0, '', 'why')"
                )
        conn.execute(END_SESSIONS, (name,))

        assert recycler.recycle(conn, name)
        ready = recycler.kinds[SETUP].ready[-1]
        after = dict(conn.execute(FILES, (ready,)).fetchall())
        assert after["axa_queue"] != made["axa_queue"]  # written: emptied
        assert after["axa_job_acts"] != made["axa_job_acts"]  # its sequence was taken from
        assert after["axa_schedule"] == made["axa_schedule"]  # never written: left as made
        assert conn.execute(
            sql.SQL("SELECT count(*) FROM {}.axa_queue").format(sql.Identifier(ready))
        ).fetchone() == (0,)
        sequence = conn.execute(
            "SELECT pg_get_serial_sequence(%s, 'id')", (f'"{ready}".axa_job_acts',)
        ).fetchone()
        assert sequence is not None and sequence[0] is not None
        assert conn.execute(
            "SELECT pg_sequence_last_value(%s::regclass)", (sequence[0],)
        ).fetchone() == (None,)  # the next act is number 1 again
