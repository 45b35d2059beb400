"""SyncQueue: synchronous code queues and inspects jobs through the same statements."""

from __future__ import annotations

import pytest

from axa_queue import JobState, NewJob, OptionsError, Queue, QueueOptions, SyncQueue, cancel


def test_sync_code_queues_inspects_and_acts_on_jobs_without_an_event_loop(dsn, admin) -> None:
    Queue(dsn).sync()  # a queue defined for workers hands out a sync twin of itself
    with SyncQueue(dsn) as jobs:
        admin.execute("SELECT 1")
        from axa_queue.schema import SETUP_STATEMENTS

        for statement in SETUP_STATEMENTS:
            admin.execute(statement)
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
