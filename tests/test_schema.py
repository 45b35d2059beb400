"""The schema as ordered migrations with a recorded version: a fresh setup equals every
migration applied in order, from an empty database, from axa 0.1.0's table and from
the crate's own setup; the version is recorded; `check` and workers refuse a database
older than the code and accept a newer one, whose additions old statements ignore."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg.types.json import Jsonb

import axa_queue.schema
import seed_crate as crate
from axa_queue import SETUP_STATEMENTS, Queue, QueueOptions, SchemaError, sql
from axa_queue.cli import main
from axa_queue.schema import (
    ACTS_TRIGGERS,
    CHECK_ACTS,
    CHECK_ATTEMPTS,
    CHECK_DEPS,
    CHECK_HISTORY,
    CHECK_PAUSED,
    CHECK_QUEUE,
    CHECK_SCHEDULE,
    CHECK_WORKERS,
    CHECK_WORKFLOWS,
    MIGRATIONS,
    VERSION,
    expected,
    migrations,
    missing,
    recorded_version,
    statements_of,
)
from conftest import eventually, running, status_of
from test_compat import crate_claim, crate_enqueue, crate_setup

PACKAGE = Path(sql.__file__).resolve().parent.parent  # the package, `sql/` a folder of it

# --- what the catalogs hold ----------------------------------------------------------------

CATALOG = {
    "columns": """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
            pg_get_expr(d.adbin, d.adrelid), a.attnotnull, a.attidentity
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
          AND a.attnum > 0 AND NOT a.attisdropped""",
    "indexes": """SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema()""",
    "constraints": """SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid),
            k.convalidated
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND k.contype <> 'n'""",
    "triggers": """SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled::text
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND NOT t.tgisinternal""",
    "functions": """SELECT proname, pg_get_function_identity_arguments(oid), prosrc
        FROM pg_proc WHERE pronamespace = current_schema()::regnamespace""",
    "storage": """SELECT relname, reloptions FROM pg_class
        WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')""",
}


def catalog(admin: psycopg.Connection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Everything the schema holds, by kind, sorted, with the schema's name taken out."""
    schema = admin.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]

    def plain(value: Any) -> Any:
        return value.replace(f"{schema}.", "S.") if isinstance(value, str) else value

    return {
        kind: sorted(
            (tuple(plain(v) for v in row) for row in admin.execute(query).fetchall()),
            key=repr,
        )
        for kind, query in CATALOG.items()
    }


def reset(admin: psycopg.Connection[Any]) -> None:
    """Empty the test's schema."""
    for table in (
        "axa_queue", "axa_queue_history", "axa_schedule", "axa_job_acts", "axa_schema_version"
    ):  # fmt: skip
        admin.execute(psycopg.sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
            psycopg.sql.Identifier(table)
        ))  # fmt: skip
    for function in ("axa_queue_notify", "axa_job_acts_refuse", "axa_job_acts_role"):
        admin.execute(psycopg.sql.SQL("DROP FUNCTION IF EXISTS {}() CASCADE").format(
            psycopg.sql.Identifier(function)
        ))  # fmt: skip


def apply_in_order(admin: psycopg.Connection[Any], upto: int = VERSION) -> None:
    """Apply migrations 1 to `upto`, each in its own transaction, as a migration tool would."""
    for migration in MIGRATIONS:
        if migration.version <= upto:
            with admin.transaction():
                for statement in migration.all_statements():
                    admin.execute(statement)


