"""The job queue's schema: ordered migrations (`migrations`), the version recorded in
the database, and the setup and check every queue runs as it opens.

`setup` reads the recorded version (a plain SELECT of `axa_schema_version`) and the
catalogs, which takes no lock an application's transaction could hold; with nothing
to change it runs nothing more. Else, under the advisory setup lock and with each
statement waiting no longer than `setup_lock_timeout` for a table lock, it applies the
migrations the database has not recorded, and any earlier one whose objects went
missing. A database set up before versions were recorded, with everything in place,
only gets its versions recorded.

`check` refuses a database whose recorded version is older than `VERSION` ("the
database is at 1, this code needs 2: run `axa-queue setup`") and one missing a column
or an acts trigger. A newer database is fine: migrations only add, so code one release
behind keeps working during a rolling upgrade.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql as pgsql

from .. import sql
from ..db.calls import Call, Steps, ask, run_async
from ..errors import SchemaError
from ..sql import naming
from .migrations import (
    MIGRATIONS,
    SETUP_STATEMENTS,
    SETUP_VERSION_READ,
    SETUP_VERSION_TABLE,
    VERSION,
    Expectations,
    Migration,
)

__all__ = [
    "MIGRATIONS",
    "SETUP_LOCK",
    "SETUP_STATEMENTS",
    "VERSION",
    "Expectations",
    "Migration",
    "allowed_setup",
    "check",
    "expected",
    "missing",
    "missing_call",
    "needs",
    "recorded",
    "recorded_version",
    "setup",
    "statements_of",
    "where",
]

SETUP_LOCK = 0x0061_7861_5F71
"""Advisory lock key held while setup runs: `axa_q` as bytes, as the crate uses."""

ACTS_TRIGGERS = ("axa_job_acts_refuse", "axa_job_acts_refuse_truncate", "axa_job_acts_role")
"""The refusing triggers and the one recording each act's role, which `check` requires,
each set to fire always."""

VERSION_READABLE = naming.statement("""SELECT to_regclass({'axa_schema_version'}) IS NOT NULL
    AND has_table_privilege(to_regclass({'axa_schema_version'}), 'SELECT') AS readable""")
"""Whether versions are recorded (a database set up before they were has no table) and
this role may read them (setup grants that to everyone; a DBA may have revoked it)."""

RECORDED_VERSION = naming.statement(
    "SELECT coalesce(max(version), 0) AS version FROM {axa_schema_version}"
)
"""The newest migration applied; a plain read, which waits for no application's lock."""

TAKE_SETUP_LOCK = "SELECT pg_advisory_xact_lock(%s)"
"""Run setup one service at a time; released when the transaction ends."""

SETUP_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"
"""`SET LOCAL lock_timeout` for setup's transaction (the value as a parameter): its DDL
waits behind an application's open transaction no longer than this, rather than holding
every claim and enqueue queued behind its own ACCESS EXCLUSIVE request."""

SETUP_MISSING = """SELECT 'table ' || t AS missing FROM unnest(%(tables)s::text[]) AS t
        WHERE to_regclass(%(prefix)s || t) IS NULL
    UNION ALL
    SELECT 'column ' || c.t || '.' || c.c
        FROM unnest(%(column_tables)s::text[], %(columns)s::text[]) AS c(t, c)
        WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
            WHERE a.attrelid = to_regclass(%(prefix)s || c.t) AND a.attname = c.c
              AND NOT a.attisdropped)
    UNION ALL
    SELECT 'index ' || i FROM unnest(%(indexes)s::text[]) AS i
        WHERE to_regclass(%(prefix)s || i) IS NULL
    UNION ALL
    SELECT 'constraint ' || k.c FROM unnest(%(constraint_tables)s::text[],
            %(constraints)s::text[]) AS k(t, c)
        WHERE NOT EXISTS (SELECT 1 FROM pg_constraint n
            WHERE n.conrelid = to_regclass(%(prefix)s || k.t) AND n.conname = k.c)
    UNION ALL
    SELECT 'function ' || f.f || CASE WHEN strpos(f.f, '(') > 0 THEN '' ELSE '()' END
        FROM unnest(%(functions)s::text[], %(bodies)s::text[]) AS f(f, body)
        WHERE NOT EXISTS (SELECT 1 FROM pg_proc p
            WHERE p.oid = to_regprocedure(%(prefix)s || f.f
                                          || CASE WHEN strpos(f.f, '(') > 0 THEN '' ELSE '()' END)
              AND p.prosrc = f.body)
    UNION ALL
    SELECT 'trigger ' || g.g FROM unnest(%(trigger_tables)s::text[], %(triggers)s::text[],
            %(trigger_always)s::bool[]) AS g(t, g, always)
        WHERE NOT EXISTS (SELECT 1 FROM pg_trigger r
            WHERE r.tgrelid = to_regclass(%(prefix)s || g.t) AND r.tgname = g.g
              AND CASE WHEN g.always THEN r.tgenabled::text = 'A'
                       ELSE r.tgenabled::text <> 'D' END)
    UNION ALL
    SELECT DISTINCT 'storage settings of ' || o.t
        FROM unnest(%(storage_tables)s::text[], %(storage)s::text[]) AS o(t, setting)
        WHERE NOT coalesce((SELECT reloptions FROM pg_class
                            WHERE oid = to_regclass(%(prefix)s || o.t))
                           @> ARRAY[o.setting], false)"""
