"""Callers' own connections: every `*_on` function and act works on a sync psycopg
`Connection` (returning values) and on an `AsyncConnection` (returning awaitables),
with any row factory, in the caller's transaction."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.rows import dict_row, namedtuple_row

from axa_queue import (
    Act,
    ActKind,
    ActResult,
    Counts,
    JobInfo,
    JobState,
    NewJob,
    acts_on,
    cancel,
    counts_on,
    enqueue_all_on,
    enqueue_on,
    job_on,
    jobs_on,
    retry,
)
from conftest import eventually, running, set_up, status_of


@pytest.fixture
def tables(admin: psycopg.Connection[Any]) -> None:
    """The queue's tables in this test's schema, made without a Queue or an event loop."""
    set_up(admin)


@pytest.fixture(params=[None, dict_row, namedtuple_row], ids=["tuple", "dict", "namedtuple"])
def user_conn(request: pytest.FixtureRequest, dsn: str, tables: None) -> Iterator[Any]:
    """A caller's sync connection, not autocommit, with the row factory it chose."""
    kwargs = {} if request.param is None else {"row_factory": request.param}
    with psycopg.connect(dsn, **kwargs) as conn:
        yield conn


def not_awaitable(value: Any) -> Any:
    assert not inspect.isawaitable(value), f"a sync call returned {value!r}"
    return value


async def awaited(value: Any) -> Any:
    assert inspect.isawaitable(value), f"an async call returned {value!r}, not an awaitable"
    return await value


# --- sync ------------------------------------------------------------------------------


def test_every_call_on_a_sync_connection_returns_its_value(user_conn, admin) -> None:
    conn = user_conn
    factory = conn.row_factory
    job_id = not_awaitable(enqueue_on(conn, NewJob("Report", {"id": 1}, priority=3)))
    assert isinstance(job_id, UUID)
    ids = not_awaitable(enqueue_all_on(conn, [NewJob("Report", {"id": n}) for n in range(2, 5)]))
    assert len(ids) == 3 and all(isinstance(i, UUID) for i in ids)

    info = not_awaitable(job_on(conn, job_id))
    assert isinstance(info, JobInfo)
    assert (info.id, info.name, info.state, info.priority, info.attempt) == (
        job_id,
        "Report",
        JobState.QUEUED,
        3,
        0,
    )
    assert not_awaitable(job_on(conn, uuid4())) is None

    listed = not_awaitable(jobs_on(conn, JobState.QUEUED, "Report"))
    assert {j.id for j in listed} == {job_id, *ids}
    assert not_awaitable(jobs_on(conn, "completed")) == []

    counts = not_awaitable(counts_on(conn))
    assert isinstance(counts, Counts) and counts.ready == 4

    result = not_awaitable(cancel(conn, ids[0], "ops:alice", "customer_asked"))
    assert result == ActResult(applied=True, kind=ActKind.CANCELLED, found=JobState.QUEUED)
    refused = not_awaitable(cancel(conn, ids[0], "ops:alice", "again"))
    assert not refused and refused.found is JobState.CANCELLED

    conn.execute("UPDATE axa_queue SET status = 'failed', attempts = 1 WHERE id = %s", (ids[1],))
    retried = not_awaitable(retry(conn, ids[1], "ops:bob", "upstream_fixed"))
    assert retried == ActResult(applied=True, kind=ActKind.RETRIED, found=JobState.FAILED)

    [act] = not_awaitable(acts_on(conn, ids[0]))
    assert isinstance(act, Act)
    assert (act.kind, act.by, act.reason) == (ActKind.CANCELLED, "ops:alice", "customer_asked")
    conn.commit()

    assert status_of(admin, ids[0])[0] == "cancelled"
    assert admin.execute(
        "SELECT status, max_attempts FROM axa_queue WHERE id = %s", (ids[1],)
    ).fetchone() == ("queued", 2)
    # The caller's row factory is left as it was (a namedtuple equals the plain tuple).
    assert conn.row_factory is factory
    expected = {"one": 1} if factory is dict_row else (1,)
    assert conn.execute("SELECT 1 AS one").fetchone() == expected


def test_a_job_queued_in_a_sync_transaction_rolls_back_with_it(user_conn, admin) -> None:
    conn = user_conn
    with pytest.raises(RuntimeError, match="rolled back"), conn.transaction():
        job_id = enqueue_on(conn, NewJob("Report", {}))
        ids = enqueue_all_on(conn, [NewJob("Report", {}), NewJob("Report", {})])
        assert job_on(conn, job_id) is not None, "seen inside the transaction"
        raise RuntimeError("rolled back")
    conn.commit()
    for one in (job_id, *ids):
        assert admin.execute("SELECT 1 FROM axa_queue WHERE id = %s", (one,)).fetchone() is None
    assert admin.execute("SELECT count(*) FROM axa_queue").fetchone() == (0,)


