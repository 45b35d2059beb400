"""axa_queue.testing: the stored jobs with their arguments, assertions that say what
was queued instead, a database to test on, and the pytest plugin, used as a user
would (a project's tests run by pytest, the plugin found through its entry point)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import userproject
from axa_queue import JobState, NewJob, OptionsError, SyncQueue, enqueue_on
from axa_queue.testing import (
    EnqueuedJob,
    NoDatabaseError,
    assert_enqueued,
    database_server,
    enqueued,
    fresh_schema,
    refute_enqueued,
)
from conftest import set_up


@dataclass
class Receipt:
    order: int
    email: str


async def test_enqueued_returns_the_stored_jobs_with_their_arguments_from_every_kind_of_source(
    make_queue, dsn, admin
) -> None:
    queue = await make_queue()
    first = await queue.enqueue("Receipt", Receipt(7, "ann@example.com"), priority=3)
    await queue.enqueue("Report", {"id": 1}, run_in=3600, max_attempts=2, timeout=1.5)
    jobs = await enqueued(queue)
    assert [(j.name, j.args) for j in jobs] == [
        ("Receipt", {"order": 7, "email": "ann@example.com"}),
        ("Report", {"id": 1}),
    ]
    receipt, report = jobs
    assert receipt.id == first and receipt.state is JobState.QUEUED and receipt.priority == 3
    assert report.max_attempts == 2 and report.timeout is not None
    assert report.timeout.total_seconds() == 1.5 and report.run_at > receipt.run_at
    assert "ann@example.com" not in repr(receipt), "the arguments stay out of its repr"
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        assert await enqueued(conn, "Report") == [report]
    assert enqueued(admin) == jobs
    with queue.sync() as sync:
        assert enqueued(sync, "Receipt") == [receipt]


async def test_assert_enqueued_finds_a_job_by_its_arguments_and_fields_and_returns_it(
    make_queue,
) -> None:
    queue = await make_queue()
    job_id = await queue.enqueue("Receipt", Receipt(7, "ann@example.com"), priority=3)
    found = await assert_enqueued(queue, "Receipt", args=Receipt(7, "ann@example.com"))
    assert isinstance(found, EnqueuedJob) and found.id == job_id
    await assert_enqueued(queue, "Receipt", priority=3, state="queued", id=str(job_id))
    await assert_enqueued(queue, "Receipt", args={"order": 7, "email": "ann@example.com"})


async def test_a_failed_assert_enqueued_shows_what_was_queued_instead(make_queue) -> None:
    queue = await make_queue()
    await queue.enqueue("Receipt", Receipt(8, "bob@example.com"))
    await queue.enqueue("Report", {"id": 1}, priority=5)
    with pytest.raises(AssertionError) as failure:
        await assert_enqueued(queue, "Receipt", args=Receipt(7, "ann@example.com"))
    message = str(failure.value)
    assert message.startswith(
        'no stored job matches Receipt args={"email": "ann@example.com", "order": 7}; '
        "stored instead:\n"
    ), message
    assert '  Receipt args={"email": "bob@example.com", "order": 8} state=queued priority=0' in (
        message
    )
    assert '  Report args={"id": 1} state=queued priority=5' in message
    with pytest.raises(AssertionError, match=r"matches Report priority=1; stored instead"):
        await assert_enqueued(queue, "Report", priority=1)


def test_an_assertion_on_an_empty_queue_says_nothing_is_stored(admin, dsn) -> None:
    set_up(admin)
    with pytest.raises(AssertionError, match=r"stored instead:\n  \(no job is stored\)"):
        assert_enqueued(admin, "Receipt")
    refute_enqueued(admin, "Receipt")
    refute_enqueued(admin)


def test_refute_enqueued_passes_when_nothing_matches_and_lists_what_does(admin) -> None:
    set_up(admin)
    enqueue_on(admin, NewJob("Receipt", Receipt(7, "ann@example.com")))
    refute_enqueued(admin, "Report")
    refute_enqueued(admin, "Receipt", args=Receipt(8, "ann@example.com"))
    refute_enqueued(admin, "Receipt", state="completed")
    with pytest.raises(AssertionError) as failure:
        refute_enqueued(admin, "Receipt", args=Receipt(7, "ann@example.com"))
    assert str(failure.value).startswith(
        'expected no stored job to match Receipt args={"email": "ann@example.com", '
        '"order": 7}, found 1:\n  Receipt args='
    )
    with pytest.raises(AssertionError, match="expected no stored job to match any job"):
        refute_enqueued(admin)


def test_a_field_stored_jobs_do_not_have_is_refused_by_name(admin) -> None:
    with pytest.raises(OptionsError, match=r"no field 'colour'.*match on attempts"):
        assert_enqueued(admin, "Receipt", colour="red")


def test_a_long_listing_is_cut_short_with_a_count_of_the_rest(admin) -> None:
    set_up(admin)
    with SyncQueue(admin.info.dsn) as sync:
        sync.enqueue_all([NewJob("Report", {"id": n, "pad": "x" * 300}) for n in range(25)])
        with pytest.raises(AssertionError) as failure:
            assert_enqueued(sync, "Report", args={"id": 99})
    lines = str(failure.value).splitlines()
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "  ... and 5 more"
    assert '..." state=' not in lines[1] and '"pad": "xxx' in lines[1] and "..." in lines[1]


# --- a database to test on -------------------------------------------------------------------


def test_the_server_is_the_one_given_else_a_local_one_that_answers(
    monkeypatch, database_url
) -> None:
    monkeypatch.setenv("AXA_TEST_DATABASE_URL", "postgresql://given.invalid/db")
    with database_server() as dsn:
        assert dsn == "postgresql://given.invalid/db"
    monkeypatch.delenv("AXA_TEST_DATABASE_URL")
    nowhere = "postgresql://nobody@127.0.0.1:1/none"
    monkeypatch.setattr("axa_queue.testing.LOCAL_SERVERS", (nowhere, database_url))
    with database_server() as dsn:  # spelled out: host, port, database and user
        wanted = conninfo_to_dict(database_url)
        assert {k: v for k, v in conninfo_to_dict(dsn).items() if k in wanted} == wanted


def test_with_no_server_and_no_embedded_one_it_says_what_to_do(monkeypatch) -> None:
    monkeypatch.delenv("AXA_TEST_DATABASE_URL", raising=False)
    monkeypatch.setattr("axa_queue.testing.LOCAL_SERVERS", ("postgresql://x@127.0.0.1:1/none",))
    monkeypatch.setattr("axa_queue.embedded.is_available", lambda: False)
    expected = r"set AXA_TEST_DATABASE_URL.*axa-queue\[embedded\]"
    with pytest.raises(NoDatabaseError, match=expected), database_server():
        pass


def test_with_no_server_answering_an_embedded_one_is_started_and_stopped(monkeypatch) -> None:
    from axa_queue.embedded import is_available

    if not is_available():
        pytest.skip("the [embedded] extra is not installed")
    monkeypatch.delenv("AXA_TEST_DATABASE_URL", raising=False)
    monkeypatch.setattr("axa_queue.testing.LOCAL_SERVERS", ("postgresql://x@127.0.0.1:1/none",))
    with (
        database_server() as dsn,
        fresh_schema(dsn) as schema_dsn,
        psycopg.connect(schema_dsn) as conn,
    ):
        assert conn.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=3)


def test_a_fresh_schema_has_the_tables_and_is_dropped_with_sessions_left_on_it(
    database_url,
) -> None:
    with fresh_schema(database_url) as dsn:
        left_open = psycopg.connect(dsn)
        schema = left_open.execute("SELECT current_schema()").fetchone()
        assert schema is not None and schema[0].startswith("axa_test_")
        assert left_open.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT to_regnamespace(%s) IS NULL", (schema[0],)).fetchone()
        assert row == (True,)
    assert left_open.closed or left_open.broken or _ended(left_open)


def _ended(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False


# --- the plugin, as a user runs it -------------------------------------------------------------

USER_TESTS = """
from dataclasses import dataclass

