"""SyncQueue: synchronous code queues and inspects jobs through the same statements."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from axa_queue import (
    JobState,
    NewJob,
    NoResultError,
    OptionsError,
    Queue,
    QueueOptions,
    SyncQueue,
    WaitTimeoutError,
    cancel,
)
from conftest import running, set_up


def test_sync_code_queues_inspects_and_acts_on_jobs_without_an_event_loop(dsn, admin) -> None:
    Queue(dsn).sync()  # a queue defined for workers hands out a sync twin of itself
    with SyncQueue(dsn) as jobs:
        admin.execute("SELECT 1")
        set_up(admin)
        job_id = jobs.enqueue("Report", {"id": 7}, priority=3)
        ids = jobs.enqueue_all([NewJob("Report", {"id": n}) for n in range(3)])
        assert len(ids) == 3
        info = jobs.job(job_id)
        assert info is not None and info.state is JobState.QUEUED and info.priority == 3
        assert jobs.counts().ready == 4
        assert [j.id for j in jobs.jobs(state="queued", limit=10)][-1] in {job_id, *ids}
        with jobs.connection() as conn:
            assert cancel(conn, job_id, "ops:alice", "customer_asked")
        assert jobs.job(job_id).state is JobState.CANCELLED  # type: ignore[union-attr]
        assert [a.by for a in jobs.acts(job_id)] == ["ops:alice"]
        assert [a.by for a in jobs.acts(str(job_id))] == ["ops:alice"]
        assert jobs.job(str(job_id)) == jobs.job(job_id)
        assert jobs.counts_by_name()["Report"].ready == 3
        jobs.ping()


def test_a_sync_queue_with_no_database_says_how_to_give_one(monkeypatch) -> None:
    monkeypatch.delenv("AXA_QUEUE_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(OptionsError, match="AXA_QUEUE_DSN"):
        SyncQueue(options=QueueOptions()).counts()


async def test_the_sync_pool_and_the_async_pool_have_the_same_session_settings(dsn) -> None:
    queue = Queue(dsn)  # not opened: only its connector's pool is used
    settings = "SELECT current_setting('jit'), current_setting('plan_cache_mode')"
    async_pool = queue.connector.pool()
    await async_pool.open(wait=True)
    try:
        async with async_pool.connection() as conn:
            seen = await (await conn.execute(settings)).fetchone()
    finally:
        await async_pool.close()
    with SyncQueue(dsn) as jobs, jobs.pool.connection() as sync_conn:
        assert sync_conn.execute(settings).fetchone() == seen == ("off", "force_generic_plan")
    behind = QueueOptions(pooler="transaction")
    with SyncQueue(dsn, behind) as jobs, jobs.pool.connection() as sync_conn:
        assert sync_conn.execute(settings).fetchone() != ("off", "force_generic_plan")


# What only the async `Queue` offers: defining and running workers (handlers, limits,
# schedules, observers, middleware, run), setting up and checking the tables, housekeeping, and the
# schedules' table. A sync web request queues and inspects jobs; it runs none of these.
# `drain_sync` is the Queue's way to do what a SyncQueue's `drain` does.
ONLY_ASYNC = {
    "archive_schedules",
    "check",
    "drain_sync",
    "fair_by_key",
    "handle",
    "handler",
    "handlers",
    "health",
    "is_open",
    "lifespan",
    "limit",
    "limit_per_key",
    "limits",
    "middleware",
    "move_history",
    "observe",
    "observers",
    "open",
    "purge",
    "rate_limit",
    "rebuild_indexes",
    "recover_stale",
    "run",
    "running",
    "schedule",
    "schedule_list",
    "schedules",
    "setup",
    "start_background",
    "sync",
    "tick_each",
    "tick_schedules",
}


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_sync_queue_offers_what_the_queue_offers_with_the_same_parameters() -> None:
    assert public(Queue) - public(SyncQueue) == ONLY_ASYNC
    assert public(SyncQueue) - public(Queue) == set()
    for name in sorted(public(Queue) & public(SyncQueue)):
        mine, twin = getattr(Queue, name), getattr(SyncQueue, name)
        assert callable(mine) == callable(twin), name
        if callable(mine):
            # Parameters, names, kinds, defaults and annotations alike; only the
            # return differs (an awaitable of it).
            assert list(inspect.signature(twin).parameters.values()) == list(
                inspect.signature(mine).parameters.values()
            ), name


async def test_sync_wait_and_result_answer_as_the_async_ones_do(make_queue) -> None:
    queue = await make_queue()
    queue.handle("Sum", lambda args: {"sum": sum(args["n"])})
    done = await queue.enqueue("Sum", {"n": [1, 2, 3]})
    later = await queue.enqueue("Sum", {"n": [4]}, run_in=3600)
    with SyncQueue(queue.dsn, queue.options) as jobs:
        waiting = asyncio.create_task(asyncio.to_thread(jobs.wait, done, 30))
        async with running(queue):
            synced = await waiting
        assert synced == await queue.wait(done, timeout=0)
        assert jobs.result(done) == await queue.result(done) == {"sum": 6}
        with pytest.raises(NoResultError, match="it is queued"):
            jobs.result(later)
        with pytest.raises(NoResultError, match="it is queued"):
            await queue.result(later)
        with pytest.raises(WaitTimeoutError, match="it is still queued"):
            await asyncio.to_thread(jobs.wait, later, 0.1)
        with pytest.raises(WaitTimeoutError, match="it is still queued"):
            await queue.wait(later, 0.1)
