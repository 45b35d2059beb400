"""Set-up schemas used again: a test's schema, when the test left it as setup made it
(the same tables, indexes, triggers, functions and grants; only rows added), has its
rows removed and waits, renamed, for the next test whose queue sets up an empty schema.

Setting up the twenty-four migrations takes tens of milliseconds of server time, and the
suite does it over a thousand times; emptying the tables a test used takes a few. The
first setup of a test's empty schema (`axa_queue.schema.setup`, which `Queue.open`
runs) becomes a swap when a recycled schema is ready: the empty one is dropped and the
recycled one takes its name, in one transaction, so the test sees what setup would have
made. Everything else runs as it did: a schema that is not empty, a connection in a
transaction, a role that is not a superuser (setup could be refused), setup with a
schema named, or the setup lock held elsewhere all go through the real setup.

The Django tests' schemas are recycled the same way (the `DJANGO` kind): there the
swap replaces `migrate` (`djangotest.migrated`), and the rows `migrate` wrote (the
applied migrations, content types, permissions) are kept.

A schema is recycled only when its catalog entries, read with its name replaced, are
those of a schema fresh from setup (`FINGERPRINT`) once the history's day partitions a
test's worker made are dropped (setup makes none; housekeeping makes them at a worker's
start), it records every version from 1 to this code's, and it has no session left (the
test's are ended first, by `conftest.Schemas.drop`). Reading that fingerprint takes
about 10 ms of server time, half of a recycling; a schema that came from a swap is
spared it when none of its catalog rows was written after the swap and it has as many
as its kind's reference (`UNTOUCHED`): then it is still what the swap gave the test.
Emptying it truncates the tables the test wrote to (`WRITTEN`; restarting their
sequences; the acts table's triggers that refuse a truncate are turned off for it, then
set back as they were: a truncate makes new files for each table and index, tens of
milliseconds of server time for all of them), deletes its
tables' planner statistics and resets their activity counters, as a new table has none.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import namedtuple_row

import axa_queue.schema as queue_schema
from axa_queue.schema import SETUP_LOCK, SETUP_STATEMENTS, VERSION

__all__ = ["DJANGO", "SETUP", "Kind", "Recycler"]

FINGERPRINT = """
WITH n AS (SELECT oid, nspname FROM pg_namespace WHERE nspname = %(name)s)
SELECT md5(string_agg(replace(x, (SELECT nspname FROM n), '@'), E'\n' ORDER BY x)) AS print
FROM (
    SELECT 'nsp ' || coalesce(s.nspacl::text, '') FROM pg_namespace s JOIN n ON s.oid = n.oid
    UNION ALL
    SELECT concat_ws(' ', 'rel', c.relname, c.relkind, c.relpersistence, c.relispartition,
                     c.reloptions::text, c.relacl::text, c.relrowsecurity)
    FROM pg_class c JOIN n ON c.relnamespace = n.oid
    UNION ALL
    SELECT concat_ws(' ', 'att', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
                     a.attnotnull, a.attidentity, a.attgenerated, a.attacl::text,
                     pg_get_expr(d.adbin, d.adrelid))
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN n ON c.relnamespace = n.oid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'idx ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN n ON c.relnamespace = n.oid
    UNION ALL
    SELECT concat_ws(' ', 'con', co.conname, pg_get_constraintdef(co.oid))
    FROM pg_constraint co JOIN n ON co.connamespace = n.oid
    UNION ALL
    SELECT concat_ws(' ', 'trg', t.tgname, t.tgenabled, pg_get_triggerdef(t.oid))
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN n ON c.relnamespace = n.oid
    WHERE NOT t.tgisinternal  -- a foreign key's, named by its oid: its constraint is read
    UNION ALL
    SELECT concat_ws(' ', 'fn', p.proname, pg_get_function_identity_arguments(p.oid),
                     md5(p.prosrc), array_to_string(p.proconfig, ','), p.proacl::text)
    FROM pg_proc p JOIN n ON p.pronamespace = n.oid
    UNION ALL
    SELECT 'typ ' || t.typname FROM pg_type t JOIN n ON t.typnamespace = n.oid
    UNION ALL
    SELECT 'pol ' || po.polname
    FROM pg_policy po JOIN pg_class c ON c.oid = po.polrelid JOIN n ON c.relnamespace = n.oid
    UNION ALL
    SELECT 'rule ' || r.rulename
    FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class JOIN n ON c.relnamespace = n.oid
    UNION ALL
    SELECT 'stx ' || x.stxname FROM pg_statistic_ext x JOIN n ON x.stxnamespace = n.oid
    UNION ALL
    SELECT 'dacl ' || da.defaclacl::text FROM pg_default_acl da JOIN n ON da.defaclnamespace = n.oid
    UNION ALL
    SELECT 'desc ' || d.description
    FROM pg_description d JOIN pg_class c ON d.classoid = 'pg_class'::regclass AND d.objoid = c.oid
    JOIN n ON c.relnamespace = n.oid
) f(x)
"""
"""What a schema is made of, its own name replaced by `@` (so that a schema and its
renamed copy agree): one digest, equal for two schemas only when a test changed nothing
but rows."""

CATALOG_ROWS = """
WITH n AS (SELECT oid FROM pg_namespace WHERE nspname = %(name)s),
rels AS (SELECT array_agg(c.oid) AS oids FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM n))
SELECT count(*) AS rows,
       coalesce(bool_or(age(x) < age(%(since)s::xid)), false) AS written_since
