"""The dashboard's job lists by name, state and time (`since`, `until`), paged by the
same keyset cursor as any list; and what a time that is not one gets. tests/test_browser.py
fills the same form in a real browser."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from axa_queue import Queue
from axa_queue.web import create_app

TOKEN = "t0ken-for-the-filter-tests"
ORIGIN = {"origin": "http://testserver"}
NOON = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def board(dsn: str) -> Iterator[TestClient]:
    async def setup() -> None:
        queue = Queue(dsn)
        await queue.open()
        await queue.close()

    asyncio.run(setup())
    with TestClient(create_app(dsn, token=TOKEN)) as web:
        answer = web.post("/signin", data={"token": TOKEN, "name": "alice"}, headers=ORIGIN)
        assert answer.status_code == 200
        yield web


def finished(
    admin: psycopg.Connection[Any], name: str, status: str, at: datetime, n: int
) -> list[str]:
    """`n` jobs of `name` in `status`, finished a second apart from `at` on, oldest first."""
    ids = [str(uuid.uuid4()) for _ in range(n)]
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, attempts, updated_at, run_at) "
        "SELECT i, %s, '{}', %s, 1, %s + (n - 1) * interval '1 second', %s "
        "FROM unnest(%s::uuid[]) WITH ORDINALITY AS u(i, n)",
        (name, status, at, at, ids),
    )
    return ids


def walk(board: TestClient, path: str) -> list[str]:
    """The ids of every page of the list at `path`, following its Next page links."""
    seen: list[str] = []
    while True:
        answer = board.get(path)
        assert answer.status_code == 200, answer.text
        seen += re.findall(r'<tr data-id="([0-9a-f-]+)"', answer.text)
        found = re.search(r'id="next" href="\?([^"]+)"', answer.text)
        if found is None:
            return seen
        path = "/jobs?" + found[1].replace("&amp;", "&")


def test_a_list_from_one_time_until_another_pages_through_the_window_only(
    board: TestClient, admin
) -> None:
    before = finished(admin, "Mail", "completed", NOON - timedelta(hours=1), 30)
    inside = finished(admin, "Mail", "completed", NOON, 120)  # 12:00:00 to 12:01:59
    after = finished(admin, "Mail", "completed", NOON + timedelta(hours=1), 30)
    finished(admin, "Other", "completed", NOON, 10)
    finished(admin, "Mail", "failed", NOON, 10)
    window = "state=completed&name=Mail&since=2026-12-06T12:00&until=2026-12-06T12:02"
    assert walk(board, f"/jobs?{window}") == inside[::-1]  # three pages, newest first
    assert walk(board, f"/jobs?{window}&order=oldest") == inside
    # one bound alone; an offset is honoured; a date alone is its midnight UTC
    assert walk(board, "/jobs?state=completed&name=Mail&since=2026-12-06T13:00:00Z") == after[::-1]
    until = "until=2026-12-06T12:00:00%2B01:00"  # 11:00 UTC
    assert walk(board, f"/jobs?state=completed&name=Mail&order=oldest&{until}") == []
    assert len(walk(board, "/jobs?state=completed&name=Mail&until=2026-12-06T12:00")) == 30
    assert set(walk(board, "/jobs?state=completed&name=Mail&since=2026-12-06")) == set(
        before + inside + after
    )
    empty = board.get("/jobs?state=completed&name=Mail&since=2026-12-07T00:00")
    assert "No completed jobs named Mail from 2026-12-07 00:00." in empty.text


def test_a_queued_list_is_bounded_by_when_its_jobs_are_due(board: TestClient, admin) -> None:
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, run_at) SELECT gen_random_uuid(), 'Mail', '{}', "
        "%s + n * interval '1 hour' FROM generate_series(0, 9) AS n",
        (NOON,),
    )
    found = walk(board, "/jobs?state=queued&since=2026-12-06T14:00&until=2026-12-06T17:00")
    assert len(found) == 3


@pytest.mark.parametrize(
    "value", ["yesterday", "2026-13-01T00:00", "2026-12-06T04:15<script>", "1e9", "2026-12-06 x"]
)
def test_a_time_that_is_not_one_gets_a_400_that_does_not_echo_it(
    board: TestClient, value: str
) -> None:
    answer = board.get("/jobs", params={"state": "completed", "since": value})
    assert answer.status_code == 400
    assert "since" in answer.text and "should be a date and time" in answer.text
    # The page's CSRF token is random hex, which holds "1e9" now and then: left out.
    shown = re.sub(r'name="csrf" value="[0-9a-f]*"', 'name="csrf"', answer.text)
    assert value not in shown and "<script>" not in shown
