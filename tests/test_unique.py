"""Unique jobs: at most one job with a key is queued, running or in review at a time, the
unique index decides under any concurrency, and a job whose key is taken writes nothing
and returns its holder's id as a `Duplicate`."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
import time
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

import axa_queue
from axa_queue import (
    Duplicate,
    JobState,
    NewJob,
    OptionsError,
    cancel,
    enqueue_all_on,
    enqueue_on,
    retry,
)
from axa_queue.db.calls import run_async, run_sync
from axa_queue.jobs.enqueue import enqueue_unique
from conftest import later, lock_waits, status_of
from test_compat import crate_enqueue


def rows_of(admin: psycopg.Connection[Any], key: str) -> list[tuple[UUID, str]]:
    return admin.execute(
        "SELECT id, status FROM axa_queue WHERE unique_key = %s ORDER BY created_at", (key,)
    ).fetchall()


async def test_a_job_whose_key_is_taken_writes_nothing_and_returns_the_holders_id(
    make_queue, admin
) -> None:
    queue = await make_queue()
    first = await queue.enqueue(NewJob("Invoice", {"id": 42}, unique_key="invoice:42"))
    second = await queue.enqueue("Invoice", {"id": 42}, unique_key="invoice:42")
    assert not isinstance(first, Duplicate)
    assert isinstance(second, Duplicate)
    assert second == first
    assert [r[0] for r in rows_of(admin, "invoice:42")] == [first]
    other = await queue.enqueue(NewJob("Invoice", {"id": 43}, unique_key="invoice:43"))
    assert not isinstance(other, Duplicate)
    plain = await queue.enqueue(NewJob("Invoice", {"id": 42}))
    assert plain != first, "a job without a key is never unique"


async def test_a_key_is_free_again_once_its_job_completed_or_was_cancelled(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.handle("Invoice", lambda args: None)
    first = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    await queue.drain()
    assert status_of(admin, first)[0] == "completed"
    second = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    assert not isinstance(second, Duplicate)
    async with queue.connection() as conn:
        await cancel(conn, second, by="ops:alice", reason="customer_asked")
    third = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    assert not isinstance(third, Duplicate)
    assert {r[0] for r in rows_of(admin, "k")} == {first, second, third}


async def test_a_running_job_and_one_in_review_hold_their_key(make_queue, admin) -> None:
    queue = await make_queue()
    held = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    admin.execute(
        "UPDATE axa_queue SET status = 'running', started_at = now(), attempts = 1 WHERE id = %s",
        (held,),
    )
    assert await queue.enqueue(NewJob("Invoice", unique_key="k")) == held
    admin.execute("UPDATE axa_queue SET status = 'needs_review' WHERE id = %s", (held,))
    again = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    assert isinstance(again, Duplicate) and again == held
    admin.execute("UPDATE axa_queue SET status = 'failed' WHERE id = %s", (held,))
    assert not isinstance(await queue.enqueue(NewJob("Invoice", unique_key="k")), Duplicate)


async def test_enqueue_all_answers_each_job_in_order_in_one_statement(make_queue, admin) -> None:
    queue = await make_queue()
    held = await queue.enqueue(NewJob("Invoice", unique_key="a"))
    ids = await queue.enqueue_all(
        [
            NewJob("Invoice", {"n": 1}, unique_key="a"),
            NewJob("Invoice", {"n": 2}, unique_key="b"),
            NewJob("Invoice", {"n": 3}),
            NewJob("Invoice", {"n": 4}, unique_key="b"),
            NewJob("Invoice", {"n": 5}, unique_key="a"),
        ]
    )
    assert [isinstance(i, Duplicate) for i in ids] == [True, False, False, True, True]
    assert ids[0] == held and ids[4] == held
    assert ids[3] == ids[1], "a key twice in one batch: the first job takes it"
    stored = admin.execute("SELECT args->>'n' FROM axa_queue ORDER BY args->>'n'").fetchall()
    assert [r[0] for r in stored] == ["2", "3", None]


async def test_a_key_taken_in_a_transaction_that_rolled_back_is_free(make_queue, admin) -> None:
    queue = await make_queue()
    connect = psycopg.AsyncConnection.connect
    async with await connect(queue.dsn) as conn, conn.transaction(force_rollback=True):
        inside = await enqueue_on(conn, NewJob("Invoice", unique_key="k"))
        assert not isinstance(inside, Duplicate)
        again = await enqueue_all_on(conn, [NewJob("Invoice", unique_key="k")])
        assert again == [inside] and isinstance(again[0], Duplicate)
    assert rows_of(admin, "k") == []
    after = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    assert not isinstance(after, Duplicate)


def test_a_holder_committed_after_the_statement_began_is_found_by_sending_it_again(
    dsn: str, admin
) -> None:
    """The statement waits for the transaction that took the key; once it commits, its
    job is not in the statement's snapshot: the job is sent again and finds it."""
    asyncio.run(_setup(dsn))
    holder_conn = psycopg.connect(dsn)
    holder = enqueue_on(holder_conn, NewJob("Invoice", unique_key="k"))  # not committed
    answer: list[UUID] = []

    def other() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            answer.append(enqueue_on(conn, NewJob("Invoice", unique_key="k")))

    thread = threading.Thread(target=other)
    thread.start()
    start = time.monotonic()
    while lock_waits(admin, "WITH inserted AS") == 0:
        assert time.monotonic() - start < 15, "the second enqueue never waited"
        time.sleep(0.01)
    holder_conn.commit()
    thread.join(15)
    holder_conn.close()
    assert answer == [holder] and isinstance(answer[0], Duplicate)
    assert [r[0] for r in rows_of(admin, "k")] == [holder]