import psycopg
import pytest

from axa_queue import NewJob, Queue, enqueue_on
from axa_queue.testing import assert_enqueued, refute_enqueued


@dataclass
class Receipt:
    order: int


def test_the_plugin_came_through_its_entry_point(request):
    assert request.config.pluginmanager.get_plugin("axa_queue") is not None


async def test_an_async_test_drains_what_it_queued(axa_queue_dsn):
    queue = Queue(axa_queue_dsn)
    sent = []

    @queue.handler("SendReceipt")
    async def send(args: Receipt) -> None:
        sent.append(args.order)

    async with queue:
        await send.perform_later(Receipt(7))
        await assert_enqueued(queue, "SendReceipt", args=Receipt(7))
        result = await queue.drain()
    assert result.completed == 1 and sent == [7]


def test_a_sync_test_sees_a_job_queued_in_its_transaction(axa_queue_dsn):
    with psycopg.connect(axa_queue_dsn) as conn:
        with conn.transaction():
            enqueue_on(conn, NewJob("SendReceipt", {"order": 8}))
        assert_enqueued(conn, "SendReceipt", args={"order": 8})
        refute_enqueued(conn, "SendReceipt", args={"order": 9})


def test_each_test_has_a_schema_of_its_own(axa_queue_dsn):
    with psycopg.connect(axa_queue_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)
        (schema,) = conn.execute("SELECT current_schema()").fetchone()
    with open("schemas.txt", "a") as seen:
        print(schema, file=seen)