"""What `SETUP_STATEMENTS` would still change: tables, columns, indexes, constraints,
functions (by their body), triggers (and whether they fire always) and storage settings
that are missing or differ, one line each. It reads only the catalogs, so it takes no
lock an application's transaction could be holding: when nothing is missing, setup runs
nothing more (`ALTER TABLE ... ADD COLUMN IF NOT EXISTS` would take an ACCESS EXCLUSIVE
lock on the jobs table even with the column there). The lists are what the migrations
declare they make (`Migration.makes`); each name is looked up after `prefix`: the
queue's schema, quoted, and a dot (`QueueOptions.schema`), or nothing (the
`search_path` decides)."""

# --- Checks ------------------------------------------------------------------------------

CHECK_QUEUE = naming.statement(
    "SELECT id, name, args, status, error, run_at, started_at, created_at, updated_at, attempts, max_attempts, priority, timeout_ms, trace_context, result, unique_key, unique_for_ms, ahead, given_back, dependents, key, run_worker, run_attempt, run_host, run_pid, run_trace FROM {axa_queue} LIMIT 0"
)
"""Fails unless the jobs table has every column."""

CHECK_SCHEDULE = naming.statement(
    "SELECT name, due_at, last_job, interval_ms, seen_at, archived_at, created_at, updated_at, cron, timezone FROM {axa_schedule} LIMIT 0"
)
"""Fails unless the schedule table has every column."""

CHECK_ACTS = naming.statement(
    "SELECT id, job_id, job_name, act, attempts, by, reason, at, db_role FROM {axa_job_acts} LIMIT 0"
)
"""Fails unless the acts table has every column."""

CHECK_WORKERS = naming.statement(
    "SELECT id, host, pid, names, loops, running, version, started_at, seen_at, beat_ms FROM {axa_workers} LIMIT 0"
)
"""Fails unless the worker processes table has every column."""

CHECK_PAUSED = naming.statement("SELECT name, by, reason, at FROM {axa_paused} LIMIT 0")
"""Fails unless the paused names' table has every column (the claim reads it)."""

CHECK_HISTORY = naming.statement(
    "SELECT id, name, args, status, error, run_at, started_at, created_at, updated_at, attempts, max_attempts, priority, timeout_ms, trace_context, result, unique_key, unique_for_ms, ahead, given_back, moved_at, key, run_worker, run_attempt, run_host, run_pid FROM {axa_queue_history} LIMIT 0"
)
"""Fails unless the history table has every column."""

CHECK_ATTEMPTS = naming.statement(
    "SELECT job_id, attempt, worker, host, pid, started_at, ended_at, outcome, error_class, error FROM {axa_queue_attempts} LIMIT 0"
)
"""Fails unless the attempts table has every column (the endings write it)."""

CHECK_DEPS = naming.statement(
    "SELECT child, parent, position, on_parent_failure, done, parent_trace FROM {axa_queue_deps} LIMIT 0"
)
"""Fails unless the dependencies table has every column (the release trigger writes it)."""

CHECK_WORKFLOWS = naming.statement("SELECT workflow, job, position FROM {axa_workflows} LIMIT 0")
"""Fails unless the workflows table has every column."""

MISSING_TRIGGERS = naming.statement("""SELECT want FROM unnest(%s::text[]) AS want
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_trigger t
        WHERE t.tgrelid = to_regclass({'axa_job_acts'}) AND t.tgname = want
          AND t.tgenabled::text = 'A'
    )""")
"""The named triggers of `axa_job_acts` that are missing or not set to fire always."""

