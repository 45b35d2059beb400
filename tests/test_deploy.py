"""Deploys that never freeze the queue: setup takes no table lock when there is nothing
to change and a bounded one when there is; a worker started during an outage waits for
the database; the supervisor's restart delay comes back down once a process ran well."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from axa_queue import SETUP_STATEMENTS, NewJob, Queue, QueueOptions, SchemaError, enqueue_on
from conftest import eventually, status_of

WAITING_FOR_A_LOCK = """SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
    WHERE NOT l.granted AND a.application_name = %s"""


async def test_a_setup_with_nothing_to_change_takes_no_lock_behind_an_open_application_transaction(
    dsn: str, schema: str, make_queue, admin
) -> None:
    first = await make_queue()
    app = await psycopg.AsyncConnection.connect(dsn)  # a transaction, as an application's
    try:
        held = await enqueue_on(app, NewJob("Report", {"n": 1}))  # not committed yet
        second = Queue(dsn, QueueOptions(setup_lock_timeout=600))
        opening = asyncio.ensure_future(second.open(setup=True))
        try:
            deadline = time.monotonic() + 30
            while not opening.done():
                waiting = admin.execute(WAITING_FOR_A_LOCK, (schema,)).fetchone()
                assert waiting == (0,), "setup waits for a lock the application holds"
                assert time.monotonic() < deadline, "the open did not finish"
                await asyncio.sleep(0.02)
            await opening
            # The application's transaction is still open, and others go on working.
            assert app.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            other = await asyncio.wait_for(first.enqueue("Report", {"n": 2}), 30)
            assert status_of(admin, other)[0] == "queued"
        finally:
            opening.cancel()
            await second.close()
        await app.commit()
        assert status_of(admin, held)[0] == "queued"
    finally:
        await app.close()


@pytest.mark.alone  # a setup elsewhere holding the shared setup lock would time it out
async def test_a_setup_that_must_alter_a_table_gives_up_after_its_lock_timeout_with_a_clear_error(
    dsn: str, make_queue, admin
) -> None:
    await make_queue()
    admin.execute("ALTER TABLE axa_queue DROP COLUMN timeout_ms")
    app = await psycopg.AsyncConnection.connect(dsn)
    try:
        await app.execute("SELECT count(*) FROM axa_queue")  # holds ACCESS SHARE until it ends
        queue = Queue(dsn, QueueOptions(setup_lock_timeout=0.2))
        with pytest.raises(SchemaError) as raised:
            await asyncio.wait_for(queue.open(setup=True), 30)
        assert str(raised.value).startswith(
            "could not set up the tables within 0.2 s: another transaction holds a lock "
            "on axa_queue; retry, or run `axa-queue setup` when the database is quiet"
        )
        assert not queue.is_open
        await app.rollback()
        async with Queue(dsn, QueueOptions(setup_lock_timeout=0.2)) as later:
            assert later.is_open  # the database is quiet now: setup adds the column
        assert admin.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'axa_queue' "
            "AND column_name = 'timeout_ms'"
        ).fetchone() == (1,)
    finally:
        await app.close()


def test_every_setup_statement_says_what_it_makes_sure_of() -> None:
    from axa_queue.schema import MIGRATIONS

    # Every statement belongs to a migration, which declares what it makes (tests/
    # test_schema.py compares the declarations with the catalogs setup leaves).
    assert tuple(s for m in MIGRATIONS for s in m.all_statements()) == SETUP_STATEMENTS
    for migration in MIGRATIONS:
        assert migration.makes.lines(), migration.name


async def test_the_setup_check_names_what_is_missing_or_changed_and_nothing_once_set_up(
    dsn: str, make_queue, admin
) -> None:
    from axa_queue.schema import missing as setup_missing

    await make_queue()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await setup_missing(conn) == []
        admin.execute("DROP INDEX axa_queue_pick")
        admin.execute("ALTER TABLE axa_queue DROP COLUMN priority CASCADE")
        admin.execute("ALTER TABLE axa_job_acts ENABLE TRIGGER axa_job_acts_refuse")
        admin.execute("ALTER TABLE axa_queue RESET (fillfactor)")
        admin.execute(
            "CREATE OR REPLACE FUNCTION axa_queue_notify() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"
        )
        missing = await setup_missing(conn)
        for thing in (
            "index axa_queue_pick",
            "column axa_queue.priority",
            "trigger axa_job_acts_refuse",
            "storage settings of axa_queue",
            "function axa_queue_notify()",
        ):
            assert thing in missing
        await Queue(dsn).open()  # setup puts it all back
        assert await setup_missing(conn) == []


# --- a worker started during an outage ---------------------------------------------------

WORKER_MODULE = """
from axa_queue import Queue, QueueOptions

