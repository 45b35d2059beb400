"""Bulk enqueue: `enqueue_all` and `enqueue_all_on` send a batch by binary COPY on a
psycopg connection (`sql.ENQUEUE_COPY`), and by one INSERT of arrays otherwise; both
store the same rows, return the ids in order, and notify once per batch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from uuid import RFC_4122, UUID

import psycopg
import pytest

from axa_queue import NewJob, Queue, QueueOptions, enqueue_all_on, sql
from axa_queue.jobs import enqueue as enqueue_module
from axa_queue.jobs.enqueue import COPY_FROM, copies, enqueue_many_call, new_ids

STORED = (
    "SELECT id, name, args, status, max_attempts, priority, timeout_ms, trace_context,"
    " attempts, run_at = created_at AS due_at_creation FROM axa_queue WHERE id = ANY(%s)"
)


def batch(count: int) -> list[NewJob]:
    """Jobs unlike one another in every column COPY sends."""
    return [
        NewJob(
            f"Bulk{n % 3}",
            {"n": n, "text": "é\u2028\\\"'", "list": [n, None, 1.5]},
            priority=n % 7 - 3,
            max_attempts=None if n % 2 else n + 1,
            timeout=None if n % 3 else n + 1,
        )
        for n in range(count)
    ]


def stored(admin: psycopg.Connection[Any], ids: list[UUID]) -> list[tuple[Any, ...]]:
    """The rows of `ids`, in the order of `ids`."""
    rows = admin.execute(STORED, (ids,)).fetchall()
    by_id = {row[0]: row[1:] for row in rows}
    return [by_id[job_id] for job_id in ids]


def test_a_batch_goes_by_copy_only_when_big_enough_and_due_now() -> None:
    now = [NewJob("Now") for _ in range(COPY_FROM)]
    assert copies(now)
    assert not copies(now[1:])
    assert not copies([*now, NewJob("Later", run_in=5)])
    assert not copies([*now, NewJob("At", run_at=datetime.now(timezone.utc))])
    assert not copies(now, datetime.now(timezone.utc))
    assert not copies([*now, NewJob("Keyed", unique_key="k")])  # ENQUEUE_UNIQUE decides
    assert enqueue_many_call(now, copy=True).query == sql.ENQUEUE_COPY
    assert enqueue_many_call(now).query == sql.ENQUEUE_MANY


def test_the_ids_of_a_batch_are_random_uuids_as_uuid4_makes_them() -> None:
    ids = new_ids(1000)
    assert len(set(ids)) == 1000 and new_ids(0) == []
    assert all(job_id.version == 4 and job_id.variant == RFC_4122 for job_id in ids)
    assert all(type(job_id) is UUID for job_id in ids)
    call = enqueue_many_call(batch(COPY_FROM), copy=True)
    assert call.instead is not None  # the INSERT is made only where COPY cannot go
    assert call.read([], 0) == call.instead().read([], 0)


async def test_a_batch_queued_by_copy_is_stored_as_the_insert_stores_it_ids_in_order(
    make_queue: Callable[..., Awaitable[Queue]],
    admin: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = await make_queue()
    jobs = batch(50)
    copied = await queue.enqueue_all(jobs)
    monkeypatch.setattr(enqueue_module, "COPY_FROM", 10**9)
    inserted = await queue.enqueue_all(jobs)
    assert len(set(copied)) == len(copied) == 50
    assert stored(admin, copied) == stored(admin, inserted)
    first = stored(admin, copied)[0]
    assert first[:3] == (
        "Bulk0",
        {"n": 0, "text": "é\u2028\\\"'", "list": [0, None, 1.5]},
        "queued",
    )
    assert all(row[-1] for row in stored(admin, copied))  # run_at: now()


async def test_a_batch_queued_by_copy_sends_one_notification(
    make_queue: Callable[..., Awaitable[Queue]], dsn: str, schema: str
) -> None:
    queue = await make_queue()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(
            psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(sql.CHANNEL))
        )
        await queue.enqueue_all(batch(200))
        await queue.enqueue("Marker", run_in=3600)  # sent after the batch's, if any
        payloads: list[str] = []
        async for notify in listener.notifies(timeout=15):
            if notify.payload.split()[0] == schema:  # other tests share the channel
                payloads.append(notify.payload.split()[1])
                if float(payloads[-1]) > 60:
                    break
    assert len(payloads) == 2 and float(payloads[0]) <= 0


async def test_a_batch_by_copy_on_the_callers_connection_rolls_back_with_it(
    make_queue: Callable[..., Awaitable[Queue]], dsn: str, admin: psycopg.Connection[Any]
) -> None:
    await make_queue()
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            kept = enqueue_all_on(conn, batch(20))
        with pytest.raises(ZeroDivisionError), conn.transaction():
            enqueue_all_on(conn, batch(20))
            raise ZeroDivisionError
    async with await psycopg.AsyncConnection.connect(dsn) as aconn, aconn.transaction():
        kept += await enqueue_all_on(aconn, batch(20))
    [(count,)] = admin.execute("SELECT count(*) FROM axa_queue").fetchall()
    assert count == 40 and len(stored(admin, kept)) == 40


async def test_a_batch_in_a_pipeline_goes_by_insert(
    make_queue: Callable[..., Awaitable[Queue]], dsn: str, admin: psycopg.Connection[Any]
) -> None:
    await make_queue()
    with psycopg.connect(dsn, autocommit=True) as conn, conn.pipeline():
        ids = enqueue_all_on(conn, batch(20))
    assert len(stored(admin, ids)) == 20


async def test_a_batch_with_delays_or_times_keeps_them(
    make_queue: Callable[..., Awaitable[Queue]], admin: psycopg.Connection[Any]
) -> None:
    queue = await make_queue()
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    ids = await queue.enqueue_all(
        [*batch(10), NewJob("Later", run_in=3600), NewJob("At", run_at=at)]
    )
    later, fixed = (
        admin.execute(
            "SELECT run_at - created_at AS delay, run_at FROM axa_queue WHERE id = %s",
            (job_id,),
        ).fetchone()
        for job_id in ids[-2:]
    )
    assert later is not None and later[0] == timedelta(hours=1)
    assert fixed is not None and fixed[1] == at


async def test_a_queue_given_a_schema_copies_into_that_schema(
    database_url: str, schema: str, admin: psycopg.Connection[Any]
) -> None:
    async with Queue(database_url, QueueOptions(schema=schema)) as queue:
        ids = await queue.enqueue_all(batch(10))
        sync = queue.sync()
        try:
            ids += await asyncio.to_thread(sync.enqueue_all, batch(10))
        finally:
            await asyncio.to_thread(sync.close)
    assert len(stored(admin, ids)) == 20


async def test_a_big_batch_with_unique_keys_keeps_them_and_one_without_priorities_stores_zero(
    make_queue: Callable[..., Awaitable[Queue]],
    admin: psycopg.Connection[Any],
) -> None:
    queue = await make_queue()
    keyed = [NewJob("Keyed", {"n": n}, unique_key=f"k{n % 2}") for n in range(COPY_FROM * 2)]
    ids = await queue.enqueue_all(keyed)
    assert len(set(ids)) == 2  # two keys: two jobs, the others got their holder's id
    plain = await queue.enqueue_all([NewJob("Plain", {"n": n}) for n in range(COPY_FROM)])
    rows = admin.execute("SELECT priority FROM axa_queue WHERE id = ANY(%s)", (plain,)).fetchall()
    assert [row[0] for row in rows] == [0] * COPY_FROM