def test_a_job_queued_in_a_sync_transaction_is_seen_only_once_it_commits(user_conn, admin) -> None:
    conn = user_conn
    job_id = enqueue_on(conn, NewJob("Report", {}))
    assert admin.execute("SELECT 1 FROM axa_queue WHERE id = %s", (job_id,)).fetchone() is None
    conn.commit()
    assert status_of(admin, job_id) == ("queued", None, 0)


def test_an_act_on_a_sync_connection_rolls_back_with_the_callers_transaction(
    user_conn, admin
) -> None:
    conn = user_conn
    job_id = enqueue_on(conn, NewJob("Report", {}))
    conn.commit()
    assert cancel(conn, job_id, "ops:alice", "customer_asked")
    conn.rollback()
    assert status_of(admin, job_id)[0] == "queued"
    assert admin.execute("SELECT count(*) FROM axa_job_acts").fetchone() == (0,)


def test_a_sync_autocommit_connection_queues_at_once(dsn, tables, admin) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = enqueue_on(conn, NewJob("Report", {}))
        assert status_of(admin, job_id)[0] == "queued"


def test_something_that_is_not_a_connection_is_refused_naming_what_is_accepted(tables) -> None:
    with pytest.raises(TypeError, match=r"expected a psycopg Connection or AsyncConnection; Dj"):
        enqueue_on(object(), NewJob("Report", {}))  # type: ignore[call-overload]


async def test_a_job_committed_on_a_sync_connection_runs(make_queue, user_conn, admin) -> None:
    queue = await make_queue()
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    async with running(queue):
        job_id = enqueue_on(user_conn, NewJob("Report", {"id": 5}))
        user_conn.commit()
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert ran == [{"id": 5}]


# --- async -----------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [None, dict_row], ids=["tuple", "dict"])
async def test_every_call_on_an_async_connection_returns_an_awaitable(
    make_queue, dsn, admin, factory: Any
) -> None:
    await make_queue()  # sets the tables up
    kwargs = {} if factory is None else {"row_factory": factory}
    async with await psycopg.AsyncConnection.connect(dsn, **kwargs) as conn:
        job_id = await awaited(enqueue_on(conn, NewJob("Report", {"id": 1})))
        ids = await awaited(enqueue_all_on(conn, [NewJob("Report", {}), NewJob("Other", {})]))
        info = await awaited(job_on(conn, job_id))
        assert isinstance(info, JobInfo) and info.state is JobState.QUEUED
        assert await awaited(job_on(conn, uuid4())) is None
        assert {j.id for j in await awaited(jobs_on(conn, name="Report"))} == {job_id, ids[0]}
        counts = await awaited(counts_on(conn))
        assert isinstance(counts, Counts) and counts.ready == 3
        assert await awaited(cancel(conn, ids[1], "ops:alice", "customer_asked"))
        await conn.execute(
            "UPDATE axa_queue SET status = 'needs_review', attempts = 1 WHERE id = %s",
            (ids[0],),
        )
        released = await awaited(retry(conn, ids[0], "ops:bob", "checked"))
        assert released.kind is ActKind.RELEASED
        [act] = await awaited(acts_on(conn, ids[1]))
        assert act.kind is ActKind.CANCELLED
        await conn.commit()
        cursor = await conn.execute("SELECT 1 AS one")
        assert await cursor.fetchone() == ({"one": 1} if factory is dict_row else (1,))
    assert status_of(admin, ids[1])[0] == "cancelled"
    assert status_of(admin, ids[0])[0] == "queued"


async def test_a_job_queued_in_an_async_transaction_rolls_back_with_it(
    make_queue, dsn, admin
) -> None:
    await make_queue()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(RuntimeError, match="rolled back"):
            async with conn.transaction():
                job_id = await enqueue_on(conn, NewJob("Report", {}))
                ids = await enqueue_all_on(conn, [NewJob("Report", {}), NewJob("Report", {})])
                assert await job_on(conn, job_id) is not None
                raise RuntimeError("rolled back")
    for one in (job_id, *ids):
        assert admin.execute("SELECT 1 FROM axa_queue WHERE id = %s", (one,)).fetchone() is None


async def test_a_job_queued_in_an_async_transaction_commits_with_it_and_runs(
    make_queue, dsn, admin
) -> None:
    queue = await make_queue()
    ran: list[Any] = []
    queue.handle("Report", ran.append)
    async with running(queue), await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            job_id = await enqueue_on(conn, NewJob("Report", {"id": 8}))
            await conn.execute("CREATE TABLE orders (id INTEGER)")
            assert (
                admin.execute("SELECT 1 FROM axa_queue WHERE id = %s", (job_id,)).fetchone() is None
            ), "not seen before the commit"
        await eventually(lambda: status_of(admin, job_id)[0] == "completed")
    assert ran == [{"id": 8}]


async def test_the_queues_own_connection_works_with_every_call(make_queue, admin) -> None:
    queue = await make_queue()
    async with queue.connection() as conn:
        job_id = await enqueue_on(conn, NewJob("Report", {}))
        assert (await job_on(conn, job_id)) is not None
        assert (await counts_on(conn)).ready == 1
    assert status_of(admin, job_id)[0] == "queued"
