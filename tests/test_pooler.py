"""Behind PgBouncer: `QueueOptions(pooler=...)` and `QueueOptions(schema=...)`.

The tests that need a pooler run against a real PgBouncer (tests/pgbouncer.py), once in
session mode and once in transaction mode; the others check the same options on a
direct connection, or without a database.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import pgbouncer
from axa_queue import JobState, NewJob, Queue, QueueOptions, Schedule, sql
from axa_queue import schema as axa_schema
from axa_queue.acts import cancel
from axa_queue.cli import main
from axa_queue.errors import OptionsError
from axa_queue.schema import MISSING_TRIGGERS, migrations
from conftest import FAST, eventually, running, status_of

LISTEN_WARNING = "LISTEN cannot pass a transaction pooler"


SETTINGS_NOW = "SELECT current_setting('jit'), current_setting('plan_cache_mode')"
"""The two session settings the queue may set, as a connection sees them now."""


def through(bouncer: pgbouncer.PgBouncer, schema: str, **options: Any) -> QueueOptions:
    """Fast options for a queue behind `bouncer`, on the test's schema."""
    return QueueOptions(**{**FAST, "pooler": bouncer.mode, "schema": schema, **options})


def task_names() -> set[str]:
    return {task.get_name() for task in asyncio.all_tasks()}


# --- item 16: what a transaction pooler cannot carry is turned off ---------------------------


async def test_concurrent_single_enqueues_through_pgbouncer_all_succeed(
    bounced: str, bouncer: pgbouncer.PgBouncer, schema: str
) -> None:
    # Without pooler="transaction", about half of these fail in transaction mode with
    # DuplicatePreparedStatement or InvalidSqlStatementName (psycopg prepares a
    # statement after 5 runs, on a server connection other clients then get).
    queue = Queue(bounced, through(bouncer, schema, pool_size=8))
    async with queue:

        async def enqueuer(n: int) -> None:
            for i in range(40):
                await queue.enqueue("noted", {"enqueuer": n, "i": i})

        await asyncio.gather(*(enqueuer(n) for n in range(8)))
        assert (await queue.counts()).ready == 320


