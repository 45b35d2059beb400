"""Reads survive rows written by others: the Rust crate or hand-written SQL may store a
time PostgreSQL holds but Python's `datetime` cannot (past year 9999, before year 1,
`infinity`); one such row never breaks reading it, or a listing of the others.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from axa_queue import JobState, SyncQueue, cancel, job_on, jobs_on
from axa_queue.cli import main
from conftest import set_up

LATEST = datetime.max.replace(tzinfo=timezone.utc)
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)

ODD_TIMES = {
    "year 9999 with a negative offset": ("9999-12-31 23:00:00-05", LATEST),
    "year 20000": ("20000-01-01 00:00:00+00", LATEST),
    "infinity": ("infinity", LATEST),
    "minus infinity": ("-infinity", EARLIEST),
    "before year 1": ("0044-03-15 12:00:00+00 BC", EARLIEST),
}


def insert(admin: psycopg.Connection[Any], name: str, at: str, status: str = "queued") -> uuid.UUID:
    """A job row written by hand, every time column at `at`."""
    job_id = uuid.uuid4()
    admin.execute(
        "INSERT INTO axa_queue (id, name, args, status, run_at, started_at, created_at, "
        "updated_at) VALUES (%s, %s, '{}', %s, %s, %s, %s, %s)",
        (job_id, name, status, at, at, at, at),
    )
    return job_id


def cli(*args: str, dsn: str) -> Any:
    runner = CliRunner(env={"AXA_QUEUE_DSN": dsn, "DATABASE_URL": None})
    return runner.invoke(main, list(args), prog_name="axa-queue", catch_exceptions=False)


def in_tokyo(dsn: str) -> str:
    options = conninfo_to_dict(dsn).get("options", "")
    return make_conninfo(dsn, options=f"{options} -c TimeZone=Asia/Tokyo")


@pytest.mark.parametrize("at, expected", list(ODD_TIMES.values()), ids=list(ODD_TIMES))
async def test_a_job_with_a_time_python_cannot_hold_is_read_with_the_time_clamped(
    make_queue, admin, dsn: str, at: str, expected: datetime
) -> None:
    set_up(admin)
    queue = await make_queue()
    normal = await queue.enqueue("Normal", {})
    odd = insert(admin, "Odd", at)

    info = await queue.job(odd)
    assert info is not None and info.name == "Odd" and info.state is JobState.QUEUED
    assert (info.run_at, info.started_at, info.created_at, info.updated_at) == (expected,) * 4
    listed = {j.id: j for j in await queue.jobs(limit=10)}
    assert set(listed) == {normal, odd}
    assert listed[odd].run_at == expected
    assert abs(listed[normal].created_at - datetime.now(timezone.utc)) < timedelta(hours=1)
    counts = await queue.counts()
    assert counts.ready + counts.waiting == 2
    assert set(await queue.counts_by_name()) == {"Normal", "Odd"}

    with psycopg.connect(dsn) as conn:  # the caller's own connection, sync
        assert {j.id for j in jobs_on(conn, limit=10)} == {normal, odd}
        assert job_on(conn, odd).run_at == expected  # type: ignore[union-attr]
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:  # and async
        assert {j.id for j in await jobs_on(aconn, limit=10)} == {normal, odd}
        assert (await job_on(aconn, odd)).run_at == expected  # type: ignore[union-attr]
    with SyncQueue(dsn) as jobs:
        assert jobs.job(odd).run_at == expected  # type: ignore[union-attr]
        assert {j.id for j in jobs.jobs(limit=10)} == {normal, odd}


def test_year_9999_in_utc_is_read_in_a_tokyo_session(admin, dsn: str) -> None:
    set_up(admin)
    odd = insert(admin, "Odd", "9999-12-31 20:00:00+00")
    with psycopg.connect(in_tokyo(dsn)) as conn:
        assert conn.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
        (info,) = jobs_on(conn)
    assert info.id == odd
    assert info.run_at == datetime(9999, 12, 31, 20, tzinfo=timezone.utc)


def test_times_in_range_are_read_to_the_microsecond(admin, dsn: str) -> None:
    set_up(admin)
    at = "2026-05-01 09:00:00.123457+02"
    job_id = insert(admin, "Exact", at)
    with psycopg.connect(in_tokyo(dsn)) as conn:
        info = job_on(conn, job_id)
    assert info is not None
    assert info.run_at == datetime(2026, 5, 1, 7, 0, 0, 123457, tzinfo=timezone.utc)
    assert info.run_at.utcoffset() == timedelta(0)


async def test_a_cancelled_job_with_an_odd_time_breaks_no_listing(make_queue, admin) -> None:
    set_up(admin)
    queue = await make_queue()
    odd = insert(admin, "Odd", "9999-12-31 23:00:00-05")
    async with queue.connection() as conn:
        assert await cancel(conn, odd, "ops:alice", "INC-1")
    (info,) = await queue.jobs(state="cancelled")
    assert info.id == odd and info.run_at == LATEST


def test_the_cli_lists_shows_and_acts_on_jobs_with_odd_times(admin, dsn: str) -> None:
    set_up(admin)
    tokyo = in_tokyo(dsn)
    normal = cli("enqueue", "Normal", dsn=tokyo).stdout.strip()
    odd = insert(admin, "Odd", "9999-12-31 23:00:00-05")
    infinite = insert(admin, "Forever", "infinity")
    admin.execute(
        "INSERT INTO axa_job_acts (job_id, job_name, act, attempts, by, reason, at) "
        "VALUES (%s, 'Odd', 'cancelled', 0, 'ops:alice', 'INC-1', 'infinity')",
        (odd,),
    )
    admin.execute(
        "INSERT INTO axa_schedule (name, due_at, seen_at, created_at, archived_at) "
        "VALUES ('odd', 'infinity', '-infinity', '9999-12-31 23:00:00-05', 'infinity')"
    )

    listed = cli("jobs", dsn=tokyo)
    assert listed.exit_code == 0, listed.output
    assert all(str(j) in listed.stdout for j in (normal, odd, infinite))
    assert ">9999-12-31" in listed.stdout
    as_json = cli("jobs", "--json", dsn=tokyo)
    assert as_json.exit_code == 0, as_json.output
    rows = {row["id"]: row for row in json.loads(as_json.stdout)}
    assert rows[str(odd)]["run_at"] == LATEST.isoformat()
    for job_id in (odd, infinite):
        shown = cli("show", str(job_id), dsn=tokyo)
        assert shown.exit_code == 0, shown.output
        assert "Odd" in shown.stdout or "Forever" in shown.stdout
        assert cli("show", str(job_id), "--json", dsn=tokyo).exit_code == 0
    acts = cli("acts", str(odd), dsn=tokyo)
    assert acts.exit_code == 0 and "ops:alice" in acts.stdout, acts.output
    assert json.loads(cli("acts", str(odd), "--json", dsn=tokyo).stdout)[0]["at"] == (
        LATEST.isoformat()
    )
    schedules = cli("schedules", dsn=tokyo)
    assert schedules.exit_code == 0 and "odd" in schedules.stdout, schedules.output
    assert json.loads(cli("schedules", "--json", dsn=tokyo).stdout)[0]["seen_at"] == (
        EARLIEST.isoformat()
    )
    assert cli("counts", dsn=tokyo).exit_code == 0
    assert cli("counts", "--by-name", dsn=tokyo).exit_code == 0


async def test_schedules_with_odd_times_are_listed(make_queue, admin) -> None:
    set_up(admin)
    queue = await make_queue()
    admin.execute(
        "INSERT INTO axa_schedule (name, due_at, seen_at) VALUES "
        "('odd', '20000-01-01 00:00+00', '-infinity'), ('even', now(), now())"
    )
    found = {s.name: s for s in await queue.schedules()}
    assert found["odd"].due_at == LATEST and found["odd"].seen_at == EARLIEST
    assert found["even"].due_at < LATEST