HAS_NOTIFY_TRIGGER = naming.statement("""SELECT EXISTS (SELECT 1 FROM pg_trigger
    WHERE tgrelid = to_regclass({'axa_queue'}) AND tgname = 'axa_queue_notify'
      AND tgenabled::text <> 'D') AS notifies""")
"""Whether inserts notify; without it workers fall back to polling."""


def expected(upto: int | None = None) -> Expectations:
    """What the migrations up to `upto` (default: all) make sure of."""
    found = Expectations()
    for migration in MIGRATIONS:
        if upto is None or migration.version <= upto:
            found += migration.makes
    return found


def statements_of(version: int | None = None) -> tuple[str, ...]:
    """The statements of migration `version` (its record last), or of every migration
    (`SETUP_STATEMENTS`). Raises `ValueError` for an unknown version."""
    if version is not None:
        for migration in MIGRATIONS:
            if migration.version == version:
                return migration.all_statements()
        raise ValueError(
            f"there is no schema version {version}: this code knows versions 1 to {VERSION}"
        )
    return SETUP_STATEMENTS


def recorded() -> Steps[int | None]:
    """The newest migration the database records, or `None` when it records none (set
    up before versions were recorded, by the crate, or not at all) or this role may not
    read them."""
    readable = yield from ask(Call(VERSION_READABLE, (), lambda rows, _n: rows[0].readable))
    if not readable:
        return None
    return (yield from ask(Call(RECORDED_VERSION, (), lambda rows, _n: int(rows[0].version))))


def missing_call(
    expectations: Expectations | None = None, schema: str | None = None
) -> Call[list[str]]:
    """The call that says what the migrations make that the schema lacks (`schema`, or
    else the one the connection's `search_path` reaches), one line each ("column
    axa_queue.priority"); empty when all is there. Reads only the catalogs."""
    wanted = expected() if expectations is None else expectations
    prefix = "" if schema is None else pgsql.Identifier(schema).as_string() + "."
    return Call(
        SETUP_MISSING,
        {**wanted.params(), "prefix": prefix},
        lambda rows, _n: [row.missing for row in rows],
    )


def needs(version: int, schema: str | None = None) -> Steps[bool]:
    """Whether schema version `version` is not recorded, or something it makes is
    missing (in `schema`, or else where the `search_path` reaches): whether a
    migration to it has work to do."""
    found = yield from recorded()
    if found is None or found < version:
        return True
    return bool((yield from ask(missing_call(expected(version), schema))))


def where() -> Steps[tuple[str, bool]]:
    """The schema the tables resolve to (`current_schema()`, which notifications name)
    and whether inserts notify (`HAS_NOTIFY_TRIGGER`): what `Queue.open` learns."""
    current = yield from ask(Call(sql.CURRENT_SCHEMA, (), lambda rows, _n: rows[0].current_schema))
    notifies = yield from ask(Call(HAS_NOTIFY_TRIGGER, (), lambda rows, _n: rows[0].notifies))
    return current or "public", bool(notifies)


async def recorded_version(conn: psycopg.AsyncConnection[Any]) -> int | None:
    """`recorded`, on `conn`."""
    return await run_async(conn, recorded())


async def missing(
    conn: psycopg.AsyncConnection[Any],
    expectations: Expectations | None = None,
    *,
    schema: str | None = None,
) -> list[str]:
    """`missing_call`, on `conn`."""
    return await run_async(conn, missing_call(expectations, schema))


def _to_apply(recorded: int | None, lacking: list[str]) -> list[Migration]:
    """The migrations setup runs: from the first not recorded or with objects missing,
    every one after it too (a later migration may remake what an earlier one makes, as
    17 does 14's trigger `axa_queue_release`: each is safe to repeat)."""
    gone = set(lacking)
    due = [m.version for m in MIGRATIONS if m.version > (recorded or 0) or m.makes.lines() & gone]
    return [m for m in MIGRATIONS if due and m.version >= due[0]]