async def _setup(dsn: str) -> None:
    async with axa_queue.Queue(dsn):
        pass


def _enqueue_many_times(dsn: str, start: Any, found: Any) -> None:
    start.wait()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(20):
            job_id = enqueue_on(conn, NewJob("Invoice", unique_key="k"))
            found.put((str(job_id), isinstance(job_id, Duplicate)))


def test_enqueues_of_one_key_from_several_processes_at_once_queue_exactly_one(
    dsn: str, admin
) -> None:
    asyncio.run(_setup(dsn))
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    found = context.Queue()
    workers = [
        context.Process(target=_enqueue_many_times, args=(dsn, start, found)) for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    start.set()
    answers = [found.get(timeout=60) for _ in range(80)]
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    rows = rows_of(admin, "k")
    assert len(rows) == 1
    queued = [a for a in answers if not a[1]]
    assert [a[0] for a in queued] == [str(rows[0][0])]
    assert {a[0] for a in answers} == {str(rows[0][0])}


async def test_unique_for_keeps_the_key_taken_that_long_after_the_job_finished(
    make_queue, admin
) -> None:
    queue = await make_queue()
    queue.handle("Hourly", lambda args: None)
    job = NewJob("Hourly", unique_key="hourly", unique_for=timedelta(hours=1))
    first = await queue.enqueue(job)
    await queue.drain()
    assert status_of(admin, first)[0] == "completed"
    assert await queue.enqueue(job) == first, "finished, but within its hour"
    info = await queue.job(first)
    assert info is not None
    assert (info.unique_key, info.unique_for) == ("hourly", timedelta(hours=1))
    async with queue.connection() as conn:
        assert await run_async(conn, enqueue_unique([job], now=later(admin, 3500))) == [first]
        (after,) = await run_async(conn, enqueue_unique([job], now=later(admin, 3601)))
    assert not isinstance(after, Duplicate)
    assert admin.execute("SELECT unique_key FROM axa_queue WHERE id = %s", (first,)).fetchone() == (
        None,
    ), "the finished holder gave its key up"


async def test_the_crates_enqueue_queues_without_a_key_beside_our_keyed_job(
    make_queue, admin
) -> None:
    queue = await make_queue()
    ours = await queue.enqueue(NewJob("Invoice", {"id": 1}, unique_key="invoice:1"))
    theirs = [crate_enqueue(admin, "Invoice", {"id": 1}) for _ in range(2)]
    found = admin.execute(
        "SELECT id, unique_key FROM axa_queue ORDER BY unique_key NULLS LAST, id"
    ).fetchall()
    assert found[0] == (ours, "invoice:1")
    assert sorted(r[0] for r in found[1:]) == sorted(theirs)
    assert all(r[1] is None for r in found[1:])


async def test_the_key_is_shown_by_job_info_and_kept_out_of_no_other_job(make_queue) -> None:
    queue = await make_queue()
    keyed = await queue.enqueue(NewJob("Invoice", unique_key="invoice:42"))
    plain = await queue.enqueue(NewJob("Invoice"))
    keyed_info, plain_info = await queue.job(keyed), await queue.job(plain)
    assert keyed_info is not None and plain_info is not None
    assert (keyed_info.unique_key, keyed_info.unique_for) == ("invoice:42", None)
    assert (plain_info.unique_key, plain_info.unique_for) == (None, None)
    listed = {i.id: i.unique_key for i in await queue.jobs()}
    assert listed == {keyed: "invoice:42", plain: None}


async def test_perform_later_and_the_sync_queue_honour_the_key(make_queue) -> None:
    queue = await make_queue()

    @queue.handler("Invoice")
    async def invoice(args: dict[str, int]) -> None:
        pass

    first = await invoice.perform_later({"id": 1}, unique_key="invoice:1")
    again = await invoice.perform_later({"id": 1}, unique_key="invoice:1")
    assert again == first and isinstance(again, Duplicate)
    with queue.sync() as jobs:
        assert jobs.enqueue("Invoice", {"id": 1}, unique_key="invoice:1") == first
        assert jobs.enqueue_all([NewJob("Invoice", unique_key="invoice:1")]) == [first]
        fresh = jobs.enqueue("Invoice", {"id": 2}, unique_key="invoice:2")
    assert not isinstance(fresh, Duplicate)
    info = await queue.job(fresh)
    assert info is not None and info.state is JobState.QUEUED


def test_a_unique_key_and_unique_for_are_checked_before_anything_is_sent() -> None:
    with pytest.raises(OptionsError, match="unique_for without a unique_key"):
        NewJob("Invoice", unique_for=timedelta(hours=1))
    with pytest.raises(
        OptionsError, match="unique_key of job 'Invoice' cannot be used: it is empty"
    ):
        NewJob("Invoice", unique_key=" ")
    with pytest.raises(OptionsError, match="201 characters long"):
        NewJob("Invoice", unique_key="k" * 201)
    with pytest.raises(OptionsError, match="NUL"):
        NewJob("Invoice", unique_key="secret\x00")
    with pytest.raises(OptionsError, match="unique_for of job 'Invoice' to be more than zero"):
        NewJob("Invoice", unique_key="k", unique_for=0)


def test_a_duplicate_is_the_holders_uuid() -> None:
    holder = UUID("0191f3c2-0000-7000-8000-000000000001")
    found = Duplicate(int=holder.int)
    assert found == holder and hash(found) == hash(holder) and str(found) == str(holder)
    assert isinstance(found, UUID)


def test_show_and_enqueue_on_the_command_line_tell_of_the_key(dsn: str) -> None:
    from test_cli import cli

    asyncio.run(_setup(dsn))
    made = cli("enqueue", "Hourly", "--unique-key", "hourly", "--unique-for", "3600", dsn=dsn)
    assert made.exit_code == 0 and made.stderr == ""
    job_id = made.stdout.strip()
    again = cli("enqueue", "Hourly", "--unique-key", "hourly", dsn=dsn)
    assert again.stdout.strip() == job_id and "key is taken by this job" in again.stderr
    shown = cli("show", job_id, dsn=dsn).stdout
    assert "unique key" in shown and "hourly" in shown and "60.0 min after it finished" in shown
    as_json = json.loads(cli("show", job_id, "--json", dsn=dsn).stdout)
    assert as_json["unique_key"] == "hourly" and as_json["unique_for"] == 3600
    refused = cli("enqueue", "Hourly", "--unique-for", "60", dsn=dsn)
    assert refused.exit_code != 0 and "unique_for without a unique_key" in refused.stderr


def test_the_dashboards_job_page_shows_the_key(dsn: str) -> None:
    from starlette.testclient import TestClient

    from axa_queue.web.app import create_app
    from test_web import ORIGIN, TOKEN

    asyncio.run(_setup(dsn))
    with axa_queue.SyncQueue(dsn) as jobs:
        keyed = jobs.enqueue("Invoice", unique_key="invoice:42", unique_for=timedelta(hours=2))
        plain = jobs.enqueue("Invoice")
    board = TestClient(create_app(dsn, token=TOKEN))
    board.post("/signin", data={"token": TOKEN, "name": "alice"}, headers=ORIGIN)
    page = board.get(f"/jobs/{keyed}").text
    assert (
        '<code id="job-unique-key">invoice:42</code>' in page and "2.0 h after it finished" in page
    )
    assert "job-unique-key" not in board.get(f"/jobs/{plain}").text


def test_under_repeatable_read_a_holder_the_snapshot_cannot_see_is_a_serialization_failure(
    dsn: str, admin
) -> None:
    asyncio.run(_setup(dsn))
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT 1")  # the transaction's snapshot is taken here
        holder = enqueue_on(admin, NewJob("Invoice", unique_key="k"))  # committed after it
        with pytest.raises(psycopg.errors.SerializationFailure):
            enqueue_on(conn, NewJob("Invoice", unique_key="k"))
    assert [r[0] for r in rows_of(admin, "k")] == [holder]


async def test_the_crates_retry_of_a_failed_job_whose_key_was_taken_fails_and_ours_does_not(
    make_queue, admin
) -> None:
    import seed_crate as crate

    queue = await make_queue()
    first = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    admin.execute("UPDATE axa_queue SET status = 'failed' WHERE id = %s", (first,))
    second = await queue.enqueue(NewJob("Invoice", unique_key="k"))
    with pytest.raises(psycopg.errors.UniqueViolation):
        admin.execute(crate.RETRY_FAILED, crate.params(first, "ops:alice", "fixed"))
    async with queue.connection() as conn:
        await retry(conn, first, by="ops:alice", reason="fixed")
    assert rows_of(admin, "k") == [(second, "queued")]
    assert status_of(admin, first)[0] == "queued"


async def test_a_key_is_honoured_on_an_asyncpg_connection(
    make_queue, database_url: str, schema: str
) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    await make_queue()
    conn = await asyncpg.connect(database_url, server_settings={"search_path": schema})
    try:
        first = await enqueue_on(conn, NewJob("Invoice", unique_key="k"))
        ids = await enqueue_all_on(
            conn, [NewJob("Invoice", unique_key="k"), NewJob("Invoice", unique_key="j")]
        )
    finally:
        await conn.close()
    assert ids[0] == first and isinstance(ids[0], Duplicate)
    assert not isinstance(first, Duplicate) and not isinstance(ids[1], Duplicate)


def test_a_single_keyed_job_is_one_statement_of_scalar_parameters() -> None:
    from axa_queue import sql
    from axa_queue.jobs.enqueue import enqueue_unique_one_call

    job = NewJob("Invoice", {"id": 1}, unique_key="invoice:1", unique_for=60)
    call, _ = enqueue_unique_one_call(job, UUID(int=1))
    assert call.query == sql.ENQUEUE_UNIQUE_ONE
    assert isinstance(call.params, dict)
    assert not any(isinstance(value, list) for value in call.params.values())
    assert (call.params["unique_key"], call.params["unique_for_ms"]) == ("invoice:1", 60_000)


def test_two_enqueues_of_a_key_whose_holder_expired_queue_one_and_tell_the_other_of_it(
    dsn: str, admin
) -> None:
    """Both find the finished holder past its `unique_for`; the first frees the key and
    queues; the second waits for it, and answers with its job, never the old holder."""
    asyncio.run(_setup(dsn))
    job = NewJob("Hourly", unique_key="hourly", unique_for=timedelta(hours=1))
    old = enqueue_on(admin, job)
    admin.execute("UPDATE axa_queue SET status = 'completed' WHERE id = %s", (old,))
    now = later(admin, 3601)
    first_conn = psycopg.connect(dsn)
    first = run_sync(first_conn, enqueue_unique([job], now=now))  # not committed
    assert isinstance(first, list) and not isinstance(first[0], Duplicate) and first[0] != old
    answer: list[UUID] = []

    def other() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = run_sync(conn, enqueue_unique([job], now=now))
            assert isinstance(found, list)
            answer.extend(found)

    thread = threading.Thread(target=other)
    thread.start()
    start = time.monotonic()
    while lock_waits(admin, "WITH inserted AS") == 0:
        assert time.monotonic() - start < 15, "the second enqueue never waited"
        time.sleep(0.01)
    first_conn.commit()
    thread.join(15)
    first_conn.close()
    assert answer == first and isinstance(answer[0], Duplicate)
    assert [r[0] for r in rows_of(admin, "hourly")] == [first[0]]


def _enqueue_at_the_barrier(dsn: str, barrier: threading.Barrier, found: list[UUID]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")  # connected and ready before the barrier
        barrier.wait(15)
        found.append(enqueue_on(conn, NewJob("Invoice", unique_key="k")))


def test_enqueues_of_one_key_from_several_threads_at_once_queue_exactly_one(
    dsn: str, admin
) -> None:
    asyncio.run(_setup(dsn))
    for _ in range(5):  # a few rounds: the key freed between them
        barrier = threading.Barrier(6)
        found: list[UUID] = []
        threads = [
            threading.Thread(target=_enqueue_at_the_barrier, args=(dsn, barrier, found))
            for _ in range(6)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        rows = [r for r in rows_of(admin, "k") if r[1] == "queued"]
        assert len(rows) == 1 and len(found) == 6
        assert {str(f) for f in found} == {str(rows[0][0])}
        assert sum(not isinstance(f, Duplicate) for f in found) == 1
        admin.execute("UPDATE axa_queue SET status = 'completed' WHERE id = %s", (rows[0][0],))
