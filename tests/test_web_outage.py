"""The dashboard and its database: `axa-queue web` refuses to start, with one line
saying why, on a database it cannot reach or whose tables are missing or out of date;
once running, an outage (a TCP proxy in front of the test server, cut and restored:
`tcp_cut`) gets a 503 status page on every page, and the pages come back by themselves
when the database does. tests/test_browser.py watches the same in a real browser."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from axa_queue import Queue
from axa_queue.cli import main
from axa_queue.schema import VERSION
from axa_queue.web import board, create_app
from axa_queue.web.outage import unavailable
from tcp_cut import CutProxy, cut_proxy

TOKEN = "t0ken-for-the-outage-tests"
ORIGIN = {"origin": "http://testserver"}
PASSWORD = "hunter2-never-shown"


@pytest.fixture
def tables(dsn: str) -> str:
    async def setup() -> None:
        queue = Queue(dsn)
        await queue.open()
        await queue.close()

    asyncio.run(setup())
    return dsn


@pytest.fixture
def proxy(tables: str) -> Iterator[CutProxy]:
    with cut_proxy(tables) as one:
        yield one


def through(proxy: CutProxy, dsn: str) -> str:
    """`dsn` through the proxy, with a password (the test server trusts and ignores it)."""
    return make_conninfo(proxy.dsn(dsn), password=PASSWORD)


def signed_in(app: Any) -> TestClient:
    web = TestClient(app)
    answer = web.post(
        "/signin", data={"token": TOKEN, "name": "alice"}, headers=ORIGIN, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    return web


def assert_outage_page(answer: Any, *, live: bool = False) -> None:
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "5"
    assert "default-src 'none'" in answer.headers["content-security-policy"]
    assert answer.headers["x-frame-options"] == "DENY"
    assert "The database cannot be reached" in answer.text
    assert "tries again by itself" in answer.text
    assert "Traceback" not in answer.text and PASSWORD not in answer.text
    assert ('http-equiv="refresh"' in answer.text) is not live


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "axa_queue.web"]


@contextlib.contextmanager
def shorter_waits(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The dashboard's waits for a pooled connection shortened (`board.WAIT`, then
    `board.WAIT_DOWN`: 5 s and 1 s as shipped), which each request of an outage waits
    out in full on the wall clock. Put back on exit, before the database is: the pages
    then come back within the waits users get."""
    with monkeypatch.context() as shorter:
        shorter.setattr(board, "WAIT", 0.3)
        shorter.setattr(board, "WAIT_DOWN", 0.1)
        yield


def test_an_outage_gets_a_503_status_page_and_the_pages_come_back_when_the_database_does(
    proxy: CutProxy, tables: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="axa_queue")
    with signed_in(create_app(through(proxy, tables), token=TOKEN)) as web:
        assert web.get("/").status_code == 200
        with shorter_waits(monkeypatch):
            proxy.cut()
            for _ in range(3):  # as many requests as you like: one log line
                assert_outage_page(web.get("/"))
            assert_outage_page(web.get("/jobs?state=failed"))
            assert_outage_page(web.get("/workers"))
            live = web.get("/live", headers={"hx-request": "true"})
            assert_outage_page(live, live=True)
            assert 'id="outage"' in live.text and 'id="live"' in live.text
        proxy.restore()
        assert web.get("/").status_code == 200  # the connection the cut broke is not reused
        assert web.get("/live", headers={"hx-request": "true"}).status_code == 200
    lines = outage_lines(caplog)
    assert len(lines) == 2, lines
    assert "cannot reach the database" in lines[0]
    assert re.search(r"\((PoolTimeout|OperationalError|ConnectionTimeout)\)", lines[0])
    assert "again" in lines[1]
    assert all(PASSWORD not in r.getMessage() + str(r.__dict__) for r in caplog.records)


def test_the_first_page_after_an_outage_nobody_saw_answers_on_a_connection_that_works(
    proxy: CutProxy, tables: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = Queue(through(proxy, tables))
    with signed_in(create_app(queue, token=TOKEN)) as web:
        assert web.get("/").status_code == 200

        async def grow() -> None:  # several connections in the pool, idle
            async def hold() -> None:
                async with queue.pool.connection() as conn:
                    await conn.execute("SELECT pg_sleep(0.05)")

            await asyncio.gather(*(hold() for _ in range(3)))

        web.portal.call(grow)
        assert queue.pool.get_stats()["pool_available"] >= 3
        with shorter_waits(monkeypatch):
            proxy.cut()  # every idle connection broken, and no page asked for meanwhile
            proxy.restore()
        for path in ("/workers", "/jobs?state=failed", "/"):
            assert web.get(path).status_code == 200, path


def test_a_dashboard_that_starts_during_an_outage_answers_503_until_the_database_is_back(
    proxy: CutProxy, tables: str
) -> None:
    proxy.cut()
    with signed_in(create_app(through(proxy, tables), token=TOKEN)) as web:
        assert_outage_page(web.get("/"))
        proxy.restore()
        assert web.get("/").status_code == 200


def test_a_dashboard_on_a_database_without_the_tables_says_to_run_setup(dsn: str) -> None:
    with signed_in(create_app(dsn, token=TOKEN)) as web:
        answer = web.get("/")
        assert answer.status_code == 503
        assert "tables are missing or out of date" in answer.text
        assert "axa-queue setup" in answer.text and "Traceback" not in answer.text


def test_tables_dropped_under_a_running_dashboard_get_the_status_page(tables: str, admin) -> None:
    with signed_in(create_app(tables, token=TOKEN)) as web:
        assert web.get("/jobs").status_code == 200
        admin.execute("DROP TABLE axa_queue CASCADE")
        answer = web.get("/jobs")
        assert answer.status_code == 503 and "axa-queue setup" in answer.text


def test_a_statement_cancelled_by_its_timeout_is_no_outage(tables: str, admin) -> None:
    with pytest.raises(psycopg.errors.QueryCanceled) as cancelled:
        admin.execute("SET statement_timeout = '1ms'; SELECT pg_sleep(1)")
    assert unavailable(cancelled.value) is None
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(make_conninfo(tables, port="1"), connect_timeout=2)
    assert unavailable(refused.value) == "unreachable"


# --- axa-queue web refuses to start ------------------------------------------------------


def refused(dsn: str) -> list[str]:
    """What `axa-queue web` printed on stderr, asserting it refused to start."""
    runner = CliRunner(env={"AXA_QUEUE_WEB_TOKEN": TOKEN, "AXA_QUEUE_DSN": None})
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    result = runner.invoke(main, ["web", "--dsn", dsn, "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert "the dashboard is at" not in result.stdout
    return result.stderr.strip().splitlines()


def test_axa_queue_web_refuses_to_start_on_a_database_it_cannot_reach(database_url: str) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    dsn = f"postgresql://root:{PASSWORD}@127.0.0.1:{port}/test"
    [line] = refused(dsn)
    assert f"cannot reach the database at 127.0.0.1:{port}/test" in line
    assert PASSWORD not in line and "root" not in line


def test_axa_queue_web_refuses_to_start_without_the_tables(dsn: str) -> None:
    [line] = refused(dsn)
    assert "axa_queue is missing" in line and "axa-queue setup" in line


def test_axa_queue_web_refuses_to_start_on_tables_out_of_date(tables: str, admin) -> None:
    admin.execute("DELETE FROM axa_schema_version WHERE version = %s", (VERSION,))
    [line] = refused(tables)
    assert f"schema version {VERSION - 1}, this code needs {VERSION}" in line
    assert "axa-queue setup" in line