async def setup(
    conn: psycopg.AsyncConnection[Any], lock_timeout: float = 5.0, schema: str | None = None
) -> None:
    """Bring the tables up to date, taking no lock at all when they are (the usual start
    of a worker); else apply what is missing under the setup lock, each statement
    waiting for a table lock no longer than `lock_timeout` seconds (0: as long as it
    takes). `schema` is `QueueOptions.schema`, if any (the connection names it in each
    statement). Raises `SchemaError` when a lock could not be had in time."""
    recorded = await recorded_version(conn)
    if recorded is not None and recorded >= VERSION and not await missing(conn, schema=schema):
        return
    current = "the setup lock"
    try:
        async with conn.transaction():
            await conn.execute(SETUP_LOCK_TIMEOUT, (f"{round(lock_timeout * 1000)}ms",))
            await conn.execute(TAKE_SETUP_LOCK, (SETUP_LOCK,))
            recorded = await recorded_version(conn)  # another process may have set up
            lacking = await missing(conn, schema=schema)
            if recorded is not None and recorded >= VERSION and not lacking:
                return
            if recorded is None and not lacking:  # set up before versions were recorded
                await conn.execute(SETUP_VERSION_TABLE)
                await conn.execute(SETUP_VERSION_READ)
                for migration in MIGRATIONS:
                    await conn.execute(migration.record)
                return
            for migration in _to_apply(recorded, lacking):
                for statement in migration.all_statements():
                    found = re.search(r"\b(?:ON|TABLE(?: IF NOT EXISTS)?)\s+(axa_\w+)", statement)
                    current = found[1] if found else current
                    await conn.execute(statement)
    except psycopg.errors.LockNotAvailable:
        raise SchemaError(
            f"could not set up the tables within {lock_timeout:g} s: another transaction "
            f"holds a lock on {current}; retry, or run `axa-queue setup` when the database "
            "is quiet (workers can then start with --no-setup)"
        ) from None


async def allowed_setup(
    conn: psycopg.AsyncConnection[Any], lock_timeout: float, schema: str | None = None
) -> None:
    """`setup`, or a `SchemaError` saying what to do when this role may not run it (the
    least-privilege role of docs/production.md may not)."""
    try:
        await setup(conn, lock_timeout, schema)
    except psycopg.errors.InsufficientPrivilege as error:
        raise SchemaError(
            f"this database role may not set the job queue's tables up "
            f"({error.diag.message_primary}): open the queue with setup=False (a worker: "
            "`axa-queue worker --no-setup`), which only checks the tables, and run "
            "`axa-queue setup` (or the statements `axa-queue sql` prints, in a migration) "
            "as the role that owns them"
        ) from error


async def check(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise `SchemaError` when the database records a version older than this code's,
    or lacks a table, a column or an acts trigger; change nothing. A newer version, or
    none recorded (a schema the crate or an older axa-queue made), is checked by its
    columns and triggers alone."""
    recorded = await recorded_version(conn)
    if recorded is not None and recorded < VERSION:
        raise SchemaError(
            f"the database is at schema version {recorded}, this code needs {VERSION}: "
            "run `axa-queue setup` (or the statements `axa-queue sql` prints, in a "
            "migration), then start the workers"
        )
    for statement, table in (
        (CHECK_QUEUE, "axa_queue"),
        (CHECK_SCHEDULE, "axa_schedule"),
        (CHECK_ACTS, "axa_job_acts"),
        (CHECK_WORKERS, "axa_workers"),
        (CHECK_PAUSED, "axa_paused"),
        (CHECK_HISTORY, "axa_queue_history"),
        (CHECK_ATTEMPTS, "axa_queue_attempts"),
        (CHECK_DEPS, "axa_queue_deps"),
        (CHECK_WORKFLOWS, "axa_workflows"),
    ):
        try:
            async with conn.transaction():
                await conn.execute(statement)
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as error:
            raise SchemaError(
                f"the job queue's table {table} is missing or out of date ({error.diag.message_primary}): "
                "run the setup statements (`axa-queue setup`, or `axa-queue sql` in a migration)"
            ) from None
    absent = await run_async(
        conn,
        Call(MISSING_TRIGGERS, (list(ACTS_TRIGGERS),), lambda rows, _n: [r.want for r in rows]),
    )
    if absent:
        raise SchemaError(
            f"the job queue is missing, or has turned off, the trigger(s) {', '.join(absent)} "
            "on axa_job_acts, so acts could be changed or not record their role: run the setup "
            "statements (`axa-queue setup`, or `axa-queue sql` in a migration)"
        )


# --- The demo's sandbox (`axa-queue demo --dsn`) ----------------------------------------
# Templates for `psycopg.sql.SQL(...).format(psycopg.sql.Identifier(name))`: the schema
# name goes in only as an identifier.

SANDBOX_CREATE = "CREATE SCHEMA {}"
"""Make the schema the demo runs in, on a database the user gave, so their queue is untouched."""

SANDBOX_DROP = "DROP SCHEMA IF EXISTS {} CASCADE"
"""Remove the demo's schema and everything in it when the demo ends."""