def reference(admin: psycopg.Connection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """The catalogs of an empty schema with every migration applied in order (the schema
    is left that way)."""
    reset(admin)
    apply_in_order(admin)
    return catalog(admin)


def without_versions(found: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """The catalogs without the version table."""
    return {
        k: [r for r in v if not str(r[0]).startswith("axa_schema_version")]
        for k, v in found.items()
    }


def versions(admin: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return admin.execute(
        "SELECT version, name, applied_at FROM axa_schema_version ORDER BY version"
    ).fetchall()


def cli(*args: str, dsn: str | None = None) -> Result:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)


# --- a fresh setup equals the migrations ---------------------------------------------------


async def test_a_fresh_setup_equals_every_migration_applied_in_order_from_an_empty_database(
    make_queue, admin
) -> None:
    wanted = reference(admin)
    reset(admin)
    await make_queue()
    assert catalog(admin) == wanted


async def test_a_setup_over_axa_010s_table_equals_every_migration_applied_in_order(
    make_queue, admin
) -> None:
    wanted = reference(admin)
    reset(admin)
    for statement in crate.V010_SETUP_STATEMENTS:
        admin.execute(statement)
    kept = uuid.uuid4()
    admin.execute(crate.V010_ENQUEUE, crate.params(kept, "Old", Jsonb({})))
    await make_queue()
    assert catalog(admin) == wanted
    assert status_of(admin, kept) == ("queued", None, 0)


async def test_a_setup_over_the_crates_own_setup_equals_every_migration_applied_in_order(
    make_queue, admin
) -> None:
    wanted = reference(admin)
    reset(admin)
    crate_setup(admin)
    await make_queue()
    assert catalog(admin) == wanted


async def test_the_crates_setup_after_ours_changes_nothing(make_queue, admin) -> None:
    await make_queue()
    before = catalog(admin)
    crate_setup(admin)
    assert catalog(admin) == before


def test_each_migration_declares_exactly_what_it_makes(dsn: str, admin) -> None:
    reset(admin)

    async def lacking(upto: int) -> set[str]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return set(await missing(conn, expected(upto)))

    for migration in MIGRATIONS:
        assert asyncio.run(lacking(migration.version)) == migration.makes.lines()
        apply_in_order(admin, migration.version)
        assert asyncio.run(lacking(migration.version)) == set(), migration.name
    # And nothing is made that no migration declares.
    made = catalog(admin)
    declared = expected()
    assert {r[0] for r in made["storage"]} == {*declared.tables, "axa_schema_version"}
    assert {(r[0], r[1]) for r in made["columns"] if r[0] != "axa_schema_version"} == set(
        declared.columns
    )
    constraints = {(r[0], r[1]) for r in made["constraints"]}
    assert constraints - {("axa_schema_version", "axa_schema_version_pkey")} == set(
        declared.constraints
    )
    backing = {name for _, name in constraints}
    assert {r[0] for r in made["indexes"]} - backing == set(declared.indexes)
    assert {(r[0], r[1]) for r in made["triggers"]} == {(t, g) for t, g, _ in declared.triggers}
    assert {r[0] for r in made["functions"]} == {f.split("(")[0] for f, _ in declared.functions}


def test_a_later_migrations_storage_setting_is_the_one_expected() -> None:
    # Migration 14 made the dependencies 70% full, migration 24 made them 40%: a database
    # at version 23 is expected at 70, one at 24 at 40, never both (which no table has).
    def deps(upto: int | None = None) -> list[str]:
        return [
            s for t, settings in expected(upto).storage if t == "axa_queue_deps" for s in settings
        ]

    assert deps(23) == ["fillfactor=70"]
    assert deps() == ["fillfactor=40"]
    assert (
        "axa_queue",
        (
            "fillfactor=80",
            "autovacuum_vacuum_scale_factor=0.02",
            "autovacuum_analyze_scale_factor=0.02",
        ),
    ) in expected().storage


def test_the_checked_columns_are_the_declared_ones() -> None:
    checked = {}
    for statement in (
        CHECK_QUEUE,
        CHECK_SCHEDULE,
        CHECK_ACTS,
        CHECK_WORKERS,
        CHECK_PAUSED,
        CHECK_HISTORY,
        CHECK_ATTEMPTS,
        CHECK_DEPS,
        CHECK_WORKFLOWS,
    ):
        found = re.fullmatch(r"SELECT (.+) FROM (\w+) LIMIT 0", statement.strip(), re.S)
        assert found is not None
        checked[found[2]] = [c.strip() for c in found[1].split(",")]
    declared: dict[str, list[str]] = {}
    # The rate limits' slots are left to the recorded version (migration 7): a role that
    # never claims a rate-limited name (the dashboard) needs no grant on them. So are the
    # steps (migration 17): the dashboard is granted their columns but the result.
    for table, column in expected().columns:
        if table in ("axa_rate_slots", "axa_queue_steps"):
            continue
        declared.setdefault(table, []).append(column)
    assert checked == declared


def test_setups_catalog_read_requires_the_acts_triggers_the_check_requires() -> None:
    # Why `Queue.open` with setup checks nothing more: what `check` reads is all in
    # what setup's read (`missing`) requires: the tables and columns (the test above),
    # and the acts' triggers, each firing always.
    declared = expected()
    assert set(ACTS_TRIGGERS) <= {g for t, g, always in declared.triggers if always}


async def test_opening_with_setup_checks_nothing_more_and_without_it_checks(
    dsn: str, monkeypatch
) -> None:
    checked: list[str] = []

    async def check(conn: Any) -> None:
        checked.append(conn.info.dbname)

    monkeypatch.setattr(axa_queue.schema, "check", check)
    async with Queue(dsn) as queue:
        assert queue.is_open
    assert checked == []
    queue = await Queue(dsn).open(setup=False)
    await queue.close()
    assert len(checked) == 1


def test_every_migration_ends_by_recording_its_own_version() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, VERSION + 1))
    for migration in MIGRATIONS:
        assert migration.all_statements()[-1] == migration.record
        assert f"VALUES ({migration.version}, " in migration.record
        assert migration.name.replace("'", "''") in migration.record
    assert migrations.SETUP_VERSION_TABLE in MIGRATIONS[0].statements
    assert tuple(s for m in MIGRATIONS for s in m.all_statements()) == SETUP_STATEMENTS