def test_the_url_fixture_is_a_url_to_the_same_schema(axa_queue_dsn, axa_queue_url):
    assert axa_queue_url.startswith("postgresql://") and "options=" in axa_queue_url
    with psycopg.connect(axa_queue_dsn) as by_dsn, psycopg.connect(axa_queue_url) as by_url:
        enqueue_on(by_dsn, NewJob("SendReceipt", {"order": 9}))
        by_dsn.commit()
        assert_enqueued(by_url, "SendReceipt", args={"order": 9})
        same = "SELECT current_schema(), current_setting('application_name')"
        assert by_dsn.execute(same).fetchone() == by_url.execute(same).fetchone()
"""


def test_a_users_project_gets_the_fixtures_from_the_installed_package(
    tmp_path: Path, database_url: str
) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS, encoding="utf-8")
    outcome = userproject.run_pytest(tmp_path, database_url)
    assert outcome.status == 0, outcome.output
    assert "5 passed" in outcome.output, outcome.output
    (schema,) = (tmp_path / "schemas.txt").read_text().split()
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)


def test_a_failing_user_assertion_shows_what_was_queued_in_pytests_report(
    tmp_path: Path, database_url: str
) -> None:
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            from axa_queue import Queue
            from axa_queue.testing import assert_enqueued

            async def test_wrong_order(axa_queue_dsn):
                async with Queue(axa_queue_dsn) as queue:
                    await queue.enqueue("SendReceipt", {"order": 8})
                    await assert_enqueued(queue, "SendReceipt", args={"order": 7})
            """
        ),
        encoding="utf-8",
    )
    outcome = userproject.run_pytest(tmp_path, database_url)
    assert outcome.status == 1, outcome.output
    assert 'no stored job matches SendReceipt args={"order": 7}' in outcome.output
    assert 'SendReceipt args={"order": 8} state=queued' in outcome.output


def test_the_entry_point_pyproject_declares_is_the_plugin_module() -> None:
    text = userproject.entry_points_text()
    assert "[pytest11]\naxa_queue = axa_queue.testing.plugin\n" in text
    import axa_queue.testing.plugin as plugin

    assert {"axa_queue_dsn", "axa_queue_server", "axa_queue_url"} <= set(vars(plugin))