FROM (
    SELECT xmin FROM pg_namespace WHERE oid = (SELECT oid FROM n)
    UNION ALL
    SELECT xmin FROM pg_class WHERE relnamespace = (SELECT oid FROM n)
    UNION ALL
    SELECT xmin FROM pg_attribute WHERE attrelid = ANY ((SELECT oids FROM rels)::oid[])
    UNION ALL
    SELECT xmin FROM pg_attrdef WHERE adrelid = ANY ((SELECT oids FROM rels)::oid[])
    UNION ALL
    SELECT xmin FROM pg_index WHERE indexrelid = ANY ((SELECT oids FROM rels)::oid[])
    UNION ALL
    SELECT xmin FROM pg_constraint WHERE connamespace = (SELECT oid FROM n)
    UNION ALL
    SELECT xmin FROM pg_trigger WHERE tgrelid = ANY ((SELECT oids FROM rels)::oid[])
    UNION ALL
    SELECT xmin FROM pg_proc WHERE pronamespace = (SELECT oid FROM n)
    UNION ALL
    SELECT xmin FROM pg_type WHERE typnamespace = (SELECT oid FROM n)
    UNION ALL
    SELECT xmin FROM pg_policy WHERE polrelid = ANY ((SELECT oids FROM rels)::oid[])
    UNION ALL
    SELECT xmin FROM pg_rewrite WHERE ev_class = ANY ((SELECT oids FROM rels)::oid[])
    UNION ALL
    SELECT xmin FROM pg_statistic_ext WHERE stxnamespace = (SELECT oid FROM n)
    UNION ALL
    SELECT xmin FROM pg_default_acl WHERE defaclnamespace = (SELECT oid FROM n)
    UNION ALL
    SELECT xmin FROM pg_description
    WHERE classoid = 'pg_class'::regclass AND objoid = ANY ((SELECT oids FROM rels)::oid[])
) f(x)
"""
"""How many catalog rows make schema `name` (in the catalogs `FINGERPRINT` reads), and
whether any was written by a transaction later than `since` (an xid; `age` counts back
from the current one, so wraparound is no matter). A DDL statement inserts, deletes or
updates such rows (an update writes a new version, with a new `xmin`); what the server
updates in place (a table's page and row estimates, which VACUUM and ANALYZE write) is
no part of the fingerprint either."""

SWAP_XID = "SELECT (txid_current() % 4294967296)::text AS xid"
"""The swap's transaction id, as the 32-bit xid a catalog row's `xmin` holds."""

SESSIONS_ON = """SELECT count(*) AS left FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND application_name = %(name)s"""
"""Sessions that could still use the schema (ended by the test's teardown before)."""

TABLES = """SELECT c.relname FROM pg_class c
    WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(name)s)
      AND c.relkind IN ('r', 'p') AND NOT c.relispartition"""

HISTORY_DAYS_MADE = """SELECT c.relname FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
    WHERE p.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(name)s)
      AND p.relname = 'axa_queue_history'"""
"""The history's day partitions, which a test's worker makes (setup makes none)."""

WRITTEN = """SELECT c.relname FROM pg_class c
    WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(name)s)
      AND c.relkind IN ('r', 'p') AND NOT c.relispartition
      AND (c.relkind = 'p' OR pg_relation_size(c.oid) > 0
           OR EXISTS (SELECT FROM pg_depend d JOIN pg_class q ON q.oid = d.objid
                      WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                        AND d.refobjid = c.oid
                        AND CASE WHEN q.relkind = 'S' THEN pg_sequence_last_value(q.oid) END
                            IS NOT NULL))"""
"""The tables a test may have changed: those whose heap has a page (a row was written,
even one rolled back or deleted since), or that own a sequence someone took a value
of (an insert refused by a constraint takes one and writes nothing), and the
partitioned ones (no storage of their own). Every other table is as setup made it,
with its indexes: emptying it would only make new files for it."""

TRUNCATE_TRIGGERS = """SELECT c.relname, t.tgname, t.tgenabled FROM pg_trigger t
    JOIN pg_class c ON c.oid = t.tgrelid
    WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(name)s)
      AND NOT t.tgisinternal AND t.tgtype & 32 <> 0"""
"""The triggers that fire on TRUNCATE (bit 5 of `tgtype`), and how each is enabled."""

PATH_FUNCTIONS = """SELECT p.oid::regprocedure::text AS signature FROM pg_proc p
    WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(name)s)
      AND EXISTS (SELECT FROM unnest(p.proconfig) c
                  WHERE c = 'search_path=' || quote_ident(%(name)s) || ', pg_temp')"""
"""Functions whose `search_path` is their own schema's (the release's)."""

FORGET_STATISTICS = """DELETE FROM pg_statistic WHERE starelid IN (
    SELECT oid FROM pg_class
    WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(name)s))"""

RESET_COUNTERS = """SELECT count(pg_stat_reset_single_table_counters(oid)) FROM pg_class
    WHERE relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %(name)s)"""

IS_EMPTY = """SELECT NOT EXISTS (SELECT FROM pg_class WHERE relnamespace = s.oid)
       AND NOT EXISTS (SELECT FROM pg_proc WHERE pronamespace = s.oid)
       AND NOT EXISTS (SELECT FROM pg_type WHERE typnamespace = s.oid) AS empty
    FROM pg_namespace s WHERE s.nspname = %(name)s"""

SETUP_CONTEXT = """SELECT current_schema() AS schema,
    (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS superuser"""


@dataclass
class Kind:
    """Schemas made one way: by setup (`SETUP`), or by Django's `migrate` of the tests'
    project (`DJANGO`). `keep` are the tables whose rows that making wrote, kept as they
    are (the others are emptied); a schema is of this kind when its fingerprint is
    `reference` and its kept tables hold as many rows as the reference's did."""

    keep: frozenset[str]
    reference: str | None = None
    catalog_rows: int | None = None
    kept_rows: dict[str, int] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)


SWAP_WAIT = 0.3
"""Seconds a swap waits for a schema the dropper is still emptying."""

SETUP = "setup"
"""Schemas `axa_queue.schema.setup` made: the one kind prepared ahead."""

DJANGO = "django"
"""Schemas of the Django tests, made by `migrate` (`djangotest.migrated`): learned from
the first one migrated."""


class Recycler:
    """Recycled schemas, kept ready for the next tests' setups (see the module)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.kinds = {
            SETUP: Kind(frozenset({"axa_schema_version"})),
            DJANGO: Kind(
                frozenset(
                    {
                        "axa_schema_version",
                        "django_migrations",
                        "django_content_type",
                        "auth_permission",
                    }
                )
            ),
        }
        self.made: set[str] = set()
        """The tests' schemas (`conftest.Schemas.make`): only these are swapped."""
        self.swapped: dict[str, tuple[str, str]] = {}
        """The tests' schemas a swap gave tables: their kind and the swap's xid."""
        self.lock = threading.Lock()
        self.incoming = 0
        """Test schemas handed to the dropper and not yet recycled or dropped."""
        self.settled = threading.Condition()
        """Notified as the dropper settles each (`expect`, `settle`)."""
        self.swap_conn: psycopg.Connection[Any] | None = None
        self.real_setup = queue_schema.setup

    # --- on the dropper's thread ------------------------------------------------------

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Set up one schema as setup does, learn the `SETUP` kind from it, and keep it
        ready."""
        name = f"r_{uuid.uuid4().hex[:12]}"
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
            conn.execute("SELECT set_config('search_path', %s, true)", (name,))
            for statement in SETUP_STATEMENTS:
                conn.execute(statement)
        self._learn(conn, name, SETUP)
        self.kinds[SETUP].ready.append(name)

    def learn(self, name: str, kind: str) -> None:
        """Take test schema `name`, just made, as the reference of `kind` if it has none."""
        if self.kinds[kind].reference is not None:
            return
        with self.lock:
            self._learn(self._swap_connection(), name, kind)

    def _learn(self, conn: psycopg.Connection[Any], name: str, kind: str) -> None:
        made = self.kinds[kind]
        made.kept_rows = self._kept_rows(conn, name, self._tables(conn, name), made.keep)
        made.reference = self._fingerprint(conn, name)
        made.catalog_rows = self._catalog_rows(conn, name, since=None)[0]

    def _fingerprint(self, conn: psycopg.Connection[Any], name: str) -> str | None:
        row = conn.execute(FINGERPRINT, {"name": name}).fetchone()
        return None if row is None else str(row[0])

    def _catalog_rows(
        self, conn: psycopg.Connection[Any], name: str, since: str | None
    ) -> tuple[int, bool]:
        """How many catalog rows make `name`, and whether one was written after
        transaction `since` (`CATALOG_ROWS`; never, without one)."""
        cursor = conn.cursor(row_factory=namedtuple_row)
        row = cursor.execute(CATALOG_ROWS, {"name": name, "since": since or "0"}).fetchone()
        assert row is not None
        return int(row.rows), since is not None and bool(row.written_since)

    def untouched(self, conn: psycopg.Connection[Any], name: str) -> Kind | None:
        """The kind a swap gave test schema `name`, when the test changed none of its
        catalog rows since (see the module); None when it did, or `name` was not swapped."""
        swapped = self.swapped.get(name)
        if swapped is None:
            return None
        kind, since = self.kinds[swapped[0]], swapped[1]
        rows, written = self._catalog_rows(conn, name, since)
        return kind if not written and rows == kind.catalog_rows else None

    def _tables(self, conn: psycopg.Connection[Any], name: str) -> list[str]:
        """The tables of schema `name` (a partitioned one, not its partitions)."""
        rows = conn.cursor(row_factory=namedtuple_row).execute(TABLES, {"name": name})
        return [row.relname for row in rows]

    def _kept_rows(
        self, conn: psycopg.Connection[Any], name: str, tables: list[str], keep: frozenset[str]
    ) -> dict[str, int]:
        """How many rows each of the `keep` tables among `tables` of `name` holds."""
        counts = {}
        for table in tables:
            if table in keep:
                found = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}.{}").format(
                        sql.Identifier(name), sql.Identifier(table)
                    )
                ).fetchone()
                counts[table] = 0 if found is None else int(found[0])
        return counts

    def _swap_connection(self) -> psycopg.Connection[Any]:
        if self.swap_conn is None or self.swap_conn.broken or self.swap_conn.closed:
            self.swap_conn = psycopg.connect(self.database_url, autocommit=True)
        return self.swap_conn

    def expect(self) -> None:
        """A test's schema is on its way to the dropper (which then calls `settle`)."""
        with self.settled:
            self.incoming += 1

    def recycle(self, conn: psycopg.Connection[Any], name: str) -> bool:
        """Empty `name` and keep it ready, renamed, when a test left it as setup made it
        (see the module); False (nothing done) otherwise: it is to be dropped."""
        try:
            return name in self.made and self._recycle(conn, name)
        except psycopg.Error:
            return False  # dropped instead
        finally:
            self.swapped.pop(name, None)

    def settle(self) -> None:
        """The dropper is done with a schema `expect` announced (recycled or dropped)."""
        with self.settled:
            self.incoming = max(self.incoming - 1, 0)
            self.settled.notify_all()

    def _recycle(self, conn: psycopg.Connection[Any], name: str) -> bool:
        if conn.execute(SESSIONS_ON, {"name": name}).fetchone()[0]:  # type: ignore[index]
            return False
        days = [row[0] for row in conn.execute(HISTORY_DAYS_MADE, {"name": name})]
        if days:  # dropped first, rows and all: the schema is then as setup made it
            conn.execute(
                sql.SQL("DROP TABLE {}").format(
                    sql.SQL(", ").join(
                        sql.SQL("{}.{}").format(sql.Identifier(name), sql.Identifier(day))
                        for day in days
                    )
                )
            )
        kind = self.untouched(conn, name)
        if kind is None:
            fingerprint = self._fingerprint(conn, name)
            kind = next(
                (
                    k
                    for k in self.kinds.values()
                    if k.reference is not None and k.reference == fingerprint
                ),
                None,
            )
        tables = self._tables(conn, name)
        if kind is None or self._kept_rows(conn, name, tables, kind.keep) != kind.kept_rows:
            return False
        versions = conn.execute(
            sql.SQL("SELECT array_agg(version ORDER BY version) FROM {}.axa_schema_version").format(
                sql.Identifier(name)
            )
        ).fetchone()
        if versions is None or versions[0] != list(range(1, VERSION + 1)):
            return False  # a test removed a version's row (or added one)
        fresh = f"r_{uuid.uuid4().hex[:12]}"
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '2s'")
            schema = sql.Identifier(name)
            written = {row[0] for row in conn.execute(WRITTEN, {"name": name})}
            emptied = [table for table in tables if table not in kind.keep and table in written]
            triggers = [
                trigger
                for trigger in conn.cursor(row_factory=namedtuple_row).execute(
                    TRUNCATE_TRIGGERS, {"name": name}
                )
                if trigger.relname in emptied
            ]
            for trigger in triggers:
                conn.execute(
                    sql.SQL("ALTER TABLE {}.{} DISABLE TRIGGER {}").format(
                        schema, sql.Identifier(trigger.relname), sql.Identifier(trigger.tgname)
                    )
                )
            if emptied:
                conn.execute(
                    sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                        sql.SQL(", ").join(
                            sql.SQL("{}.{}").format(schema, sql.Identifier(t)) for t in emptied
                        )
                    )
                )
            for trigger in triggers:
                how = {"O": "", "A": "ALWAYS ", "R": "REPLICA "}.get(trigger.tgenabled)
                if how is None:  # it was disabled: it stays so
                    continue
                conn.execute(
                    sql.SQL("ALTER TABLE {}.{} ENABLE " + how + "TRIGGER {}").format(
                        schema, sql.Identifier(trigger.relname), sql.Identifier(trigger.tgname)
                    )
                )
            conn.execute(FORGET_STATISTICS, {"name": name})
            conn.execute(RESET_COUNTERS, {"name": name})
            self._rename(conn, name, fresh)
        self.made.discard(name)
        kind.ready.append(fresh)
        return True

    def _rename(self, conn: psycopg.Connection[Any], old: str, new: str) -> None:
        """Rename schema `old` to `new`, and the functions that name it in their
        `search_path` with it (in the caller's transaction)."""
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(old)))
        signatures = [row[0] for row in conn.execute(PATH_FUNCTIONS, {"name": old})]
        conn.execute(
            sql.SQL("ALTER SCHEMA {} RENAME TO {}").format(sql.Identifier(old), sql.Identifier(new))
        )
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(new)))
        for signature in signatures:  # unqualified: found through the new search_path
            conn.execute(
                sql.SQL("ALTER FUNCTION {} SET search_path = {}, pg_temp").format(
                    sql.SQL(signature), sql.Identifier(new)
                )
            )

    # --- on a test's thread ---------------------------------------------------------

    def swap(self, name: str, kind: str = SETUP) -> bool:
        """Give the test's empty schema `name` the tables of a recycled schema of `kind`:
        whether it did. With none ready while earlier tests' schemas are still with the
        dropper, wait for them a moment (`SWAP_WAIT`): emptying one takes a few tens of
        milliseconds, making one from nothing more."""
        waiting = self.kinds[kind].ready
        deadline = time.monotonic() + SWAP_WAIT
        with self.settled:
            while not waiting and self.incoming and (left := deadline - time.monotonic()) > 0:
                self.settled.wait(left)
        with self.lock:
            if not waiting:
                return False
            ready = waiting.popleft()
            try:
                conn = self._swap_connection()
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '1s'")
                    locked = conn.execute(
                        "SELECT pg_try_advisory_xact_lock(%s)", (SETUP_LOCK,)
                    ).fetchone()
                    empty = conn.execute(IS_EMPTY, {"name": name}).fetchone()
                    if not (locked and locked[0]) or not (empty and empty[0]):
                        waiting.appendleft(ready)
                        return False
                    conn.execute(sql.SQL("DROP SCHEMA {}").format(sql.Identifier(name)))
                    self._rename(conn, ready, name)
                    xid = conn.execute(SWAP_XID).fetchone()
                self.swapped[name] = (kind, str(xid[0]))  # type: ignore[index]
            except psycopg.Error:
                waiting.appendleft(ready)  # rolled back: as it was (dropped at the end)
                return False
            return True

    async def setup(
        self,
        conn: psycopg.AsyncConnection[Any],
        lock_timeout: float = 5.0,
        schema: str | None = None,
    ) -> None:
        """`axa_queue.schema.setup`, or a swap when it would set up a test's empty schema
        from nothing (see the module)."""
        if schema is None and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            cursor = conn.cursor(row_factory=namedtuple_row)
            await cursor.execute(SETUP_CONTEXT)
            found: Any = await cursor.fetchone()
            if (
                found is not None
                and found.superuser
                and found.schema in self.made
                and await asyncio.to_thread(self.swap, found.schema)
            ):
                return
        await self.real_setup(conn, lock_timeout, schema)

    def close(self) -> None:
        if self.swap_conn is not None:
            self.swap_conn.close()