def test_every_named_statement_of_the_schema_package_is_sent() -> None:
    import axa_queue.schema

    code = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    unsent = []
    for module in (migrations, axa_queue.schema):
        for name, value in vars(module).items():
            if not (name.isupper() and isinstance(value, str)) or value in SETUP_STATEMENTS:
                continue
            if not re.search(rf"(?<![\w\"]){name}(?![\w\"])(?!:| =)", code):
                unsent.append(name)
    assert unsent == []


# --- the recorded version ------------------------------------------------------------------


async def test_setup_records_the_version_of_every_migration(dsn: str, make_queue, admin) -> None:
    await make_queue()
    assert [(v, n) for v, n, _ in versions(admin)] == [(m.version, m.name) for m in MIGRATIONS]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await recorded_version(conn) == VERSION


async def test_setup_twice_changes_nothing(make_queue, admin) -> None:
    queue = await make_queue()
    before, recorded = catalog(admin), versions(admin)
    await queue.setup()
    await make_queue()
    assert catalog(admin) == before
    assert versions(admin) == recorded, "not even the time each migration was applied"


async def test_a_database_set_up_before_versions_were_recorded_gets_them_without_ddl_on_its_tables(
    dsn: str, make_queue, admin
) -> None:
    await make_queue()
    admin.execute("DROP TABLE axa_schema_version")  # as an axa-queue before versions left it
    before = catalog(admin)
    await make_queue(setup=False)  # recognised as complete: workers keep starting
    app = await psycopg.AsyncConnection.connect(dsn)
    try:
        # An application's open transaction holds a lock every ALTER TABLE would wait for.
        await app.execute("SELECT count(*) FROM axa_queue, axa_schedule, axa_job_acts")
        await asyncio.wait_for(make_queue(setup_lock_timeout=0.2), 30)
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    finally:
        await app.close()
    assert [v for v, _, _ in versions(admin)] == [m.version for m in MIGRATIONS]
    assert without_versions(catalog(admin)) == without_versions(before)


# --- older and newer databases -------------------------------------------------------------


def test_check_says_the_database_is_at_n_and_this_code_needs_m_when_older(dsn: str, admin) -> None:
    reset(admin)
    apply_in_order(admin, upto=VERSION - 1)
    message = (
        f"the database is at schema version {VERSION - 1}, this code needs {VERSION}: "
        "run `axa-queue setup`"
    )
    with pytest.raises(SchemaError) as refused:
        asyncio.run(Queue(dsn).open(setup=False))
    assert str(refused.value).startswith(message)
    checked = cli("check", dsn=dsn)
    assert checked.exit_code == 1
    assert checked.stderr.startswith(f"Error: {message}")
    assert cli("setup", dsn=dsn).exit_code == 0
    assert cli("check", dsn=dsn).exit_code == 0


WORKER_MODULE = """
from axa_queue import Queue

queue = Queue()

@queue.handler("Quick")
async def quick(args):
    pass
"""