queue = Queue(options=QueueOptions(poll_interval=0.05, heartbeat_interval=0.2, stale_after=5))

@queue.handler("Quick")
async def quick(args):
    pass
"""


def test_a_worker_started_while_the_database_is_down_waits_for_it_and_runs_jobs(
    tmp_path: Path,
) -> None:
    embedded = pytest.importorskip("axa_queue.embedded")
    if not embedded.is_available():
        pytest.skip("the embedded server is not installed")
    module = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(WORKER_MODULE))
    with embedded.EmbeddedPostgres() as server:
        env = {
            **os.environ,
            "AXA_QUEUE_DSN": server.dsn,
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        }
        env.pop("DATABASE_URL", None)
        server.stop()
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "axa_queue.cli", "worker", f"{module}:queue"),
                *("--log-format", "json", "--wait-for-database", "120"),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stderr is not None
            line = process.stderr.readline()  # the first try failed, and it says so
            assert "cannot reach the database (OperationalError); trying again" in line, line
            assert process.poll() is None
            server.start()
            with psycopg.connect(server.dsn, autocommit=True) as admin:
                deadline = time.monotonic() + 60
                while not admin.execute("SELECT to_regclass('axa_queue') IS NOT NULL").fetchone()[
                    0
                ]:
                    assert process.poll() is None, "the worker gave up"
                    assert time.monotonic() < deadline, "the worker never set the tables up"
                    time.sleep(0.05)
                job_id = uuid.uuid4()
                admin.execute(
                    "INSERT INTO axa_queue (id, name, args) VALUES (%s, 'Quick', '{}')", (job_id,)
                )
                while status_of(admin, job_id)[0] != "completed":
                    assert time.monotonic() < deadline, "the job never ran"
                    time.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_worker_told_not_to_wait_for_the_database_fails_at_once(tmp_path: Path) -> None:
    module = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(WORKER_MODULE))
    env = {
        **os.environ,
        "AXA_QUEUE_DSN": "postgresql://nobody@127.0.0.1:9/nothing",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "axa_queue.cli",
            "worker",
            f"{module}:queue",
            "--wait-for-database=0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("Error: cannot reach the database at 127.0.0.1:9/nothing")
    assert "trying again" not in result.stderr


UNREACHABLE = "postgresql://ops:s3cret-never-shown@127.0.0.1:9/nothing"
"""A database no server answers for (port 9), with a password that must never show."""


def _as_at_a_terminal() -> None:
    """In the child before it runs: SIGINT as a shell at a terminal gives it (default,
    not blocked), whatever this test process has inherited or set (a process started
    with SIGINT ignored keeps it ignored, as Unix means)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _signals_of(pid: int) -> str:
    """The signal masks of process `pid` (`SigBlk`, `SigIgn`, `SigCgt`), for a failure's
    message."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return " ".join(
                line.strip() for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt"))
            )
    except OSError as error:
        return f"unreadable ({error})"


def _waiting_worker(tmp_path: Path, stderr: int, *args: str) -> subprocess.Popen[bytes]:
    """`axa-queue worker` on `UNREACHABLE`, waiting for it (the default 60 s)."""
    module = f"jobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(WORKER_MODULE))
    env = {
        **os.environ,
        "AXA_QUEUE_DSN": UNREACHABLE,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DATABASE_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "axa_queue.cli", "worker", f"{module}:queue", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        preexec_fn=_as_at_a_terminal,
    )


def _lines_until(read: int, wanted: int, deadline: float) -> list[str]:
    """The first `wanted` lines written to the file descriptor `read`."""
    seen = b""
    while seen.count(b"\n") < wanted:
        left = deadline - time.monotonic()
        assert left > 0, f"only these lines came: {seen!r}"
        ready, _, _ = select.select([read], [], [], left)
        if ready:
            try:
                chunk = os.read(read, 4096)
            except OSError:  # the terminal's other end is closed: the process is gone
                chunk = b""
            assert chunk, f"the worker ended first; it wrote: {seen!r}"
            seen += chunk
    return seen.decode().replace("\r\n", "\n").splitlines()


@pytest.mark.parametrize("processes", [(), ("--processes", "2")], ids=["one", "supervised"])
def test_a_worker_on_a_terminal_says_at_once_what_it_waits_for_and_how_to_stop_waiting(
    tmp_path: Path, processes: tuple[str, ...]
) -> None:
    terminal, its_end = pty.openpty()
    process = _waiting_worker(tmp_path, its_end, *processes)
    os.close(its_end)
    try:
        # The first try failed: the first line says so, in words, then the log's line.
        first, second = _lines_until(terminal, 2, time.monotonic() + 50)  # it waits 60 s
        assert first == (
            "waiting up to 60 s for the database at 127.0.0.1:9/nothing (connection refused); "
            "Ctrl-C to stop, --wait-for-database 0 to fail at once"
        )
        assert "cannot reach the database (OperationalError); trying again" in second
        assert "s3cret" not in first + second
        assert process.poll() is None
        before = _signals_of(process.pid)
        process.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            assert process.wait(30) != 0
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"no exit 30 s after SIGINT; the worker's signals before it: {before}; "
                f"now: {_signals_of(process.pid)}; this test's SIGINT handler: "
                f"{signal.getsignal(signal.SIGINT)!r}"
            )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(terminal)


def test_a_worker_not_on_a_terminal_logs_each_try_and_says_nothing_else(tmp_path: Path) -> None:
    from axa_queue.cli.run import waiting_notice

    process = _waiting_worker(tmp_path, subprocess.PIPE, "--log-format", "json")
    assert process.stderr is not None
    try:
        first, second = _lines_until(process.stderr.fileno(), 2, time.monotonic() + 50)
        for line in (first, second):
            assert "cannot reach the database (OperationalError); trying again" in line, line
            assert "Ctrl-C" not in line and "s3cret" not in line
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    assert waiting_notice(UNREACHABLE, 60, interactive=False) is None
    assert waiting_notice(UNREACHABLE, 0, interactive=True) is None  # it fails at once
    assert waiting_notice(UNREACHABLE, 60, interactive=True) is not None


async def test_open_waits_for_the_database_when_asked_and_says_so_each_try(caplog) -> None:
    queue = Queue("postgresql://nobody@127.0.0.1:9/nothing", QueueOptions(wait_for_database=0.6))
    with pytest.raises(psycopg.OperationalError):
        await asyncio.wait_for(queue.open(), 30)
    tries = [r for r in caplog.records if r.getMessage().startswith("cannot reach the database")]
    assert len(tries) >= 2, "it tried again, with backoff, until the time was up"
    assert not queue.is_open


async def test_open_does_not_wait_for_a_database_that_refuses_the_login(
    database_url: str, caplog
) -> None:
    wrong = make_conninfo(database_url, dbname=f"no_such_db_{uuid.uuid4().hex[:8]}")
    queue = Queue(wrong, QueueOptions(wait_for_database=120))
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        await asyncio.wait_for(queue.open(), 60)  # a liveness bound: it waits 120 s if wrong
    assert not [r for r in caplog.records if r.getMessage().startswith("cannot reach")]


# --- the supervisor's restart delay --------------------------------------------------------


def test_a_process_that_keeps_dying_at_start_waits_twice_as_long_each_time_up_to_the_cap() -> None:
    from axa_queue.cli.supervisor import RESTART_FIRST, RESTART_MAX, restart_delay

    delays: list[float] = []
    delay = None
    for _ in range(12):
        delay = restart_delay(delay, ran_for=0.3)
        delays.append(delay)
    assert delays[:4] == [RESTART_FIRST, RESTART_FIRST * 2, RESTART_FIRST * 4, RESTART_FIRST * 8]
    assert delays[-1] == RESTART_MAX and max(delays) == RESTART_MAX


def test_a_process_that_ran_healthily_for_a_while_is_restarted_after_the_first_delay() -> None:
    from axa_queue.cli.supervisor import RESTART_FIRST, RESTART_HEALTHY, RESTART_MAX, restart_delay

    assert restart_delay(RESTART_MAX, ran_for=RESTART_HEALTHY) == RESTART_FIRST
    assert restart_delay(RESTART_MAX, ran_for=RESTART_HEALTHY * 100) == RESTART_FIRST
    assert restart_delay(RESTART_MAX, ran_for=RESTART_HEALTHY - 0.1) == RESTART_MAX
    assert restart_delay(None, ran_for=0.0) == RESTART_FIRST


def test_a_worker_process_gets_the_settings_its_supervisor_resolved_on_its_command_line() -> None:
    import dataclasses

    from axa_queue.cli import main
    from axa_queue.cli.supervisor import Settings, child_command

    settings = Settings(
        target="myapp.jobs:queue",
        workers=3,
        wait_for_database=12.5,
        pooler="transaction",
        schema="jobs",
        log_format="json",
        log_level="warning",
        log_tracebacks=True,
    )
    command = child_command(settings)
    assert command[:4] == [sys.executable, "-m", "axa_queue.cli", "worker"]
    parsed = main.commands["worker"].make_context("worker", command[4:])
    given = {name: parsed.params[name] for name in ("target", "workers", "wait_for_database")}
    assert given == {"target": "myapp.jobs:queue", "workers": 3, "wait_for_database": 12.5}
    assert (parsed.params["log_format"], parsed.params["log_level"]) == ("json", "warning")
    assert parsed.params["log_tracebacks"] is True
    assert parsed.params["setup"] is False  # the supervisor has set up, once
    assert parsed.params["processes"] is None  # a child works in its own process
    assert (parsed.meta["axa_queue.pooler"], parsed.meta["axa_queue.schema"]) == (
        "transaction",
        "jobs",
    )
    assert "--schema" not in child_command(dataclasses.replace(settings, schema=None))
    assert "--log-tracebacks" not in child_command(
        dataclasses.replace(settings, log_tracebacks=False)
    )


def test_a_program_that_runs_the_commands_starts_the_worker_processes_itself() -> None:
    from axa_queue.cli.supervisor import Settings, child_command

    program = (sys.executable, "/srv/shop/manage.py", "axa_queue")
    command = child_command(
        Settings(target="shop.jobs:queue", workers=2, wait_for_database=0, program=program)
    )
    assert command[:5] == [*program, "worker", "shop.jobs:queue"]


async def test_the_supervisor_asks_the_policy_how_long_each_dead_process_ran(
    dsn: str, make_queue, monkeypatch
) -> None:
    from axa_queue.cli import supervisor

    await make_queue()  # the tables, for the supervisor's check
    asked: list[tuple[float | None, float]] = []

    def policy(previous: float | None, ran_for: float) -> float:
        asked.append((previous, ran_for))
        if len(asked) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's own graceful stop
        return 0.0 if previous is None else previous + 0.01

    monkeypatch.setattr(supervisor, "restart_delay", policy)
    monkeypatch.setattr(
        supervisor, "child_command", lambda _: [sys.executable, "-c", "raise SystemExit(3)"]
    )
    settings = supervisor.Settings(target="unused:queue", workers=1, wait_for_database=0.0)
    code = await asyncio.wait_for(
        supervisor.supervise(settings, 1, dsn, False, None, "127.0.0.1"),
        60,
    )
    assert code == 1  # the child's last exit was not 0
    assert [previous for previous, _ in asked[:3]] == [None, 0.0, 0.01]
    assert all(ran_for >= 0 for _, ran_for in asked)


async def test_a_supervisor_signalled_twice_aborts_kills_the_processes_still_running_and_exits_1(
    dsn: str, make_queue, monkeypatch, tmp_path: Path
) -> None:
    from axa_queue.cli import supervisor
    from axa_queue.cli.supervisor import SupervisorState

    await make_queue()  # the tables, for the supervisor's check
    ready = tmp_path / "ready"
    # A worker process that will not stop: it ignores SIGTERM, then says it is ready.
    child = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path(sys.argv[1]).write_text('ready'); time.sleep(600)"
    )
    monkeypatch.setattr(
        supervisor, "child_command", lambda _: [sys.executable, "-c", child, str(ready)]
    )
    monkeypatch.setattr(supervisor, "ABORT_KILL_AFTER", 0.0)
    settings = supervisor.Settings(target="unused:queue", workers=1, wait_for_database=0.0)
    boss = supervisor.Supervisor(settings, 1, dsn, False, None, "127.0.0.1")
    assert boss.state is SupervisorState.STARTING
    running = asyncio.ensure_future(boss.run())
    try:
        await eventually(ready.exists)
        assert boss.state is SupervisorState.RUNNING
        os.kill(os.getpid(), signal.SIGTERM)  # the first: a graceful stop, ignored
        await eventually(lambda: boss.state is SupervisorState.STOPPING)
        assert boss.children[0].returncode is None
        os.kill(os.getpid(), signal.SIGTERM)  # the second: abort, then SIGKILL
        assert await asyncio.wait_for(running, 60) == 1
    finally:
        running.cancel()
    assert boss.state is SupervisorState.STOPPED
    assert boss.children[0].returncode == -signal.SIGKILL


async def test_the_supervisor_sets_the_tables_up_with_the_queues_own_options(
    dsn: str, monkeypatch
) -> None:
    from axa_queue.cli import supervisor

    seen: list[QueueOptions] = []

    class Opened(Exception):
        pass

    class Spy(supervisor.Queue):
        async def open(self, *args: Any, **kwargs: Any) -> supervisor.Queue:
            seen.append(self.options)
            raise Opened

    monkeypatch.setattr(supervisor, "Queue", Spy)
    settings = supervisor.Settings(target="unused:queue", workers=1, wait_for_database=0.0)
    own = QueueOptions(setup_lock_timeout=17, prepare=False, stale_after=120)
    with pytest.raises(Opened):
        await supervisor.supervise(settings, 1, dsn, True, None, "127.0.0.1", options=own)
    assert seen[0].setup_lock_timeout == own.setup_lock_timeout
    assert seen[0].prepare is False and seen[0].stale_after == own.stale_after
    assert seen[0].pool_size == 2