async def test_a_worker_behind_pgbouncer_runs_every_job_and_listens_only_in_session_mode(
    bounced: str,
    bouncer: pgbouncer.PgBouncer,
    schema: str,
    admin: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from axa_queue.db import pooler

    monkeypatch.setattr(pooler, "_told", set())  # the warning is given once per process
    queue = Queue(bounced, through(bouncer, schema))
    done: list[int] = []

    @queue.handler("noted")
    async def noted(args: dict[str, int]) -> None:
        done.append(args["i"])

    async with queue:
        ids = await queue.enqueue_all([NewJob("noted", {"i": i}) for i in range(30)])
        for _ in range(2):  # a second run warns no more
            async with running(queue):
                await eventually(lambda: len(done) >= 30)
                await eventually(lambda: "axa-queue-exchange" in task_names())
                listening = "axa-queue-listener" in task_names()
            assert listening == (bouncer.mode == "session")
    assert sorted(done) == list(range(30))
    assert {status_of(admin, job_id)[0] for job_id in ids} == {"completed"}
    warnings = [r for r in caplog.records if LISTEN_WARNING in r.getMessage()]
    assert len(warnings) == (1 if bouncer.mode == "transaction" else 0)


async def test_a_worker_behind_a_transaction_pooler_with_listen_off_gives_no_warning(
    start_bouncer: Callable[..., pgbouncer.PgBouncer],
    schema: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from axa_queue.db import pooler

    monkeypatch.setattr(pooler, "_told", set())
    bouncer = start_bouncer("transaction")
    queue = Queue(bouncer.dsn(), through(bouncer, schema, listen=False))
    ran = asyncio.Event()

    @queue.handler("noted")
    async def noted(args: Any) -> None:
        ran.set()

    async with queue:
        await queue.enqueue("noted")
        async with running(queue):
            await asyncio.wait_for(ran.wait(), 15)
    assert not [r for r in caplog.records if LISTEN_WARNING in r.getMessage()]


def test_behind_a_transaction_pooler_nothing_is_prepared_on_the_server() -> None:
    from axa_queue.db import pooler

    assert pooler.connect_kwargs(QueueOptions())["prepare_threshold"] == 5
    assert pooler.connect_kwargs(QueueOptions(pooler="session"))["prepare_threshold"] == 5
    assert pooler.connect_kwargs(QueueOptions(prepare=False))["prepare_threshold"] is None
    for sync in (False, True):
        kwargs = pooler.connect_kwargs(QueueOptions(pooler="transaction"), sync=sync)
        assert kwargs["prepare_threshold"] is None
        assert "cursor_factory" not in kwargs  # no schema given: the search_path decides
    # PgBouncer 1.21+ with max_prepared_statements carries them: then say so.
    given = QueueOptions(pooler="transaction", prepare=True)
    assert pooler.connect_kwargs(given)["prepare_threshold"] == 5


def test_the_pooler_and_the_schema_are_read_from_the_environment_when_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert QueueOptions().resolved_pooler() == "direct"
    assert QueueOptions().resolved_schema() is None
    monkeypatch.setenv("AXA_QUEUE_POOLER", "Transaction")
    monkeypatch.setenv("AXA_QUEUE_SCHEMA", "jobs")
    assert QueueOptions().resolved_pooler() == "transaction"
    assert QueueOptions().resolved_schema() == "jobs"
    given = QueueOptions(pooler="session", schema="other")
    assert (given.resolved_pooler(), given.resolved_schema()) == ("session", "other")
    monkeypatch.setenv("AXA_QUEUE_POOLER", "pgbouncer")
    with pytest.raises(OptionsError, match="AXA_QUEUE_POOLER to be one of direct, session"):
        QueueOptions().resolved_pooler()
    monkeypatch.setenv("AXA_QUEUE_SCHEMA", 'a"; DROP')
    with pytest.raises(OptionsError, match="AXA_QUEUE_SCHEMA to be a schema name"):
        QueueOptions().resolved_schema()


@pytest.mark.parametrize(
    "options",
    [
        {"pooler": "pgbouncer"},
        {"pooler": True},
        {"prepare": "yes"},
        {"schema": ""},
        {"schema": "Jobs"},
        {"schema": "1jobs"},
        {"schema": "jobs.queue"},
        {"schema": "jobs'"},
        {"schema": "x" * 64},
        {"schema": 7},
    ],
)
def test_a_bad_pooler_or_schema_is_refused_naming_the_option(options: dict[str, Any]) -> None:
    with pytest.raises(OptionsError, match=f"expected {next(iter(options))} to be"):
        QueueOptions(**options)


# --- item 17: no session state left on a shared server connection ------------------------


async def test_behind_a_transaction_pooler_the_queue_leaves_no_session_settings_behind(
    start_bouncer: Callable[..., pgbouncer.PgBouncer], database_url: str, schema: str
) -> None:
    bouncer = start_bouncer("transaction", pool_size=1)  # one server connection for all
    with psycopg.connect(database_url) as direct:
        defaults = [direct.execute(SETTINGS_NOW).fetchone()]

    def shown() -> list[Any]:
        with psycopg.connect(bouncer.dsn(), autocommit=True) as other:
            return [other.execute(SETTINGS_NOW).fetchone()]

    queue = Queue(bouncer.dsn(), through(bouncer, schema))
    ran = asyncio.Event()

    @queue.handler("noted")
    async def noted(args: Any) -> None:
        ran.set()

    async with queue:
        await queue.enqueue("noted")
        async with running(queue):  # the pool's and the exchange loop's connections
            await asyncio.wait_for(ran.wait(), 15)
            assert await asyncio.to_thread(shown) == defaults
        with queue.sync() as sync:
            # On a thread, as an async app must: one server connection for all, and the
            # async pool's connections need this event loop to finish their statements.
            await asyncio.to_thread(sync.enqueue, "noted")
        assert await asyncio.to_thread(shown) == defaults


async def test_a_direct_queue_keeps_its_session_settings_for_the_hot_statements(
    make_queue: Callable[..., Any],
) -> None:
    queue = await make_queue()
    async with queue.pool.connection() as conn:
        jit = await (await conn.execute("SHOW jit")).fetchone()
        mode = await (await conn.execute("SHOW plan_cache_mode")).fetchone()
    assert (jit, mode) == (("off",), ("force_generic_plan",))


# --- item 18: a schema option that works behind a pooler --------------------------------------


def test_pgbouncer_refuses_a_search_path_in_the_startup_options(
    bouncer: pgbouncer.PgBouncer, schema: str
) -> None:
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
        psycopg.connect(bouncer.dsn(options=f"-c search_path={schema}"))


async def test_a_queue_given_a_schema_works_through_pgbouncer(
    bounced: str, bouncer: pgbouncer.PgBouncer, schema: str, admin: psycopg.Connection[Any]
) -> None:
    queue = Queue(bounced, through(bouncer, schema))
    async with queue:
        assert queue.schema == schema
        job_id = await queue.enqueue("noted", {"secret": "x"}, run_in=3600)
        async with queue.connection() as conn:
            result = await cancel(conn, job_id, by="ops", reason="not needed")
        assert result.applied
        assert [act.kind.value for act in await queue.acts(job_id)] == ["cancelled"]
        assert (await queue.job(job_id)) is not None
        assert (await queue.counts()).cancelled == 1
    tables = admin.execute(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_name LIKE 'axa%%' AND table_schema = %s ORDER BY table_name",
        (schema,),
    ).fetchall()
    assert tables == [
        (schema, "axa_job_acts"),
        (schema, "axa_paused"),
        (schema, "axa_queue"),
        (schema, "axa_queue_attempts"),
        (schema, "axa_queue_deps"),
        (schema, "axa_queue_history"),
        (schema, "axa_queue_steps"),
        (schema, "axa_rate_slots"),
        (schema, "axa_schedule"),
        (schema, "axa_schema_version"),
        (schema, "axa_workers"),
        (schema, "axa_workflows"),
    ]


async def test_a_queue_given_a_schema_sends_the_callers_own_statements_as_written(
    database_url: str, schema: str
) -> None:
    # queue.connection() is the caller's: its text (here a literal naming a table) must
    # reach the server unchanged; the schema comes from the transaction's search_path.
    dsn = psycopg.conninfo.make_conninfo(
        database_url, options="-c search_path=", application_name=schema
    )
    note = "moved rows out of axa_queue today"
    queue = Queue(dsn, QueueOptions(**{**FAST, "schema": schema}))
    async with queue:
        job_id = await queue.enqueue("noted", {})
        async with queue.connection() as conn:
            cursor = await conn.execute("SELECT %s::text || ' axa_queue' AS said", (note,))
            assert (await cursor.fetchone()) == (f"{note} axa_queue",)
            cursor = await conn.execute("SELECT 'axa_queue'::text, current_setting('search_path')")
            assert (await cursor.fetchone()) == ("axa_queue", schema)
            await cancel(conn, job_id, by="ops", reason="not needed")
        assert (await queue.job(job_id)).state == JobState.CANCELLED  # type: ignore[union-attr]
        with queue.sync() as sync, sync.connection() as conn:
            row = conn.execute("SELECT 'axa_queue'::text, current_setting('search_path')")
            assert row.fetchone() == ("axa_queue", schema)


async def test_every_statement_of_a_queue_given_a_schema_names_it(
    database_url: str, schema: str, admin: psycopg.Connection[Any]
) -> None:
    # An empty search_path: any statement that did not name the schema would fail.
    dsn = psycopg.conninfo.make_conninfo(
        database_url, options="-c search_path=", application_name=schema
    )
    queue = Queue(dsn, QueueOptions(**{**FAST, "schema": schema}))
    ran = asyncio.Event()

    @queue.handler("noted")
    async def noted(args: Any) -> None:
        ran.set()

    @queue.handler("broken")
    async def broken(args: Any) -> None:
        raise RuntimeError("no")

    queue.schedule(Schedule.every("ticked", 3600, NewJob("noted", {})))
    async with queue:
        assert queue.notifies
        await queue.setup()
        await queue.check()
        await queue.ping()
        failing = await queue.enqueue("broken")
        later = await queue.enqueue_all([NewJob("noted", {"n": 1}, run_in=3600)])
        async with running(queue):
            await asyncio.wait_for(ran.wait(), 15)
            await eventually(lambda: status_of(admin, failing)[0] == "failed")
        async with queue.connection() as conn:
            await cancel(conn, later[0], by="ops", reason="not needed")
        assert len(await queue.acts(later[0])) == 1
        assert (await queue.counts()).failed == 1
        assert set(await queue.counts_by_name()) == {"noted", "broken"}
        assert len(await queue.jobs()) == 3
        assert [s.name for s in await queue.schedules()] == ["ticked"]
        assert await queue.recover_stale(dry_run=True) == []
        assert await queue.recover_stale() == []
        assert await queue.purge(dry_run=True) == 0
        assert await queue.purge() == 0
        assert await queue.archive_schedules() == 0
        with queue.sync() as sync:
            sync.enqueue("noted")
            assert sync.counts().ready == 1
    assert status_of(admin, failing)[1] is not None


SEARCH_PATH_SET = {
    "SETUP_RELEASE_FUNCTION",
    "SETUP_RELEASE_ALL_FUNCTION",
    "SETUP_RELEASE_TRACED_FUNCTION",
    "SETUP_RELEASE_BATCHED_FUNCTION",
}
"""The functions whose `search_path` the setup sets to the queue's schema."""


def test_in_schema_names_the_tables_and_functions_and_leaves_channel_and_settings() -> None:
    bare = re.compile(
        r"(?<![\w.\"'])(axa_queue|axa_schedule|axa_job_acts|axa_schema_version|axa_workers|axa_rate_slots)(?![\w'.])"
    )
    for module in (sql, axa_schema, migrations):
        for name in dir(module):
            statement = getattr(module, name)
            if not name.isupper() or not isinstance(statement, str) or name == "CHANNEL":
                continue
            named = sql.in_schema(statement, "jobs")
            if name in SEARCH_PATH_SET:
                # Its body names the tables bare, the same in every schema: the function
                # runs with its search_path set to its own schema (`SETUP_RELEASE_PATH`).
                named = named.replace(migrations.body_of(named), "")
            left = [m for m in bare.finditer(named) if named[: m.start()][-7:] != "LISTEN "]
            assert not left, (name, named)
    assert sql.in_schema(sql.LISTEN, "jobs") == sql.LISTEN
    function = sql.in_schema(migrations.SETUP_NOTIFY_FUNCTION, "jobs")
    assert "pg_notify('axa_queue', TG_TABLE_SCHEMA" in function
    assert "current_setting('axa_queue.notify', true)" in function
    assert 'FUNCTION "jobs".axa_queue_notify()' in function
    trigger = sql.in_schema(migrations.SETUP_NOTIFY_TRIGGER, "jobs")
    assert "TRIGGER axa_queue_notify\n" in trigger  # a trigger's name takes no schema
    assert 'EXECUTE FUNCTION "jobs".axa_queue_notify()' in trigger
    assert "to_regclass('\"jobs\".axa_job_acts')" in sql.in_schema(MISSING_TRIGGERS, "jobs")
    assert "WHERE axa_schedule.archived_at" in sql.in_schema(sql.SCHEDULES_SEEN, "jobs")


def test_in_schema_fills_each_statements_template_and_quotes_any_schema_name() -> None:
    for module in (sql, axa_schema, migrations):
        for name in dir(module):
            statement = getattr(module, name)
            if name.isupper() and isinstance(statement, str):
                assert "{axa_" not in statement and "{'axa_" not in statement, name
                assert "{axa_" not in sql.in_schema(statement, "jobs"), name
    odd = sql.in_schema(sql.FAIL_UNCLAIMABLE, 'we"ird')
    assert 'UPDATE "we""ird".axa_queue' in odd
    assert '\'"we""ird".axa_queue\'::regclass' in odd
    assert sql.in_schema("SELECT count(*) FROM axa_queue", "jobs") == (
        "SELECT count(*) FROM axa_queue"
    ), "only the package's statements have a template: any other text passes as it is"
    body = migrations.body_of(migrations.SETUP_ROOM_FUNCTION)
    assert migrations.body_of(sql.in_schema(migrations.SETUP_ROOM_FUNCTION, "jobs")) == body
    assert 'FUNCTION "jobs".axa_queue_room(' in sql.in_schema(
        migrations.SETUP_ROOM_FUNCTION, "jobs"
    )


# --- the command line --------------------------------------------------------------------------


def cli(*args: str) -> Any:
    runner = CliRunner(env={"AXA_QUEUE_DSN": None, "DATABASE_URL": None})
    return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_the_cli_works_through_pgbouncer_with_pooler_and_schema(
    mode: str, start_bouncer: Callable[..., pgbouncer.PgBouncer], schema: str
) -> None:
    # A PgBouncer of its own: PgBouncer 1.18 (Debian 12's) can hand a new client a server
    # connection that an earlier test's ending touched (a late cancel, a session ended),
    # and the client's first SET then fails with "invalid server parameter" (fixed in
    # PgBouncer 1.24, pgbouncer/pgbouncer#298).
    bouncer = start_bouncer(mode)
    bounced = bouncer.dsn(application_name=schema)
    where = ("--dsn", bounced, "--pooler", bouncer.mode, "--schema", schema)
    result = cli("setup", *where)
    assert result.exit_code == 0, result.output
    assert f"in schema {schema}" in result.output
    assert cli("check", *where).exit_code == 0
    result = cli("enqueue", "noted", "--args", '{"n": 1}', *where)
    assert result.exit_code == 0, result.output
    job_id = uuid.UUID(result.stdout.strip())
    result = cli("counts", "--json", *where)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ready"] == 1
    assert cli("show", str(job_id), *where).exit_code == 0


def test_the_cli_refuses_a_bad_schema_in_one_line() -> None:
    result = cli("counts", "--dsn", "postgresql://nowhere/db", "--schema", "Bad-Name")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("Error: expected schema to be a schema name")
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_sql_command_can_name_a_schema_for_a_migration() -> None:
    result = cli("sql", "--schema", "jobs")
    assert result.exit_code == 0
    assert 'CREATE TABLE IF NOT EXISTS "jobs".axa_queue (' in result.output
    assert "CREATE TABLE IF NOT EXISTS axa_queue (" in cli("sql").output


def test_a_queue_reads_its_pooler_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from axa_queue.db import pooler

    monkeypatch.setattr(pooler, "_told", set())
    monkeypatch.setenv("AXA_QUEUE_POOLER", "transaction")
    queue = Queue("postgresql://nowhere/db")
    assert queue.connector.kwargs()["prepare_threshold"] is None
    with caplog.at_level(logging.WARNING, logger="axa_queue"):
        assert not pooler.listens(queue.options)
        assert not pooler.listens(queue.options)
    assert len([r for r in caplog.records if LISTEN_WARNING in r.getMessage()]) == 1


MODULE = """
from axa_queue import Queue, QueueOptions

queue = Queue(options=QueueOptions(poll_interval=0.1))


@queue.handler("noted")
async def noted(args: object) -> None:
    pass
"""


def test_worker_processes_run_jobs_through_pgbouncer_with_pooler_and_schema(
    bounced: str,
    bouncer: pgbouncer.PgBouncer,
    schema: str,
    admin: psycopg.Connection[Any],
    tmp_path: Path,
) -> None:
    (tmp_path / "pooled_jobs.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    for name in ("AXA_QUEUE_DSN", "DATABASE_URL", "AXA_QUEUE_POOLER", "AXA_QUEUE_SCHEMA"):
        env.pop(name, None)
    command = [sys.executable, "-m", "axa_queue.cli", "worker", "pooled_jobs:queue"]
    command += ["--processes", "2", "--log-format", "json", "--dsn", bounced]
    command += ["--pooler", bouncer.mode, "--schema", schema]
    process = subprocess.Popen(command, env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr or ()), daemon=True)
    reader.start()
    try:
        # The supervisor sets the tables up in the schema before any child starts.
        def set_up() -> bool:
            found = admin.execute("SELECT to_regclass(%s)", (f"{schema}.axa_queue",)).fetchone()
            return process.poll() is None and found is not None and found[0] is not None

        deadline = time.monotonic() + 30
        while not set_up():
            assert process.poll() is None, "the worker exited early"
            assert time.monotonic() < deadline, "no tables before the deadline"
            time.sleep(0.05)
        queue = Queue(bounced, through(bouncer, schema))

        async def enqueue() -> list[uuid.UUID]:
            async with queue:
                return await queue.enqueue_all([NewJob("noted", {"n": n}) for n in range(20)])

        ids = asyncio.run(enqueue())
        deadline = time.monotonic() + 30
        while {status_of(admin, job_id)[0] for job_id in ids} != {"completed"}:
            assert process.poll() is None, "the worker exited early"
            assert time.monotonic() < deadline, "jobs not done before the deadline"
            time.sleep(0.05)
        while sum('"worker started"' in line for line in list(lines)) < 2:
            assert process.poll() is None, "the worker exited early"
            assert time.monotonic() < deadline, "not every process started"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(5)
    errors = "".join(lines)
    assert process.returncode == 0, errors
    assert (LISTEN_WARNING in errors) == (bouncer.mode == "transaction")


async def test_behind_a_session_pooler_a_notification_naming_the_schema_wakes_the_worker(
    start_bouncer: Callable[..., pgbouncer.PgBouncer],
    schema: str,
    admin: psycopg.Connection[Any],
) -> None:
    bouncer = start_bouncer("session")
    # Polls an hour apart: only a notification can start the second job in time.
    queue = Queue(
        bouncer.dsn(application_name=schema), through(bouncer, schema, poll_interval=3600)
    )
    ran: list[int] = []

    @queue.handler("noted")
    async def noted(args: dict[str, int]) -> None:
        ran.append(args["n"])

    def listening() -> bool:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'idle' "
            "AND application_name = %s",
            (sql.LISTEN, schema),
        ).fetchone()
        return row is not None and row[0] > 0

    async with queue, running(queue):
        await eventually(listening)
        await queue.enqueue("noted", {"n": 1})
        await eventually(lambda: ran == [1])
        await queue.enqueue("noted", {"n": 2})
        await eventually(lambda: ran == [1, 2])


def test_the_harness_starts_pgbouncer_on_another_port_when_another_process_listens_on_its_own(
    start_bouncer: Callable[..., pgbouncer.PgBouncer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process takes the free port before PgBouncer binds it: PgBouncer exits,
    # and a check that only connected would reach the other listener.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = pgbouncer._free_port
        monkeypatch.setattr(pgbouncer, "_free_port", lambda: next(ports, None) or real())
        running = start_bouncer("session")
        assert running.port != taken.getsockname()[1]
        with psycopg.connect(running.dsn()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