def test_a_worker_refuses_to_start_on_a_schema_older_than_its_code(
    dsn: str, admin, tmp_path: Path, monkeypatch
) -> None:
    reset(admin)
    apply_in_order(admin, upto=VERSION - 1)
    name = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(WORKER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    refused = cli("worker", f"{name}:queue", "--no-setup", dsn=dsn)
    assert refused.exit_code == 1, refused.output
    assert refused.stderr.startswith(
        f"Error: the database is at schema version {VERSION - 1}, this code needs {VERSION}"
    )


async def test_a_schema_newer_than_the_code_is_accepted_and_old_statements_still_run_on_it(
    dsn: str, make_queue, admin
) -> None:
    await make_queue()
    # A later release's migration: it only adds (a column with a default, an index).
    with admin.transaction():
        admin.execute("ALTER TABLE axa_queue ADD COLUMN IF NOT EXISTS later TEXT DEFAULT 'x'")
        admin.execute("CREATE INDEX IF NOT EXISTS axa_queue_later ON axa_queue (later)")
        admin.execute(
            "INSERT INTO axa_schema_version (version, name) VALUES (%s, 'a later release')",
            (VERSION + 1,),
        )
    before = catalog(admin)
    app = await psycopg.AsyncConnection.connect(dsn)
    try:
        await app.execute("SELECT count(*) FROM axa_queue")  # setup must not need a lock
        queue = await asyncio.wait_for(make_queue(setup_lock_timeout=0.2), 30)
        await make_queue(setup=False)
    finally:
        await app.close()
    assert catalog(admin) == before, "this code's setup leaves the newer schema alone"
    # This code's statements (enqueue, exchange, acts) and the crate's run on it.
    ours = await queue.enqueue("Ours", {})
    theirs = crate_enqueue(admin, "Theirs", {"n": 1})
    queue.handle("Ours", lambda args: None)
    queue.handle("Theirs", lambda args: None)
    async with running(queue):
        await eventually(lambda: status_of(admin, ours)[0] == "completed")
        await eventually(lambda: status_of(admin, theirs)[0] == "completed")
    claimed = crate_enqueue(admin, "ForTheCrate", {})
    assert crate_claim(admin, "ForTheCrate") == (claimed, "ForTheCrate", {}, 1, None, None)
    admin.execute(crate.FINISH, crate.params(claimed, 1, "completed", None))
    assert status_of(admin, claimed)[0] == "completed"
    assert admin.execute("SELECT count(*) FROM axa_queue WHERE later = 'x'").fetchone() == (3,), (
        "the new column fills itself for old inserts"
    )


# --- the statements of one version ---------------------------------------------------------


def test_sql_version_prints_one_migrations_statements_and_all_of_them_in_order_set_up(
    dsn: str, admin
) -> None:
    reset(admin)
    printed = []
    for migration in MIGRATIONS:
        result = cli("sql", "--version", str(migration.version))
        assert result.exit_code == 0, result.output
        assert migration.record in result.stdout
        assert all(m.record not in result.stdout for m in MIGRATIONS if m is not migration)
        printed.append(result.stdout)
    for text in printed:
        admin.execute(text)
    assert cli("check", dsn=dsn).exit_code == 0
    assert [v for v, _, _ in versions(admin)] == [m.version for m in MIGRATIONS]
    unknown = cli("sql", "--version", str(VERSION + 1))
    assert unknown.exit_code == 2
    with pytest.raises(ValueError, match=f"no schema version {VERSION + 1}"):
        statements_of(VERSION + 1)
    assert statements_of() == SETUP_STATEMENTS


async def test_a_queue_given_its_schema_reads_the_version_there(
    database_url: str, schema: str, admin
) -> None:
    # An empty search_path: the version, like every table, is found by the schema's name.
    dsn = psycopg.conninfo.make_conninfo(
        database_url, options="-c search_path=", application_name=schema
    )
    async with Queue(dsn, QueueOptions(schema=schema)):
        pass
    assert [v for v, _, _ in versions(admin)] == [m.version for m in MIGRATIONS]
    admin.execute("DELETE FROM axa_schema_version WHERE version = %s", (VERSION,))
    with pytest.raises(SchemaError, match=f"at schema version {VERSION - 1}"):
        await Queue(dsn, QueueOptions(schema=schema)).open(setup=False)
